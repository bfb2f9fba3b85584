"""Decode GEMM ``y[M, N] = x[M, K] @ W[N, K]ᵀ`` for M up to a few hundred: stream-K over a fixed grid.

Split-K gives every output tile the same number of splits, so the program count is tiles × SPLIT_K:
rarely a whole number of waves (N 2560, 64-row tiles, SPLIT_K 4: 160 programs on 132 SMs, one wave
and a 28-program tail), and the x tile is re-read by every split of every N tile. Stream-K fixes the
grid instead: P programs (a multiple of the SM count) and ``TOTAL = tiles × ITERS`` K-steps
(``ITERS = cdiv(K, BLOCK_K)``), program p taking steps ``[p·TOTAL/P, (p+1)·TOTAL/P)`` in tile order.
Every program gets the same work ±1 step, whatever the shape. A BLOCK_M that covers all of M (one row
tile) reads W exactly once; with several row tiles, those of one N block are consecutive in tile order,
so they run at about the same time and share W through L2.

A program loops over the tiles its range meets, with an inner loop over the K-steps of its *segment*
(its part of one tile): the innermost loop is what the compiler pipelines (a single flat loop over the
steps with the segment ends as conditions compiled without a pipeline on the H200, triton 3.6: one
stage of shared memory). A segment covering a whole tile
writes y directly. Otherwise it writes an fp32 partial (slot 0 for the program's first segment, slot 1
for its last: at most two partial segments per program), then counts itself on the tile's counter; the
program that arrives last sums the other contributors' partials with its own accumulator, writes y and
resets the counter (graph safe, as tiles.splitk_store). That reducer reads every contributor's tile alone;
with ``ATOMIC`` the contributors instead add their partials into the tile's fp32 sum (a workspace that is
zero at rest: the reducer reads it once, writes y and zeroes it), which takes the serial reduction off
the tail at the price of a summation order that varies from call to call. The contributors of tile t are the owners of
its first and last step and every program between: ``owner(j) = ((j + 1)·P − 1) // TOTAL``.

The accumulator is swapped (``acc[BLOCK_N, BLOCK_M]``, tiles.py) and every K-step is tiles.mac_step,
so every weight format of the split-K kernel runs here too.
"""
import triton
import triton.language as tl

from .tiles import mac_step, row_scale


@triton.jit
def _owner(j, P, TOTAL):
    """The program whose step range holds K-step j (the last p with p·TOTAL // P <= j)."""
    return ((j + 1) * P - 1) // TOTAL


@triton.jit(do_not_specialize=["M"])
def gemm_streamk_kernel(
        # pointers (p_part: fp32 [P, 2, BLOCK_N*BLOCK_M], or with ATOMIC fp32 [tiles, BLOCK_N*BLOCK_M] zero at rest;
        # p_lock: int32 [tiles], zero at rest)
        p_x, p_w, p_s, p_y, p_part, p_lock,
        # sizes (ITERS: K-steps per tile; TOTAL: tiles × ITERS)
        M, N, K, ITERS, TOTAL,
        # strides
        s_xm, s_xk, s_wn, s_wk, s_sn, s_sk, s_ym, s_yn,
        # weight format
        W_FORMAT: tl.constexpr, SB_N: tl.constexpr, SB_K: tl.constexpr, NATIVE_MX: tl.constexpr,
        X_FMT: tl.constexpr,
        # tiles
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ATOMIC: tl.constexpr):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    start = pid * TOTAL // P
    end = (pid + 1) * TOTAL // P
    n_m = tl.cdiv(M, BLOCK_M)
    o_t = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    first_t = start // ITERS
    for t in range(first_t, (end - 1) // ITERS + 1):           # the tiles the range meets; one segment each
        k_lo = tl.maximum(start - t * ITERS, 0)
        k_hi = tl.minimum(end - t * ITERS, ITERS)
        o_m = (t % n_m) * BLOCK_M + tl.arange(0, BLOCK_M)       # row tiles of one N block are neighbours
        o_n = (t // n_m) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kk in range(k_lo, k_hi):                            # the innermost loop: its loads are pipelined
            acc = mac_step(acc, p_x, p_w, p_s, o_m, o_n, kk * BLOCK_K, M, N, K, s_xm, s_xk, s_wn, s_wk, s_sn, s_sk,
                           W_FORMAT, SB_N, SB_K, NATIVE_MX, X_FMT, BLOCK_N, BLOCK_K)
        acc = row_scale(acc, p_s, o_n, N, W_FORMAT, SB_K)
        p_out = p_y + o_n[:, None] * s_yn + o_m[None, :] * s_ym
        m_y = (o_n[:, None] < N) & (o_m[None, :] < M)
        if (k_lo == 0) & (k_hi == ITERS):                       # the whole tile: no partial
            tl.store(p_out, acc.to(p_y.dtype.element_ty), mask=m_y)
        elif ATOMIC:                                            # add into the tile's zeroed fp32 sum
            p_sum = p_part + t * (BLOCK_N * BLOCK_M) + o_t
            tl.atomic_add(p_sum, acc, sem="relaxed")
            tl.debug_barrier()                                  # all of this program's adds issued first
            arrived = tl.atomic_add(p_lock + t, 1)              # acq_rel: publishes them
            if arrived == _owner(t * ITERS + ITERS - 1, P, TOTAL) - _owner(t * ITERS, P, TOTAL):
                tl.debug_barrier()
                total = tl.load(p_sum, cache_modifier=".cg")
                tl.store(p_out, total.to(p_y.dtype.element_ty), mask=m_y)
                tl.store(p_sum, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32))   # zero for the next call
                tl.atomic_xchg(p_lock + t, 0)                   # ready for the next call / graph replay
        else:
            slot = tl.where(t == first_t, 0, 1)                 # the program's first segment, or its last
            tl.store(p_part + (pid * 2 + slot) * (BLOCK_N * BLOCK_M) + o_t, acc)
            tl.debug_barrier()                                  # all partial stores of this program first
            first = _owner(t * ITERS, P, TOTAL)
            last = _owner(t * ITERS + ITERS - 1, P, TOTAL)
            arrived = tl.atomic_add(p_lock + t, 1)              # acq_rel: publishes the partial
            if arrived == last - first:                         # the last contributor reduces
                tl.debug_barrier()
                for q in range(first, last + 1):
                    if q != pid:
                        q_slot = tl.where((q * TOTAL // P) // ITERS == t, 0, 1)   # tile t is q's first segment?
                        acc += tl.load(p_part + (q * 2 + q_slot) * (BLOCK_N * BLOCK_M) + o_t, cache_modifier=".cg")
                tl.store(p_out, acc.to(p_y.dtype.element_ty), mask=m_y)
                tl.atomic_xchg(p_lock + t, 0)                   # ready for the next call / graph replay
