"""Summarise notes/prefill/prefill_bench*.csv: per point cuBLAS, tiled, the best persistent config; per config
its worst and geomean ratio to cuBLAS.  python notes/prefill/summarize.py notes/prefill/prefill_bench.csv"""
import ast
import csv
import math
import sys


def short(c: dict) -> str:
    s = f"{c['kernel'][:4]} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']}s{c['num_stages']}"
    if c["kernel"] == "persistent":
        s += f" sk{c['SPLIT_K']}" + (" fl" if c.get("FLATTEN") else "") + (" ws" if c.get("WARP_SPECIALIZE") else "")
        s += " ptr" if c.get("USE_TMA") is False else ""
    return s


def main(path: str) -> None:
    rows = list(csv.DictReader(open(path)))
    pts, per_cfg = {}, {}
    for r in rows:
        pt = (int(r["M"]), int(r["N"]), int(r["K"]))
        d = pts.setdefault(pt, {"pers": []})
        us = float(r["us_p50"])
        if r["provider"] == "cublas":
            d["cublas"] = us
        elif r["provider"] == "tiled":
            d["tiled"] = (us, short(ast.literal_eval(r["config"])))
        else:
            name = short(ast.literal_eval(r["config"]))
            d["pers"].append((us, name))
    for pt, d in pts.items():
        for us, name in d["pers"]:
            per_cfg.setdefault(name, []).append(d["cublas"] / us)
    print("per persistent config: worst / geomean ratio to cuBLAS")
    for name, rs in sorted(per_cfg.items(), key=lambda kv: -min(kv[1])):
        print(f"  {name:40s} worst {min(rs):.3f} geomean {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} n={len(rs)}")
    print(f"\n{'M':>5} {'N':>5} {'K':>5} | {'cuBLAS us':>9} {'TF/s':>4} | {'tiled us':>8} {'x':>5} | "
          f"{'pers us':>7} {'TF/s':>4} {'x':>5} | best persistent config")
    for (m, n, k), d in pts.items():
        fl = 2 * m * n * k / 1e6
        bu, bc = min(d["pers"])
        print(f"{m:5d} {n:5d} {k:5d} | {d['cublas']:9.1f} {fl / d['cublas']:4.0f} | {d['tiled'][0]:8.1f} "
              f"{d['cublas'] / d['tiled'][0]:5.2f} | {bu:7.1f} {fl / bu:4.0f} {d['cublas'] / bu:5.2f} | {bc}")


if __name__ == "__main__":
    main(sys.argv[1])
