"""bf16 prefill GEMM on one GPU: cuBLAS, the tiled kernel (its table config) and the persistent kernel
(best of a small candidate grid), side by side at the M3 TP4 shapes, timed by m3lab.bench.timing.graph_time
(>= 24 calls per graph, weights rotated past L2).

    python notes/prefill/bench_prefill.py --out DIR [--ms 2048,4096] [--budget-s 300]

Checks odd shapes and every weight format the launcher routes to the kernel, then at every point each config
(bf16 vs an fp32 torch matmul, output poisoned with NaN) before timing it, and its outputs again after the
graph replays. Writes DIR/prefill_bench.csv (every timing), DIR/prefill_resources.csv (registers, spills, shared
memory of each persistent binary) and prints the per-point table last.
"""
import argparse
import csv
import math
import os
import time

import torch

from m3lab.bench.timing import HARNESS, copies_needed, graph_time
from m3lab.kernels.gemm import launcher
from m3lab.kernels.gemm.tables import GemmConfig, select_config

SHAPES = ((1536, 6144), (2304, 6144), (2560, 6144), (6144, 768), (6144, 2048), (6144, 3072), (6144, 6144))


def P(bm, bn, bk, warps, stages, split, flatten=False, ws=False, tma=None):
    return GemmConfig("persistent", bm, bn, bk, 8, split, warps, stages, USE_TMA=tma, FLATTEN=flatten or None,
                      WARP_SPECIALIZE=ws or None)


# SPLIT_K: 1 no tail split; 8 the last partial wave's tiles in up to 8 K ranges (launcher.persistent_plan)
CANDIDATES = [P(bm, bn, 64, w, s, split, fl) for bm, bn, w, s in ((128, 128, 8, 4), (128, 256, 8, 3), (256, 128, 8, 3))
              for split in (1, 8) for fl in (False, True)]
CANDIDATES += [P(128, 128, 64, 4, 4, 8), P(128, 128, 64, 4, 4, 8, True),
               P(128, 256, 64, 8, 3, 8, True, True), P(128, 128, 64, 4, 4, 8, False, True),
               P(128, 128, 64, 8, 4, 8, tma=False)]


def short(cfg: GemmConfig) -> str:
    s = f"{cfg.kernel[:4]} {cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K} w{cfg.num_warps}s{cfg.num_stages}"
    if cfg.kernel == "persistent":
        s += f" sk{cfg.SPLIT_K}" + (" fl" if cfg.FLATTEN else "") + (" ws" if cfg.WARP_SPECIALIZE else "")
        s += " ptr" if cfg.USE_TMA is False else ""
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--ms", default="2048,4096")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=14)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    ms = [int(v) for v in a.ms.split(",")]
    name = torch.cuda.get_device_name(dev)
    import triton
    print(f"{name}, triton {triton.__version__}, torch {torch.__version__}, {HARNESS}", flush=True)

    tiled = {(m, n, k): select_config(m, n, k, "bf16", dev) for m in ms for n, k in SHAPES}
    from m3lab.tune.gemm import precompile
    jobs = [("bf16", c, 6144) for c in CANDIDATES] + [("bf16", c, k) for (m, n, k), c in tiled.items()]
    failed = precompile(jobs, workers=a.workers)
    for (f, c, k), err in failed.items():
        print(f"compile failed: {short(c)}: {err}", flush=True)
    cands = CANDIDATES          # a config that failed to precompile is tried (and reported) at each point

    compiled = {}
    orig = launcher.launch

    def rec(kernel, grid, *args, **kw):
        ck = orig(kernel, grid, *args, **kw)
        compiled[rec.cfg] = ck
        return ck
    rec.cfg = None
    launcher.launch = rec

    # correctness only: odd shapes and every format the launcher routes to the kernel
    from m3lab.kernels.gemm.reference import linear_ref, quantize_weight
    for cfg in (P(128, 256, 64, 8, 3, 8), P(128, 128, 64, 8, 4, 8, True)):
        for m, n, k in ((3000, 2304, 6144), (300, 200, 136), (2048, 2560, 768)):
            for fmt in ("bf16", "fp8") + (("mxfp8", "mxfp4") if k % 32 == 0 else ()):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w0 = torch.randn(n, k, device=dev) / k**0.5
                wq, sc = quantize_weight(w0.to(torch.bfloat16) if fmt == "bf16" else w0, fmt)
                y = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
                try:
                    launcher.linear(x, wq, w_format=fmt, w_scale=sc, config=cfg, out=y)
                    ref = linear_ref(x.float(), wq, w_format=fmt, w_scale=sc).float()
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                    print(f"check {short(cfg)} M={m} N={n} K={k} {fmt}: rel err {err:.2e} "
                          f"{'ok' if err < 1e-2 else 'FAIL'}", flush=True)
                except Exception as e:
                    print(f"check FAIL {short(cfg)} M={m} N={n} K={k} {fmt}: {type(e).__name__}: {str(e)[:200]}")

    rows, best = [], {}
    fcsv = open(os.path.join(a.out, "prefill_bench.csv"), "w", newline="")
    wr = csv.DictWriter(fcsv, ["device", "harness", "M", "N", "K", "provider", "config", "us_p20", "us_p50",
                               "us_p80", "tflops", "ratio_cublas", "rel_err"])
    wr.writeheader()
    for m in ms:
        for n, k in SHAPES:
            if time.time() - t0 > a.budget_s:
                print(f"budget spent: skipping M={m} N={n} K={k}", flush=True)
                continue
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w0 = (torch.randn(n, k, device=dev) / k**0.5).to(torch.bfloat16)
            ref = x.float() @ w0.float().T
            copies = copies_needed(n * k * 2, dev)
            ws = [w0.clone() for _ in range(copies)]
            ys = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
            provs = [("cublas", None)] + [("tiled", tiled[(m, n, k)])] + [("persistent", c) for c in cands]
            cub = None
            for prov, cfg in provs:
                err = float("nan")
                try:
                    if cfg is not None:
                        rec.cfg = cfg
                        y = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
                        launcher.linear(x, w0, config=cfg, out=y)
                        torch.cuda.synchronize()
                        err = ((y.float() - ref).norm() / ref.norm()).item()
                        if not err < 1e-2:           # NaN fails too
                            raise RuntimeError(f"rel err {err:.3g}")
                        calls = [lambda w=w, y=y_, c=cfg: launcher.linear(x, w, config=c, out=y) for w, y_ in zip(ws, ys)]
                    else:
                        calls = [lambda w=w: torch.nn.functional.linear(x, w) for w in ws]
                    t = graph_time(calls, rep_ms=12, warmup_ms=3)
                    if cfg is not None:              # after many graph replays: still right (counters reset)
                        g = max(((y_.float() - ref).norm() / ref.norm()).item() for y_ in (ys[0], ys[-1]))
                        if not g < 1e-2:
                            raise RuntimeError(f"rel err {g:.3g} after graph replays")
                except Exception as e:
                    print(f"FAIL M={m} N={n} K={k} {prov} {short(cfg) if cfg else ''}: {type(e).__name__}: "
                          f"{str(e)[:200]}", flush=True)
                    continue
                if prov == "cublas":
                    cub = t.us_p50
                row = {"device": name, "harness": HARNESS, "M": m, "N": n, "K": k, "provider": prov,
                       "config": cfg.to_dict() if cfg else "", "us_p20": round(t.us_p20, 2),
                       "us_p50": round(t.us_p50, 2), "us_p80": round(t.us_p80, 2),
                       "tflops": round(2 * m * n * k / t.us_p50 / 1e6, 1),
                       "ratio_cublas": round(cub / t.us_p50, 3) if cub else "", "rel_err": f"{err:.2e}"}
                wr.writerow(row)
                fcsv.flush()
                rows.append((m, n, k, prov, cfg, t.us_p50))
            del ws, ys, x, w0, ref
            torch.cuda.empty_cache()
    fcsv.close()
    launcher.launch = orig

    res = []
    for cfg, ck in compiled.items():
        if cfg is None:                     # launched by the format checks above
            continue
        try:
            res.append({"config": short(cfg), "n_regs": ck.n_regs, "n_spills": ck.n_spills,
                        "shared": ck.metadata.shared, "num_warps": ck.metadata.num_warps,
                        "num_stages": ck.metadata.num_stages})
        except Exception as e:
            res.append({"config": short(cfg), "n_regs": f"{type(e).__name__}: {e}"[:100]})
    with open(os.path.join(a.out, "prefill_resources.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, ["config", "n_regs", "n_spills", "shared", "num_warps", "num_stages"])
        wr.writeheader()
        wr.writerows(res)

    # per-config worst ratio over the points (which single config is safest), then the per-point table
    by_pt = {}
    for m, n, k, prov, cfg, us in rows:
        by_pt.setdefault((m, n, k), {})[(prov, cfg)] = us
    worst = {}
    for pt, d in by_pt.items():
        cub = d.get(("cublas", None))
        for (prov, cfg), us in d.items():
            if prov == "persistent" and cub:
                worst.setdefault(cfg, []).append(cub / us)
    print("\nper persistent config: min / geomean ratio to cuBLAS over the points")
    for cfg, rs in sorted(worst.items(), key=lambda kv: -min(kv[1])):
        print(f"  {short(cfg):44s} min {min(rs):.3f} geo {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} n={len(rs)}")
    print("\nresources:")
    for r in res:
        print("  ", r)
    print(f"\n{'M':>5} {'N':>5} {'K':>5} | {'cuBLAS us':>9} {'TF/s':>5} | {'tiled us':>8} {'x':>5} | "
          f"{'pers us':>8} {'TF/s':>5} {'x':>5} | best persistent config")
    for (m, n, k), d in by_pt.items():
        cub = d.get(("cublas", None), math.nan)
        til = next((us for (p, c), us in d.items() if p == "tiled"), math.nan)
        pers = [(us, c) for (p, c), us in d.items() if p == "persistent"]
        bu, bc = min(pers, key=lambda t: t[0]) if pers else (math.nan, None)
        fl = 2 * m * n * k / 1e6
        print(f"{m:5d} {n:5d} {k:5d} | {cub:9.1f} {fl / cub:5.0f} | {til:8.1f} {cub / til:5.2f} | "
              f"{bu:8.1f} {fl / bu:5.0f} {cub / bu:5.2f} | {short(bc) if bc else '-'}")
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
