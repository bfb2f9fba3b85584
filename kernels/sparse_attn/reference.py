"""Plain-torch reference of M3 attention: block-sparse GQA over selected blocks, and dense causal GQA.

Keys are read from a blocked view ``k_blocks [NB, block, Hkv, D]`` (a paged cache's K plane, or a
contiguous sequence reshaped into blocks) through ``block_table [n_logical]`` (logical -> physical
block). Query head i uses KV head i // (Hq / Hkv). Softmax in fp32; output in q's dtype.
"""
import torch


def _gather_keys(k_blocks, v_blocks, block_table, blocks):
    """Keys/values of the selected logical blocks: blocks [Hkv, T, K] -> k, v [Hkv, T, K, block, D]."""
    hkv = blocks.shape[0]
    phys = block_table.long()[blocks.clamp(min=0).long()]  # [Hkv, T, K]
    heads = torch.arange(hkv, device=blocks.device)[:, None, None]
    k = k_blocks[phys, :, heads]  # [Hkv, T, K, block, D]
    v = v_blocks[phys, :, heads]
    return k, v


def sparse_attention_ref(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor,
                         block_table: torch.Tensor, blocks: torch.Tensor, q_pos: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """Attention over selected blocks.

    q [T, Hq, D]; k_blocks, v_blocks [NB, block, Hkv, D]; block_table [n_logical] int;
    blocks [Hkv, T, K] int (logical block ids, -1 unused); q_pos [T] -> o [T, Hq, D].
    A key at position j is attended iff its block is selected and j <= q_pos.
    """
    t, hq, d = q.shape
    bs, hkv = k_blocks.shape[1], k_blocks.shape[2]
    k, v = _gather_keys(k_blocks, v_blocks, block_table, blocks)
    key_pos = blocks.long()[..., None] * bs + torch.arange(bs, device=q.device)  # [Hkv, T, K, bs]
    ok = (blocks[..., None] >= 0) & (key_pos <= q_pos[None, :, None, None])
    qg = q.view(t, hkv, hq // hkv, d).float()  # [T, Hkv, G, D]
    s = torch.einsum("thgd,htkbd->htgkb", qg, k.float()) * scale  # [Hkv, T, G, K, bs]
    s = s.masked_fill(~ok[:, :, None], float("-inf"))
    p = torch.softmax(s.flatten(-2), dim=-1).view_as(s)
    o = torch.einsum("htgkb,htkbd->thgd", p, v.float())
    return o.reshape(t, hq, d).to(q.dtype)


def dense_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Full causal GQA: q [T, Hq, D], k, v [S, Hkv, D] (key j at position j), q_pos [T] -> [T, Hq, D]."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    qg = q.view(t, hkv, hq // hkv, d).float()
    s = torch.einsum("thgd,shd->hgts", qg, k.float()) * scale  # [Hkv, G, T, S]
    causal = torch.arange(k.shape[0], device=q.device)[None, :] <= q_pos[:, None]
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    o = torch.einsum("hgts,shd->thgd", p, v.float())
    return o.reshape(t, hq, d).to(q.dtype)
