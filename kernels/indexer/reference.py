"""Plain-torch reference of the M3 lightning indexer (block-max scores, causal top-k blocks).

Math (vLLM ``vllm/models/minimax_m3/common/indexer.py``): for index head h, query token t at position p_t and key token j,
s_h(t, j) = IQ_h(t) · IK(j) if j <= p_t else -inf (fp32, no scale, no softmax). The block score
is the max over the keys of a block; blocks after the query's own block are invalid; the last
``local_blocks`` blocks up to the query's own block and the first ``init_blocks`` blocks are
forced (scores 1e29 / 1e30 as in the vLLM Triton kernel); the top-k blocks are kept and unused
slots are -1.
"""
import torch

LOCAL_SCORE = 1e29  # forced score of the local blocks (vLLM index_topk kernel)
INIT_SCORE = 1e30  # forced score of the init blocks (vLLM index_topk kernel)


def index_scores(iq: torch.Tensor, ik: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """Token-level scores: iq [T, Hi, D], ik [S, D] (key j at position j), q_pos [T] -> [Hi, T, S] fp32."""
    s = torch.einsum("thd,sd->hts", iq.float(), ik.float())
    key_pos = torch.arange(ik.shape[0], device=ik.device)
    causal = key_pos[None, :] <= q_pos[:, None]  # [T, S]
    return s.masked_fill(~causal[None], float("-inf"))


def block_max(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """Max over each block of keys: scores [Hi, T, S] -> [Hi, T, ceil(S / block_size)] (-inf pads)."""
    hi, t, s = scores.shape
    nb = -(-s // block_size)
    pad = nb * block_size - s
    if pad:
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    return scores.view(hi, t, nb, block_size).amax(dim=-1)


def force_blocks(block_scores: torch.Tensor, q_pos: torch.Tensor, block_size: int,
                 local_blocks: int = 1, init_blocks: int = 0) -> torch.Tensor:
    """Give the local blocks (ending at the query's own block) and the init blocks top scores.

    block_scores [Hi, T, NB] -> [Hi, T, NB]; only valid (causal) blocks are forced.
    """
    nb = block_scores.shape[-1]
    b = torch.arange(nb, device=block_scores.device)[None, :]  # [1, NB]
    own = torch.div(q_pos, block_size, rounding_mode="floor")[:, None]  # [T, 1]
    valid = b <= own
    local = valid & (b > own - local_blocks)
    init = valid & (b < init_blocks)
    out = block_scores.masked_fill(local[None], LOCAL_SCORE)
    return out.masked_fill(init[None], INIT_SCORE)


def select_topk_blocks(block_scores: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-k blocks per (head, token): [Hi, T, NB] -> int32 [Hi, T, topk], -1 where fewer are valid."""
    hi, t, nb = block_scores.shape
    k = min(topk, nb)
    vals, idx = torch.topk(block_scores, k, dim=-1)
    idx = idx.masked_fill(vals == float("-inf"), -1).to(torch.int32)
    if k < topk:
        idx = torch.nn.functional.pad(idx, (0, topk - k), value=-1)
    return idx


def indexer_topk_ref(iq: torch.Tensor, ik: torch.Tensor, q_pos: torch.Tensor, *, block_size: int,
                     topk: int, local_blocks: int = 1, init_blocks: int = 0) -> torch.Tensor:
    """Selected blocks: iq [T, Hi, D], ik [S, D], q_pos [T] -> int32 [Hi, T, topk] (-1 = unused)."""
    scores = block_max(index_scores(iq, ik, q_pos), block_size)
    scores = force_blocks(scores, q_pos, block_size, local_blocks, init_blocks)
    return select_topk_blocks(scores, topk)
