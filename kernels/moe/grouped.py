"""The two grouped GEMMs of the MoE over aligned token blocks (see align.py), SwiGLU-OAI and the combine fused.

``gate_up_kernel``: h = x[token] · W13[e]ᵀ for the gate rows and the up rows of one column tile, then
SwiGLU-OAI in the epilogue; writes the activation per slot [T·k, I] in x's dtype, or, with ``OUT_MX``,
MXFP8 (E4M3 codes + one E8M0 byte per 32 columns, the OCP rule of kernels/mx) for an MX down GEMM.

``down_kernel``: y = act[slot] · W2[e]ᵀ, times the slot's routing weight and ``output_scale`` in the
epilogue, then either summed per token into an fp32 [T, H] buffer with atomic adds (``COMBINE_STORE`` off),
or stored per slot into [T·k, H] in x's dtype, and ``combine_kernel`` sums each token's valid slots
(deterministic; no zero-fill and no cast launch).

Row blocks come from the alignment (align.py), or, with ``NAIVE``, one block per slot holding that slot
alone (vLLM's naive assignment for tiny T: no alignment launch).

Both keep the accumulator swapped, ``acc[BLOCK_N, BLOCK_M] += W_tile @ x_tileᵀ`` (as kernels/gemm): the
weight tile is the MMA's first operand, so a decode block holding one real token wastes no weight reads.
Weights: bf16 (as stored; fp16/fp32 in CPU tests), mxfp8 (e4m3 + E8M0 [N, K/32]), mxfp4 (packed E2M1
[N, K/2], low nibble first, + E8M0), dequantised in registers, or ``tl.dot_scaled`` where the GPU has MX
units (NATIVE_MX). Program order (``ORDER``): "token" walks GROUP_M row blocks across the column tiles
(vLLM's swizzle; GROUP_M = 1: row by row), "expert" walks all row blocks of a column tile first, so an
expert's weight tile is read by consecutive programs.
"""
import triton
import triton.language as tl

from ..gemm.tiles import grouped_tile
from ..mx.triton_mx import block_scale, e2m1_to_f32, e8m0_to_f32, pow2, round_e4m3
from .align import local_expert

ORDERS = ("token", "expert")


@triton.jit
def program_tile(pid, NUM_M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                 ORDER: tl.constexpr):
    """pid -> (row block, column tile) in the chosen program order."""
    if ORDER == "expert":
        return pid % NUM_M, pid // NUM_M
    return grouped_tile(pid, NUM_M * BLOCK_M, N, BLOCK_M, BLOCK_N, GROUP_M)


@triton.jit
def block_rows(p_sorted, p_eids, p_npost, p_ids, p_map, i_m, NUMEL, NUM_E, BLOCK_M: tl.constexpr,
               NAIVE: tl.constexpr, HAS_MAP: tl.constexpr):
    """(expert or -1, slots [BLOCK_M], valid mask) of row block i_m; expert -1 = nothing to do. NAIVE: block i_m
    is slot i_m alone, its expert read from the routed ids (through the expert map)."""
    if NAIVE:
        o = tl.arange(0, BLOCK_M)
        e = tl.max(local_expert(p_ids, p_map, i_m + o * 0, NUMEL, NUM_E, HAS_MAP), axis=0)
        return e, i_m + o * 0, o == 0
    e = tl.load(p_eids + i_m)
    e = tl.where(i_m * BLOCK_M < tl.load(p_npost), e, -1)
    slots = tl.load(p_sorted + i_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slots < NUMEL
    return e, tl.where(valid, slots, 0), valid


@triton.jit
def weight_tile(p_w, p_s, o_n, k0, N, K, s_wn, s_wk, s_sn, s_sk, W_FORMAT: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CT: tl.constexpr):
    """W[o_n, k0:k0+BLOCK_K] dequantised to CT: [BLOCK_N, BLOCK_K] (zeros outside N, K)."""
    o_k = k0 + tl.arange(0, BLOCK_K)
    m_n = o_n[:, None] < N
    if W_FORMAT == "mxfp4":
        o_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        b_q = tl.load(p_w + o_n[:, None] * s_wn + o_p[None, :] * s_wk, mask=m_n & (o_p[None, :] < K // 2),
                      other=0).to(tl.int32)
        b_v = tl.reshape(tl.join(e2m1_to_f32(b_q & 15), e2m1_to_f32(b_q >> 4)), (BLOCK_N, BLOCK_K))
    else:
        b_v = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :] * s_wk, mask=m_n & (o_k[None, :] < K), other=0.0)
    if W_FORMAT == "mxfp8" or W_FORMAT == "mxfp4":
        o_g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        b_s = tl.load(p_s + o_n[:, None] * s_sn + o_g[None, :] * s_sk, mask=m_n & (o_g[None, :] < K // 32), other=127)
        b_v = tl.reshape(tl.reshape(b_v.to(tl.float32), (BLOCK_N, BLOCK_K // 32, 32)) * e8m0_to_f32(b_s)[:, :, None],
                         (BLOCK_N, BLOCK_K))
    return b_v.to(CT)


@triton.jit
def mac(acc, b_x, b_xs, p_w, p_s, o_n, k0, N, K, s_wn, s_wk, s_sn, s_sk,
        W_FORMAT: tl.constexpr, NATIVE_MX: tl.constexpr, X_FMT: tl.constexpr, X_MX: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CT: tl.constexpr):
    """acc[BLOCK_N, BLOCK_M] += W[o_n, k0:k0+BLOCK_K] @ xᵀ; b_x [BLOCK_M, BLOCK_K] (X_MX: e4m3 codes, b_xs
    E8M0 [BLOCK_M, BLOCK_K/32])."""
    if NATIVE_MX and (W_FORMAT == "mxfp8" or W_FORMAT == "mxfp4"):
        o_g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        m_n = o_n[:, None] < N
        b_s = tl.load(p_s + o_n[:, None] * s_sn + o_g[None, :] * s_sk, mask=m_n, other=127)
        if W_FORMAT == "mxfp4":
            o_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            b_q = tl.load(p_w + o_n[:, None] * s_wn + o_p[None, :] * s_wk, mask=m_n, other=0)
            if X_MX:
                acc = tl.dot_scaled(b_q, b_s, "e2m1", tl.trans(b_x), b_xs, "e4m3", acc)
            else:
                acc = tl.dot_scaled(b_q, b_s, "e2m1", tl.trans(b_x), None, X_FMT, acc)
        else:
            o_k = k0 + tl.arange(0, BLOCK_K)
            b_q = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :] * s_wk, mask=m_n, other=0.0)
            if X_MX:
                acc = tl.dot_scaled(b_q, b_s, "e4m3", tl.trans(b_x), b_xs, "e4m3", acc)
            else:
                acc = tl.dot_scaled(b_q, b_s, "e4m3", tl.trans(b_x), None, X_FMT, acc)
    else:
        if X_MX:
            b_x = tl.reshape(tl.reshape(b_x.to(tl.float32), (b_x.shape[0], BLOCK_K // 32, 32))
                             * e8m0_to_f32(b_xs)[:, :, None], (b_x.shape[0], BLOCK_K)).to(CT)
        b_w = weight_tile(p_w, p_s, o_n, k0, N, K, s_wn, s_wk, s_sn, s_sk, W_FORMAT, BLOCK_N, BLOCK_K, CT)
        acc = tl.dot(b_w, tl.trans(b_x), acc)
    return acc


@triton.jit
def swiglu(g, u, alpha, limit, beta):
    """SwiGLU-OAI in fp32: min(g, limit)·σ(alpha·min(g, limit))·(clip(u, ±limit) + beta)."""
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    return g * tl.sigmoid(alpha * g) * (u + beta)


@triton.jit(do_not_specialize=["NUMEL", "NUM_M"])
def gate_up_kernel(
        # pointers: x [T, H]; w13 [E, 2I, H] (+ scales); act out [T·k, I] (OUT_MX: e4m3 + E8M0 [T·k, I/32])
        p_x, p_w, p_s, p_a, p_as, p_sorted, p_eids, p_npost, p_ids, p_map,
        # sizes: NUMEL = T·k slots, NUM_M = row blocks in the grid, I = intermediate, H = hidden, NUM_E = experts
        NUMEL, NUM_M, I, H, TOPK, NUM_E,
        s_xm, s_xk, s_we, s_wn, s_wk, s_se, s_sn, s_sk, s_am, s_an, s_asm, s_ask,
        alpha, limit, beta,
        W_FORMAT: tl.constexpr, NATIVE_MX: tl.constexpr, X_FMT: tl.constexpr, OUT_MX: tl.constexpr,
        ORDER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, NAIVE: tl.constexpr, HAS_MAP: tl.constexpr):
    i_m, i_n = program_tile(tl.program_id(0), NUM_M, I, BLOCK_M, BLOCK_N, GROUP_M, ORDER)
    e, slots, valid = block_rows(p_sorted, p_eids, p_npost, p_ids, p_map, i_m, NUMEL, NUM_E, BLOCK_M, NAIVE, HAS_MAP)
    if e < 0:
        return
    CT: tl.constexpr = p_x.dtype.element_ty
    rows = slots // TOPK
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    p_we = p_w + e.to(tl.int64) * s_we
    p_se = p_s + e.to(tl.int64) * s_se
    acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(p_x + rows[:, None] * s_xm + o_k[None, :] * s_xk, mask=valid[:, None] & (o_k[None, :] < H),
                      other=0.0)
        acc_g = mac(acc_g, b_x, b_x, p_we, p_se, o_n, k0, I, H, s_wn, s_wk, s_sn, s_sk,
                    W_FORMAT, NATIVE_MX, X_FMT, False, BLOCK_N, BLOCK_K, CT)
        acc_u = mac(acc_u, b_x, b_x, p_we + I * s_wn, p_se + I * s_sn, o_n, k0, I, H, s_wn, s_wk, s_sn, s_sk,
                    W_FORMAT, NATIVE_MX, X_FMT, False, BLOCK_N, BLOCK_K, CT)
    # h is rounded to x's dtype first, as it is stored between the two kernels of an unfused MoE
    act = swiglu(acc_g.to(CT).to(tl.float32), acc_u.to(CT).to(tl.float32), alpha, limit, beta)  # [BN, BM]
    m_out = (o_n[:, None] < I) & valid[None, :]
    if OUT_MX:
        # one E8M0 scale per 32 columns of a slot's row (OCP rule of kernels/mx): [BN/32, 32, BM]
        a3 = tl.reshape(act, (BLOCK_N // 32, 32, BLOCK_M))
        exp, byte = block_scale(tl.max(tl.abs(a3), axis=1), 8)                       # [BN/32, BM]
        v = tl.minimum(tl.maximum(a3 * pow2(-exp)[:, None, :], -448.0), 448.0)
        code = round_e4m3(v).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        code = tl.where((code & 0x7F) == 0, ((a3.to(tl.int32, bitcast=True) >> 24) & 0x80).to(tl.uint8), code)
        code = tl.reshape(code, (BLOCK_N, BLOCK_M))
        tl.store(p_a + slots[None, :] * s_am + o_n[:, None] * s_an, code.to(tl.float8e4nv, bitcast=True), mask=m_out)
        o_g = i_n * (BLOCK_N // 32) + tl.arange(0, BLOCK_N // 32)
        tl.store(p_as + slots[None, :] * s_asm + o_g[:, None] * s_ask, byte.to(tl.uint8),
                 mask=(o_g[:, None] < I // 32) & valid[None, :])
    else:
        tl.store(p_a + slots[None, :] * s_am + o_n[:, None] * s_an, act.to(p_a.dtype.element_ty), mask=m_out)


@triton.jit(do_not_specialize=["NUMEL", "NUM_M"])
def down_kernel(
        # pointers: act [T·k, I] (X_MX: e4m3 + E8M0 [T·k, I/32]); w2 [E, H, I] (+ scales); out fp32 [T, H]
        # (zeroed: atomic adds) or, COMBINE_STORE, [T·k, H] per slot; routing weights fp32 [T·k]
        p_a, p_as, p_w, p_s, p_out, p_topw, p_sorted, p_eids, p_npost, p_ids, p_map,
        NUMEL, NUM_M, H, I, TOPK, NUM_E, output_scale,
        s_am, s_ak, s_asm, s_ask, s_we, s_wn, s_wk, s_se, s_sn, s_sk, s_ot, s_on,
        W_FORMAT: tl.constexpr, NATIVE_MX: tl.constexpr, X_FMT: tl.constexpr, X_MX: tl.constexpr,
        CT: tl.constexpr, ORDER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NAIVE: tl.constexpr, HAS_MAP: tl.constexpr,
        COMBINE_STORE: tl.constexpr):
    i_m, i_n = program_tile(tl.program_id(0), NUM_M, H, BLOCK_M, BLOCK_N, GROUP_M, ORDER)
    e, slots, valid = block_rows(p_sorted, p_eids, p_npost, p_ids, p_map, i_m, NUMEL, NUM_E, BLOCK_M, NAIVE, HAS_MAP)
    if e < 0:
        return
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    p_we = p_w + e.to(tl.int64) * s_we
    p_se = p_s + e.to(tl.int64) * s_se
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(p_a + slots[:, None] * s_am + o_k[None, :] * s_ak, mask=valid[:, None] & (o_k[None, :] < I),
                      other=0.0)
        b_xs = b_x
        if X_MX:
            o_g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            b_xs = tl.load(p_as + slots[:, None] * s_asm + o_g[None, :] * s_ask,
                           mask=valid[:, None] & (o_g[None, :] < I // 32), other=127)
        acc = mac(acc, b_x, b_xs, p_we, p_se, o_n, k0, H, I, s_wn, s_wk, s_sn, s_sk,
                  W_FORMAT, NATIVE_MX, X_FMT, X_MX, BLOCK_N, BLOCK_K, CT)
    w = tl.load(p_topw + slots, mask=valid, other=0.0) * output_scale
    m_out = (o_n[:, None] < H) & valid[None, :]
    if COMBINE_STORE:
        tl.store(p_out + slots[None, :] * s_ot + o_n[:, None] * s_on, (acc * w[None, :]).to(p_out.dtype.element_ty),
                 mask=m_out)
    else:
        tok = slots // TOPK
        tl.atomic_add(p_out + tok[None, :] * s_ot + o_n[:, None] * s_on, acc * w[None, :], mask=m_out, sem="relaxed")


@triton.jit
def combine_kernel(p_y, p_ids, p_map, p_out, NUMEL, H, TOPK, NUM_E, s_ym, s_yn, s_ot, s_on,
                   HAS_MAP: tl.constexpr, TOPK_P2: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t, cols] = Σ_j y[t·k + j, cols] over the token's slots whose expert is local (the slots the down
    kernel wrote), fp32 sum in slot order; grid (T, H / BLOCK_H)."""
    t = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    o_j = tl.arange(0, TOPK_P2)
    slot = t * TOPK + o_j
    ok = (local_expert(p_ids, p_map, slot, NUMEL, NUM_E, HAS_MAP) >= 0) & (o_j < TOPK)
    y = tl.load(p_y + slot[:, None] * s_ym + o_n[None, :] * s_yn, mask=ok[:, None] & (o_n[None, :] < H), other=0.0)
    tl.store(p_out + t * s_ot + o_n * s_on, tl.sum(y.to(tl.float32), axis=0).to(p_out.dtype.element_ty),
             mask=o_n < H)
