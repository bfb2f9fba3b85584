"""Triton kernels of M3 block-sparse GQA attention on the real KV layouts.

``sparse_attn_kernel`` reads K and V through strided block planes ``[NB, block, Hkv, D]`` (vLLM's Triton
layout ``[NB, Hkv, block, 2 D]`` is two such views, so are the other layouts) and the top-k block ids.
``page16_attn_kernel`` reads AITER's page-16 views (K ``[P, Hkv, D/x, 16, x]``, V ``[P', Hkv, 16/x, D, x]``)
through the sparse page adapter's compact table (one row per query token, context = full blocks + tail).

One program per (query row, request, KV head × split): the GQA group's query heads are the rows of the MMA
(padded to 16), the selected blocks (or compact context chunks) of the row are split ``SPLIT`` ways; with
``SPLIT > 1`` each split writes a normalised partial (in q's dtype) and its log2-sum-exp (fp32), and
``merge_kernel`` combines them, one program per (row, query head). With ``USE_PDL`` (kernels/pdl.py) both
wait for their predecessor with ``gdc_wait`` before any memory access, and the attention kernel lets the merge
be scheduled once its loop is done, so the merge's launch overlaps the attention tail (as vLLM's decode does).
Base-2 online softmax; fp8 KV: K/V upcast on load, the scalar K scale folded into the softmax scale and the V
scale applied to the output.
"""
import triton
import triton.language as tl

from ..ragged import query_row


@triton.jit
def _softmax_step(q, k, kmask, m_i, l_i, acc, scale_log2):
    """Scores of one key tile and the online-softmax bookkeeping: q [H, D], k [D, N], kmask [N] ->
    (p [H, N] fp32, m_new, l_i, acc rescaled); the caller adds p @ v. V is loaded after this step, so K and V
    are never live in registers together."""
    qk = tl.dot(q, k, out_dtype=tl.float32) * scale_log2
    qk = tl.where(kmask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return p, m_new, l_i, acc * alpha[:, None]


@triton.jit
def _group_start(q_ptr, k_scale_ptr, v_scale_ptr, sm_scale, t, kvh, group, stride_qt, stride_qh,
                 HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, HAS_SCALE: tl.constexpr):
    """The GQA group of KV head ``kvh`` at query row t: q [BLOCK_H, D] (padded heads masked), its head ids and
    mask, d, the base-2 softmax scale (fp8: K scale folded in), the V scale, and the empty online-softmax state."""
    off_h = tl.arange(0, BLOCK_H)
    h_ok = off_h < group
    heads = kvh * group + off_h
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=h_ok[:, None], other=0.0)
    scale_log2 = sm_scale * 1.4426950408889634
    v_scale = 1.0
    if HAS_SCALE:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    return q, heads, h_ok, d, scale_log2, v_scale, m_i, l_i, acc


@triton.jit
def _finish(acc, m_i, l_i, v_scale, o_ptr, po_ptr, pl_ptr, t, kvh, s, n_rows, heads, d, h_ok,
            stride_ot, stride_oh, stride_pc, stride_pt, stride_ph, stride_lc, stride_lt,
            SPLIT: tl.constexpr, USE_PDL: tl.constexpr):
    """Write the output (SPLIT == 1) or a normalised partial and its log2-sum-exp."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    inv = tl.where(l_i > 0, 1.0 / tl.where(l_i > 0, l_i, 1.0), 0.0)
    out = acc * (inv * v_scale)[:, None]
    if SPLIT == 1:
        tl.store(o_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=h_ok[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))
        tl.store(po_ptr + s * stride_pc + t * stride_pt + heads[:, None] * stride_ph + d[None, :],
                 out.to(po_ptr.dtype.element_ty), mask=h_ok[:, None])
        tl.store(pl_ptr + s * stride_lc + t * stride_lt + heads, lse, mask=h_ok)


@triton.jit
def sparse_attn_kernel(q_ptr, k_ptr, v_ptr, topk_ptr, bt_ptr, cu_q_ptr, seq_lens_ptr, o_ptr, po_ptr, pl_ptr,
                       k_scale_ptr, v_scale_ptr, sm_scale,
                       stride_qt, stride_qh, stride_kb, stride_kp, stride_kh, stride_kd,
                       stride_vb, stride_vp, stride_vh, stride_vd, stride_th, stride_tt, stride_tk, stride_bt,
                       stride_ot, stride_oh, stride_pc, stride_pt, stride_ph, stride_lc, stride_lt,
                       group, topk, n_rows,
                       HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
                       SPLIT: tl.constexpr, HAS_SCALE: tl.constexpr, USE_PDL: tl.constexpr,
                       UNIFORM_Q: tl.constexpr, BLOCK_J: tl.constexpr):
    """o[t, h] = softmax(q[t, h] K_sel^T / sqrt(D)) V_sel over the row's selected blocks, keys <= pos(t).
    UNIFORM_Q (the caller's guarantee): every request has the grid's max_q_len rows (T = R * max_q_len), so
    row t = r * max_q_len + i needs no load of cu_q: the top-k load does not wait for one. The split's (<= BLOCK_J) block ids and their
    pages are loaded before the loop."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    i = tl.program_id(0)
    r = tl.program_id(1)
    kvh = tl.program_id(2) // SPLIT
    s = tl.program_id(2) % SPLIT
    if UNIFORM_Q:
        q_len = tl.num_programs(0)
        t = (r * q_len + i).to(tl.int64)
        pos = tl.load(seq_lens_ptr + r) - q_len + i
    else:
        q_len, t, pos = query_row(cu_q_ptr, seq_lens_ptr, r, i)
    if i >= q_len:
        return
    own = pos // BLOCK_SIZE
    q, heads, h_ok, d, scale_log2, v_scale, m_i, l_i, acc = _group_start(
        q_ptr, k_scale_ptr, v_scale_ptr, sm_scale, t, kvh, group, stride_qt, stride_qh, HEAD_DIM, BLOCK_H, HAS_SCALE)
    per = tl.cdiv(topk, SPLIT)
    j_lo = s * per
    j_hi = tl.minimum(j_lo + per, topk)
    off_n = tl.arange(0, BLOCK_SIZE)
    sel = topk_ptr + kvh * stride_th + t * stride_tt
    # the split's block ids and pages in two vector loads before the loop: no load chain per block
    jj = j_lo + tl.arange(0, BLOCK_J)
    blks = tl.load(sel + jj * stride_tk, mask=jj < j_hi, other=-1)
    oks = (blks >= 0) & (blks <= own)
    pages = tl.load(bt_ptr + r * stride_bt + tl.where(oks, blks, 0), mask=oks, other=0)
    lasts = tl.where(oks, pos - blks * BLOCK_SIZE, -1)  # last offset of each block visible to the row
    for j in tl.range(j_lo, j_hi):
        pick = tl.arange(0, BLOCK_J) == j - j_lo
        page = tl.sum(tl.where(pick, pages, 0)).to(tl.int64)
        last = tl.sum(tl.where(pick, lasts, 0))
        kmask = off_n <= last
        k = tl.load(k_ptr + page * stride_kb + kvh * stride_kh + off_n[None, :] * stride_kp + d[:, None] * stride_kd,
                    mask=kmask[None, :], other=0.0)
        p, m_i, l_i, acc = _softmax_step(q, k.to(q.dtype), kmask, m_i, l_i, acc, scale_log2)
        v = tl.load(v_ptr + page * stride_vb + kvh * stride_vh + off_n[:, None] * stride_vp + d[None, :] * stride_vd,
                    mask=kmask[:, None], other=0.0)
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc, out_dtype=tl.float32)
    _finish(acc, m_i, l_i, v_scale, o_ptr, po_ptr, pl_ptr, t, kvh, s, n_rows, heads, d, h_ok,
            stride_ot, stride_oh, stride_pc, stride_pt, stride_ph, stride_lc, stride_lt, SPLIT, USE_PDL)


@triton.jit
def page16_attn_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, o_ptr, po_ptr, pl_ptr,
                       k_scale_ptr, v_scale_ptr, sm_scale,
                       stride_qt, stride_qh, stride_kp, stride_kh, stride_vp, stride_vh,
                       stride_gh, stride_gt, stride_ch,
                       stride_ot, stride_oh, stride_pc, stride_pt, stride_ph, stride_lc, stride_lt,
                       group, n_chunks, n_rows,
                       HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, X: tl.constexpr, BLOCK_H: tl.constexpr,
                       SPLIT: tl.constexpr, HAS_SCALE: tl.constexpr, USE_PDL: tl.constexpr):
    """Attention of row t over compact tokens 0 .. ctx-1; token n is slot n % 16 of page table[t, n // 16]."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1) // SPLIT
    s = tl.program_id(1) % SPLIT
    ctx = tl.load(ctx_ptr + kvh * stride_ch + t)
    q, heads, h_ok, d, scale_log2, v_scale, m_i, l_i, acc = _group_start(
        q_ptr, k_scale_ptr, v_scale_ptr, sm_scale, t, kvh, group, stride_qt, stride_qh, HEAD_DIM, BLOCK_H, HAS_SCALE)
    per = tl.cdiv(n_chunks, SPLIT)
    c_lo = s * per
    c_hi = tl.minimum(tl.minimum(c_lo + per, n_chunks), tl.cdiv(ctx, CHUNK))
    off_n = tl.arange(0, CHUNK)
    row = table_ptr + kvh * stride_gh + t * stride_gt
    slot = off_n % 16
    k_in = (d[:, None] // X) * (16 * X) + slot[None, :] * X + d[:, None] % X          # [D, CHUNK]
    v_in = (slot[:, None] // X) * (HEAD_DIM * X) + d[None, :] * X + slot[:, None] % X  # [CHUNK, D]
    for c in tl.range(c_lo, c_hi):
        tok = c * CHUNK + off_n
        kmask = tok < ctx
        page = tl.load(row + tok // 16, mask=kmask, other=0).to(tl.int64)
        k = tl.load(k_ptr + page[None, :] * stride_kp + kvh * stride_kh + k_in, mask=kmask[None, :], other=0.0)
        p, m_i, l_i, acc = _softmax_step(q, k.to(q.dtype), kmask, m_i, l_i, acc, scale_log2)
        v = tl.load(v_ptr + page[:, None] * stride_vp + kvh * stride_vh + v_in, mask=kmask[:, None], other=0.0)
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc, out_dtype=tl.float32)
    _finish(acc, m_i, l_i, v_scale, o_ptr, po_ptr, pl_ptr, t, kvh, s, n_rows, heads, d, h_ok,
            stride_ot, stride_oh, stride_pc, stride_pt, stride_ph, stride_lc, stride_lt, SPLIT, USE_PDL)


@triton.jit
def merge_kernel(po_ptr, pl_ptr, o_ptr, stride_pc, stride_pt, stride_ph, stride_lc, stride_lt, stride_ot, stride_oh,
                 HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, USE_PDL: tl.constexpr):
    """o[t, h] = sum_s w_s o_s[t, h], w_s = 2^(lse_s - lse), over the splits of row t; one program per (t, h)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    c = tl.arange(0, SPLIT)
    d = tl.arange(0, HEAD_DIM)
    lse = tl.load(pl_ptr + c * stride_lc + t * stride_lt + h)                                   # [SPLIT]
    mx = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))
    w = w / tl.sum(w, axis=0)
    o = tl.load(po_ptr + c[:, None] * stride_pc + t * stride_pt + h * stride_ph + d[None, :]).to(tl.float32)
    tl.store(o_ptr + t * stride_ot + h * stride_oh + d, tl.sum(o * w[:, None], axis=0).to(o_ptr.dtype.element_ty))
