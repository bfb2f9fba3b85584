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


# --- the real KV layouts and the sparse page adapter (plain torch) ---------------------------------------
PAGE = 16  # token page of AITER's paged attention (vLLM ``ASM_PAGE_SIZE``)


def triton_kv_cache(k_blocks: torch.Tensor, v_blocks: torch.Tensor) -> torch.Tensor:
    """vLLM's Triton layout from K/V planes: k_blocks, v_blocks [NB, block, Hkv, D] -> [NB, Hkv, block, 2 D]
    (K in the first D channels of the last axis, V in the second; ``common/ops/sparse_attn.py:10-12``)."""
    return torch.cat([k_blocks, v_blocks], dim=-1).permute(0, 2, 1, 3).contiguous()


def triton_planes(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V plane views [NB, block, Hkv, D] of a Triton-layout cache [NB, Hkv, block, 2 D] (no copy)."""
    d = kv_cache.shape[-1] // 2
    return kv_cache[..., :d].permute(0, 2, 1, 3), kv_cache[..., d:].permute(0, 2, 1, 3)


def page16_x(dtype: torch.dtype) -> int:
    """AITER's inner vector width: 16 bytes of the cache dtype (8 for bf16/fp16, 16 for fp8, 4 for fp32)."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def aiter_page16_cache(k_blocks: torch.Tensor, v_blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """AITER's page-16 views of a cache whose K and V pages share a block (vLLM ``amd/model.py:857-909``).

    k_blocks, v_blocks [NB, block, Hkv, D] -> (k_view [P, Hkv, D/x, 16, x], v_view [P - ppb, Hkv, 16/x, D, x],
    block_page_stride). Block b holds pages 2 ppb b .. 2 ppb b + ppb - 1 (K, 16 tokens each) then ppb V pages
    (ppb = block / 16). V is viewed from page ppb on, so page id 2 ppb·table[b] + j reaches K page j of block b
    in k_view and V page j of the same block in v_view: block_page_stride = 2 ppb (= vLLM's table scaled ×2
    with stride ppb).
    """
    nb, bs, h, d = k_blocks.shape
    ppb, x = bs // PAGE, page16_x(k_blocks.dtype)
    k = k_blocks.reshape(nb, ppb, PAGE, h, d // x, x).permute(0, 1, 3, 4, 2, 5)      # [nb, ppb, h, d/x, 16, x]
    v = v_blocks.reshape(nb, ppb, PAGE // x, x, h, d).permute(0, 1, 4, 2, 5, 3)      # [nb, ppb, h, 16/x, d, x]
    raw = torch.stack([k.reshape(nb, ppb, h, PAGE * d), v.reshape(nb, ppb, h, PAGE * d)], dim=1)
    raw = raw.reshape(nb * 2 * ppb, h, PAGE * d).contiguous()
    k_view = raw.view(nb * 2 * ppb, h, d // x, PAGE, x)
    v_view = raw.view(nb * 2 * ppb, h, PAGE // x, d, x)[ppb:]
    return k_view, v_view, 2 * ppb


def sparse_page_table_ref(blocks: torch.Tensor, block_tables: torch.Tensor, row_req: torch.Tensor,
                          q_pos: torch.Tensor, *, block_size: int, block_page_stride: int,
                          page: int = PAGE) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse page adapter: selected 128-token blocks -> one compact page-16 table row per query token.

    blocks [T, K] logical block ids (-1 unused, in selection order); block_tables [R, W]; row_req [T] (request
    of each row); q_pos [T] (absolute position) -> (table int32 [T, K·ppb], ctx int32 [T]). The valid full
    blocks (selected, before the query's own block) are packed first in selection order, the own (tail) block
    last; block b gives pages block_tables[r, b]·block_page_stride + j, j < ppb = block_size / page; unused
    entries are 0. ctx = n_full·block_size + (pos + 1 − own·block_size) when the own block is selected, else
    min(n_valid·block_size, pos + 1). Same rule as vLLM ``amd/ops/sparse_pa.py:34-87``.
    """
    t, k = blocks.shape
    ppb = block_size // page
    table = torch.zeros(t, k * ppb, dtype=torch.int32)
    ctx = torch.zeros(t, dtype=torch.int32)
    for i in range(t):
        pos, r = int(q_pos[i]), int(row_req[i])
        own, causal = pos // block_size, max(pos + 1, 0)
        sel = [int(b) for b in blocks[i] if causal > 0 and 0 <= int(b) <= own]
        full = [b for b in sel if b < own]
        order = full + [b for b in sel if b == own]
        for slot, b in enumerate(order):
            base = int(block_tables[r, b]) * block_page_stride
            table[i, slot * ppb:(slot + 1) * ppb] = torch.arange(base, base + ppb, dtype=torch.int32)
        has_tail = len(order) > len(full)
        ctx[i] = len(full) * block_size + (causal - own * block_size) if has_tail \
            else min(len(sel) * block_size, causal)
    return table, ctx


def page16_attention_ref(q: torch.Tensor, k_view: torch.Tensor, v_view: torch.Tensor, table: torch.Tensor,
                         ctx: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention over a compact page-16 context (what AITER's paged decode computes for each row).

    q [T, Hq, D]; k_view [P, Hkv, D/x, 16, x]; v_view [P', Hkv, 16/x, D, x]; table [T, W] page ids; ctx [T]
    tokens (row t attends compact tokens 0 .. ctx[t]-1, token n in page table[t, n // 16] at n % 16)
    -> o [T, Hq, D] in q's dtype (fp32 softmax).
    """
    t, hq, d = q.shape
    hkv = k_view.shape[1]
    out = torch.empty(t, hq, d, dtype=torch.float32, device=q.device)
    for i in range(t):
        n = int(ctx[i])
        pages = table[i, : -(-n // PAGE)].long()
        k = k_view[pages].permute(0, 3, 1, 2, 4).reshape(-1, hkv, d)[:n].float()      # [n, Hkv, D]
        v = v_view[pages].permute(0, 2, 4, 1, 3).reshape(-1, hkv, d)[:n].float()
        qg = q[i].view(hkv, hq // hkv, d).float()
        p = torch.softmax(torch.einsum("hgd,nhd->hgn", qg, k) * scale, dim=-1)
        out[i] = torch.einsum("hgn,nhd->hgd", p, v).reshape(hq, d)
    return out.to(q.dtype)


def masked_dense_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
                               q_pos: torch.Tensor, *, block_size: int, scale: float) -> torch.Tensor:
    """Dense attention of one request under the sparse mask: q [T, Hq, D]; k, v [S, Hkv, D] (key j at
    position j, only the request's written keys); blocks [Hkv, T, K] (-1 unused); q_pos [T] -> [T, Hq, D].
    Key j is attended by row t of KV group h iff block j // block_size is in blocks[h, t] and j <= q_pos[t]."""
    t, hq, d = q.shape
    s, hkv = k.shape[0], k.shape[1]
    key_block = torch.arange(s, device=q.device) // block_size
    chosen = (key_block[None, None, :, None] == blocks.long()[:, :, None, :]).any(-1)   # [Hkv, T, S]
    mask = chosen & (torch.arange(s, device=q.device)[None, None, :] <= q_pos[None, :, None])
    qg = q.view(t, hkv, hq // hkv, d).float()
    sc = torch.einsum("thgd,shd->htgs", qg, k.float()) * scale
    p = torch.softmax(sc.masked_fill(~mask[:, :, None, :], float("-inf")), dim=-1)
    return torch.einsum("htgs,shd->thgd", p, v.float()).reshape(t, hq, d).to(q.dtype)
