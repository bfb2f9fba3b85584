"""Triton kernels of the M3 lightning indexer: block-max scores, then top-k selection (+ the sparse page table).

``index_score_kernel``: one program per (query tile of one request, request, split of the key blocks). Every
query row of the tile and every index head are rows of one MMA operand (``BLOCK_Q * BLOCK_H`` rows: decode,
1 + k verification rows and prefill chunks alike), so an index-key block is read once per request and tile,
not once per head and token. fp32 scores, no scale, token-level causal mask.

``select_kernel``: one program per (query row, request, index head): forces the local/init blocks, keeps the
top-k by sorting packed (score, block) int64 keys chunk by chunk, writes block ids (-1 unused) and, when
asked, the compact page-16 table row of the sparse page adapter (full blocks first, own block last).
"""
import triton
import triton.language as tl

from ..ragged import query_row

LOCAL_SCORE = tl.constexpr(1e29)  # forced score of the local blocks (vLLM index_topk kernels)
INIT_SCORE = tl.constexpr(1e30)   # forced score of the init blocks
EMPTY_KEY = tl.constexpr(-(2**63))  # sort key of an unused slot (below every real key)


@triton.jit
def index_score_kernel(q_ptr, k_ptr, s_ptr, bt_ptr, cu_q_ptr, seq_lens_ptr,
                       stride_qt, stride_qh, stride_qd, stride_kb, stride_kp, stride_kd,
                       stride_sh, stride_st, stride_sb, stride_bt,
                       num_heads, n_split,
                       HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr):
    """s[h, t, b] = max_{j in block b, j <= pos(t)} q[t, h] . k[j] over the request's visible blocks.
    USE_PDL (kernels/pdl.py): wait for the previous kernel first; the selection may launch at once."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_q = tl.program_id(0)
    r = tl.program_id(1)
    pid_s = tl.program_id(2)
    q0 = tl.load(cu_q_ptr + r)
    q_len = tl.load(cu_q_ptr + r + 1) - q0
    seq_len = tl.load(seq_lens_ptr + r)
    if pid_q * BLOCK_Q >= q_len:
        return
    m = tl.arange(0, BLOCK_Q * BLOCK_H)
    row = pid_q * BLOCK_Q + m // BLOCK_H
    head = m % BLOCK_H
    row_ok = (row < q_len) & (head < num_heads)
    pos = seq_len - q_len + row
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (q0 + row)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh
                + d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    last_pos = seq_len - q_len + tl.minimum(pid_q * BLOCK_Q + BLOCK_Q, q_len) - 1
    n_blocks = last_pos // BLOCK_SIZE + 1
    per = tl.cdiv(n_blocks, n_split)
    b_lo = pid_s * per
    b_hi = tl.minimum(b_lo + per, n_blocks)
    off_n = tl.arange(0, BLOCK_SIZE)
    s_row = s_ptr + head * stride_sh + (q0 + row).to(tl.int64) * stride_st
    for b in tl.range(b_lo, b_hi):
        page = tl.load(bt_ptr + r * stride_bt + b).to(tl.int64)
        k = tl.load(k_ptr + page * stride_kb + off_n[None, :] * stride_kp + d[:, None] * stride_kd)  # [D, BS]
        qk = tl.dot(q, k.to(q.dtype), out_dtype=tl.float32)
        qk = tl.where((b * BLOCK_SIZE + off_n)[None, :] <= pos[:, None], qk, float("-inf"))
        tl.store(s_row + b * stride_sb, tl.max(qk, axis=1), mask=row_ok)


@triton.jit
def _sortable_key(score, block):
    """int64 key ordered like (score, -block): fp32 bits made monotonic, block id in the low 31 bits."""
    bits = score.to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (0x7FFFFFFF - block).to(tl.int64)


@triton.jit
def _first(sorted_keys, N: tl.constexpr, T: tl.constexpr):
    """The first T entries of a length-N vector."""
    sel = (tl.arange(0, N // T) == 0)[:, None]
    return tl.sum(tl.where(sel, tl.reshape(sorted_keys, [N // T, T]), 0), axis=0)


@triton.jit
def select_kernel(s_ptr, topk_ptr, cu_q_ptr, seq_lens_ptr, bt_ptr, table_ptr, ctx_ptr,
                  stride_sh, stride_st, stride_sb, stride_th, stride_tt, stride_tk, stride_bt,
                  stride_ph, stride_pt, stride_ch,
                  topk, init_blocks, local_blocks, block_page_stride,
                  BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                  PAGES_PER_BLOCK: tl.constexpr, EMIT_TABLE: tl.constexpr, USE_PDL: tl.constexpr):
    """Top-k blocks of one (row, head): ids in descending score order (ties: lower block first), -1 pad.
    USE_PDL: wait for the scores (gdc_wait) before reading anything; the next kernel may launch at once."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    i = tl.program_id(0)
    r = tl.program_id(1)
    h = tl.program_id(2)
    q_len, t, pos = query_row(cu_q_ptr, seq_lens_ptr, r, i)
    if i >= q_len:
        return
    own = pos // BLOCK_SIZE
    n_valid = own + 1
    best = tl.full([BLOCK_T], EMPTY_KEY, tl.int64)
    off_n = tl.arange(0, BLOCK_N)
    s_row = s_ptr + h * stride_sh + t * stride_st
    for c0 in tl.range(0, n_valid, BLOCK_N):
        b = c0 + off_n
        valid = b < n_valid
        x = tl.load(s_row + b * stride_sb, mask=valid, other=0.0)
        x = tl.where(x != x, -3.0e38, x)
        x = tl.where(b > own - local_blocks, LOCAL_SCORE, x)
        x = tl.where(b < init_blocks, INIT_SCORE, x)
        keys = tl.where(valid, _sortable_key(x, b), EMPTY_KEY)
        top = _first(tl.sort(keys, descending=True), BLOCK_N, BLOCK_T)
        both = tl.reshape(tl.join(best, top), [2 * BLOCK_T])
        best = _first(tl.sort(both, descending=True), 2 * BLOCK_T, BLOCK_T)
    off_t = tl.arange(0, BLOCK_T)
    used = (best != EMPTY_KEY) & (off_t < topk)
    blk = tl.where(used, 0x7FFFFFFF - (best & 0x7FFFFFFF), -1).to(tl.int32)
    tl.store(topk_ptr + h * stride_th + t * stride_tt + off_t * stride_tk, blk, mask=off_t < topk)
    if EMIT_TABLE:
        is_full = used & (blk < own)
        is_tail = used & (blk == own)
        n_full = tl.sum(is_full.to(tl.int32), axis=0)
        slot = tl.where(is_full, tl.cumsum(is_full.to(tl.int32), axis=0) - 1, n_full)
        phys = tl.load(bt_ptr + r * stride_bt + tl.where(used, blk, 0), mask=used, other=0).to(tl.int32)
        row = table_ptr + h * stride_ph + t * stride_pt
        for j in tl.static_range(PAGES_PER_BLOCK):
            tl.store(row + slot * PAGES_PER_BLOCK + j, phys * block_page_stride + j, mask=used)
        n_used = tl.sum(used.to(tl.int32), axis=0) * PAGES_PER_BLOCK
        off_w = tl.arange(0, BLOCK_T * PAGES_PER_BLOCK)
        tl.store(row + off_w, tl.zeros_like(off_w), mask=(off_w >= n_used) & (off_w < topk * PAGES_PER_BLOCK))
        has_tail = tl.sum(is_tail.to(tl.int32), axis=0) > 0
        causal = pos + 1
        ctx = tl.where(has_tail, n_full * BLOCK_SIZE + causal - own * BLOCK_SIZE,
                       tl.minimum(tl.sum(used.to(tl.int32), axis=0) * BLOCK_SIZE, causal))
        tl.store(ctx_ptr + h * stride_ch + t, ctx)
