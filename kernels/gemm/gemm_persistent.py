"""Persistent prefill GEMM ``y[M, N] = x[M, K] @ W[N, K]ᵀ``: one program per SM, bulk tensor copies,
the last partial wave split along K.

- **Persistent order.** The grid is ``programs`` (the SM count, :func:`plan`); program p computes output
  tiles p, p + programs, ... in grouped order (``tiles.grouped_tile``: GROUP_M row tiles sweep the columns
  together, so the weight tiles they share come from L2). With ``FLATTEN`` the tile loop and the K loop are
  one software-pipelined loop: the loads of the next tile are issued while the current tile's epilogue
  (convert, bulk store) runs.
- **Bulk tensor copies.** With ``USE_TMA`` the operands are read (and whole tiles of y written) through
  tensor descriptors built on the host (``triton.tools.tensor_descriptor.TensorDescriptor``): Hopper's
  TMA unit moves the tiles into shared memory, out-of-range rows and columns read as zeros and are
  clipped on store, so no masks. Without (GPUs or backends without TMA, or operands that are not 16-byte
  aligned) the same loop runs on masked pointer loads.
- **Stream-K tail.** ``tiles = n_dp + n_sk``: the first ``n_dp`` tiles (whole waves of ``programs``) are
  data-parallel, one tile over the whole K at a time; the last ``n_sk`` tiles (the partial wave that would
  leave SMs idle, plus ``SPLIT_K - 1`` whole waves: ``launcher.persistent_plan``) are stream-K: their
  ``n_sk * steps`` K steps are cut into one contiguous, equal run per program, so every program ends at
  the same time. A tile shared by several programs gets an fp32 partial from each; an atomic counter per
  tile finds the contributor that arrives last, which sums the partials in a fixed order, writes y and
  resets the counter (the protocol of ``tiles.splitk_store``, with run-time contributor counts, so one
  binary serves every M). One launch, CUDA-graph safe, deterministic.

Accumulator ``acc[BLOCK_M, BLOCK_N] = x_tile @ W_tileᵀ`` (not swapped: x and W both arrive in shared
memory, and y is stored as laid out). Weight formats: floating weights of x's dtype (``"bf16"``) and fp8
with per-channel scales (codes converted to x's dtype before the MMA, the scale applied once per output
column); the launcher dequantises MX weights first (``launcher.DEQUANT_PREFILL``).
"""
import triton
import triton.language as tl

from .tiles import grouped_tile


@triton.jit
def _mma_k_range(acc, x_desc, w_desc, p_x, p_w, off_m, off_n, k_lo, k_hi, M, N, K, s_xm, s_xk, s_wn, s_wk,
                 W_FORMAT: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += x[off_m:+BLOCK_M, k_lo:k_hi] @ W[off_n:+BLOCK_N, k_lo:k_hi]ᵀ (k_lo a multiple
    of BLOCK_K; rows, columns and K beyond the operands read as zeros)."""
    o_m = off_m + tl.arange(0, BLOCK_M)
    o_n = off_n + tl.arange(0, BLOCK_N)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if USE_TMA:
            a = x_desc.load([off_m, k0])                                             # [BM, BK]
            b = w_desc.load([off_n, k0])                                             # [BN, BK]
        else:
            o_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(p_x + o_m[:, None] * s_xm + o_k[None, :] * s_xk,
                        mask=(o_m[:, None] < M) & (o_k[None, :] < K), other=0.0)
            b = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :] * s_wk,
                        mask=(o_n[:, None] < N) & (o_k[None, :] < K), other=0.0)
        if W_FORMAT == "fp8":
            b = b.to(a.dtype)                                                        # e4m3 is exact in bf16/fp16
        acc = tl.dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def _col_scale(acc, p_s, o_n, N, W_FORMAT: tl.constexpr):
    """fp8: acc [BLOCK_M, BLOCK_N] times the per-channel scale of each output column (fp32 [N])."""
    if W_FORMAT == "fp8":
        acc = acc * tl.load(p_s + o_n, mask=o_n < N, other=0.0)[None, :]
    return acc


@triton.jit
def _store_tile(acc, y_desc, p_y, off_m, off_n, M, N, s_ym, s_yn,
                USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[off_m:+BLOCK_M, off_n:+BLOCK_N] = acc (a bulk store with USE_TMA, clipped at the edges; else masked)."""
    if USE_TMA:
        y_desc.store([off_m, off_n], acc.to(p_y.dtype.element_ty))
    else:
        o_m = off_m + tl.arange(0, BLOCK_M)
        o_n = off_n + tl.arange(0, BLOCK_N)
        tl.store(p_y + o_m[:, None] * s_ym + o_n[None, :] * s_yn, acc.to(p_y.dtype.element_ty),
                 mask=(o_m[:, None] < M) & (o_n[None, :] < N))


@triton.jit
def _fixup(acc, p_y, off_m, off_n, M, N, s_ym, s_yn, p_part, p_lock, slot, j, n_contrib, max_contrib,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store contributor j's fp32 partial of stream-K tile ``slot``; the contributor that arrives last sums
    the ``n_contrib`` partials (in contributor order: deterministic) into y and resets the counter.
    p_part: fp32 [n_sk, max_contrib, BLOCK_M*BLOCK_N]; p_lock: int32 [n_sk], zero before the call."""
    o_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    p_tile = p_part + slot * max_contrib * (BLOCK_M * BLOCK_N) + o_t
    tl.store(p_tile + j * (BLOCK_M * BLOCK_N), acc)
    tl.debug_barrier()                                       # all partial stores of this program first
    arrived = tl.atomic_add(p_lock + slot, 1)                # acq_rel: publishes the partial
    if arrived == n_contrib - 1:
        tl.debug_barrier()
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(n_contrib):
            total += tl.load(p_tile + i * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
        o_m = off_m + tl.arange(0, BLOCK_M)
        o_n = off_n + tl.arange(0, BLOCK_N)
        tl.store(p_y + o_m[:, None] * s_ym + o_n[None, :] * s_yn, total.to(p_y.dtype.element_ty),
                 mask=(o_m[:, None] < M) & (o_n[None, :] < N))
        tl.atomic_xchg(p_lock + slot, 0)                     # ready for the next call / graph replay


@triton.jit(do_not_specialize=["M", "n_dp", "n_sk", "max_contrib"])
def gemm_persistent_kernel(
        # tensor descriptors of x [M, K], W [N, K], y [M, N] (USE_TMA; else any tensors) and the raw pointers
        # (p_s: fp32 per-channel scales [N] for fp8, else any pointer; p_part/p_lock: stream-K workspace)
        x_desc, w_desc, y_desc, p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes; programs = grid size; tiles [0, n_dp) data-parallel, the last n_sk tiles stream-K
        M, N, K, programs, n_dp, n_sk, max_contrib,
        # strides
        s_xm, s_xk, s_wn, s_wk, s_ym, s_yn,
        W_FORMAT: tl.constexpr, USE_TMA: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    for t in tl.range(pid, n_dp, programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        i_m, i_n = grouped_tile(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _mma_k_range(acc, x_desc, w_desc, p_x, p_w, i_m * BLOCK_M, i_n * BLOCK_N, 0, K, M, N, K,
                           s_xm, s_xk, s_wn, s_wk, W_FORMAT, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
        acc = _col_scale(acc, p_s, i_n * BLOCK_N + tl.arange(0, BLOCK_N), N, W_FORMAT)
        _store_tile(acc, y_desc, p_y, i_m * BLOCK_M, i_n * BLOCK_N, M, N, s_ym, s_yn, USE_TMA, BLOCK_M, BLOCK_N)
    # stream-K: the n_sk tiles' K steps, one contiguous run of them per program (program p: [p*I/P, (p+1)*I/P))
    steps = tl.cdiv(K, BLOCK_K)
    iters = n_sk * steps
    it = pid * iters // programs
    it_end = (pid + 1) * iters // programs
    while it < it_end:
        slot = it // steps
        k_lo = it - slot * steps
        k_hi = tl.minimum(steps, k_lo + it_end - it)
        i_m, i_n = grouped_tile(n_dp + slot, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _mma_k_range(acc, x_desc, w_desc, p_x, p_w, i_m * BLOCK_M, i_n * BLOCK_N, k_lo * BLOCK_K,
                           tl.minimum(K, k_hi * BLOCK_K), M, N, K, s_xm, s_xk, s_wn, s_wk,
                           W_FORMAT, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
        acc = _col_scale(acc, p_s, i_n * BLOCK_N + tl.arange(0, BLOCK_N), N, W_FORMAT)
        if (k_lo == 0) & (k_hi == steps):                    # a whole tile inside this program's run
            _store_tile(acc, y_desc, p_y, i_m * BLOCK_M, i_n * BLOCK_N, M, N, s_ym, s_yn, USE_TMA,
                        BLOCK_M, BLOCK_N)
        else:                                                # programs first..last share this tile
            first = ((slot * steps + 1) * programs - 1) // iters
            last = ((slot + 1) * steps * programs - 1) // iters
            _fixup(acc, p_y, i_m * BLOCK_M, i_n * BLOCK_N, M, N, s_ym, s_yn, p_part, p_lock, slot, pid - first,
                   last - first + 1, max_contrib, BLOCK_M, BLOCK_N)
        it += k_hi - k_lo
