"""AITER dispatch log lines -> a table of (op, shape key, chosen kernels).

Lines read (anywhere in a server log; prefixes such as ``(Worker_TP0 pid=1) [aiter]`` are ignored):

- fused MoE (aiter/fused_moe.py)::

    [fused_moe] using 2stage (kernelName1='…', kernelName2='…') for ('gfx950', 256, 512, 6144, 512,
        129, 5, 'ActivationType.Swiglu', 'torch.bfloat16', …, True, False)
    [fused_moe] using 1stage default for (…)            # no tuned row: heuristic kernels
    [fused_moe] no tuned FlyDSL config for (…), using heuristic FlyDSL fallback (kn1='…', kn2='…')

  key fields: [gfx,] cu_num, token, model_dim, inter_dim, expert, topk, act_type, dtype, q_dtype_a,
  q_dtype_w, q_type, use_g1u1, doweight_stage1.
- tuned GEMMs (aiter/tuned_gemm.py, aiter/ops/gemm_op_*.py, with AITER_LOG_TUNED_CONFIG=1 for hits)::

    shape is M:64, N:6144, K:3072 dtype='torch.bfloat16' … found padded_M: 64, N:6144, K:3072 is
        tuned on cu_num = 256 in …/bf16_tuned_gemm.csv, libtype is asm, kernel name is <name>
    shape is M:1024, N:151936, K:5120 … not found tuned config in …/bf16_tuned_gemm.csv, will use
        default config! using torch solution:0

Columns: line, op (``fused_moe`` | ``gemm``), variant (1stage / 2stage / flydsl_fallback, or the GEMM
config file's stem), tuned (bool), kernels (list[str], empty when the log names none), key (the raw
shape text), m, n, k (MoE: token, inter_dim, model_dim), experts, topk, cu_num, gfx, libtype.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.files import iter_lines

COLUMNS = ("line", "op", "variant", "tuned", "kernels", "key", "m", "n", "k", "experts", "topk",
           "cu_num", "gfx", "libtype")
MOE_KEY_FIELDS = ("cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype",
                  "q_dtype_a", "q_dtype_w", "q_type", "use_g1u1", "doweight_stage1")

_MOE = re.compile(r"\[fused_moe\] using (?P<variant>1stage|2stage)(?P<xbf16> xbf16)? "
                  r"(?P<tag>default|\(.*\)) for (?P<key>\(.*\))")
_MOE_OLD = re.compile(r"\[fused_moe\] using (?P<tag>\S+) for (?P<key>\(.*\))")
_FLYDSL = re.compile(r"\[fused_moe\] no tuned FlyDSL config for (?P<key>\(.*?\)), using heuristic "
                     r"FlyDSL fallback \((?P<tag>.*)\)")
_KERNEL_ARG = re.compile(r"(?:kernelName\d|kn\d)\s*=\s*(?:'(?P<q>[^']*)'|\"(?P<dq>[^\"]*)\"|(?P<bare>[^,\s)]+))")
_GEMM = re.compile(r"shape is (?:B:(?P<b>\d+), )?M:(?P<m>\d+), N:(?P<n>\d+), K:(?P<k>\d+)(?P<rest>.*)")


def _split_tuple(text: str) -> list[str]:
    """``('gfx950', 256, <ActivationType.Silu: 0>, 'torch.bfloat16')`` -> cleaned items."""
    inner = text.strip()[1:-1]
    items, depth, cur = [], 0, []
    for ch in inner:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        items.append("".join(cur))
    out = []
    for item in items:
        s = item.strip().strip("'\"")
        m = re.fullmatch(r"<([\w.]+): -?\d+>", s)
        out.append(m.group(1) if m else s)
    return [s for s in out if s]


def _num(value: str | None) -> int | None:
    return int(value) if value is not None and re.fullmatch(r"-?\d+", value) else None


def moe_key(text: str) -> dict[str, Any]:
    """Name the fields of a fused-MoE key tuple (with or without the leading gfx)."""
    items = _split_tuple(text)
    out: dict[str, Any] = {}
    if items and items[0].startswith("gfx"):
        out["gfx"] = items.pop(0)
    out.update(zip(MOE_KEY_FIELDS, items))
    return out


def _kernel_names(tag: str) -> list[str]:
    names = []
    for m in _KERNEL_ARG.finditer(tag):
        name = m.group("q") or m.group("dq") or m.group("bare")
        if name and name != "None":
            names.append(name)
    return names


def _moe_row(variant: str, tag: str, key: str, tuned: bool) -> dict[str, Any]:
    fields = moe_key(key)
    return {"op": "fused_moe", "variant": variant, "tuned": tuned, "kernels": _kernel_names(tag),
            "key": key, "m": _num(fields.get("token")), "n": _num(fields.get("inter_dim")),
            "k": _num(fields.get("model_dim")), "experts": _num(fields.get("expert")),
            "topk": _num(fields.get("topk")), "cu_num": _num(fields.get("cu_num")),
            "gfx": fields.get("gfx")}


def _gemm_row(m: re.Match) -> dict[str, Any]:
    rest = m.group("rest")
    tuned = "is tuned on cu_num" in rest
    cfg = re.search(r"(?:tuned config)? in (\S+?)\s*,", rest) or re.search(r"listed in (\S+?),", rest)
    cu = re.search(r"cu_num = (\d+)", rest)
    lib = re.search(r"libtype is (\w+)", rest) or re.search(r"using (\w+) solution", rest)
    kernel = re.search(r"kernel name is ([^,!\s]+)", rest)
    variant = Path(cfg.group(1)).stem if cfg else "gemm"
    return {"op": "gemm", "variant": variant, "tuned": tuned, "kernels": [kernel.group(1)] if kernel else [],
            "key": m.group(0)[: m.start("rest") - m.start()], "m": int(m.group("m")),
            "n": int(m.group("n")), "k": int(m.group("k")), "experts": None, "topk": None,
            "cu_num": int(cu.group(1)) if cu else None, "gfx": None,
            "libtype": lib.group(1) if lib else None}


def parse_aiter_line(line: str) -> dict[str, Any] | None:
    """One log line -> a row dict (without ``line``), or None when it is not a dispatch line."""
    if m := _MOE.search(line):
        variant = m.group("variant") + (" xbf16" if m.group("xbf16") else "")
        return _moe_row(variant, m.group("tag"), m.group("key"), m.group("tag") != "default")
    if m := _FLYDSL.search(line):
        return _moe_row("flydsl_fallback", m.group("tag"), m.group("key"), False)
    if m := _MOE_OLD.search(line):
        tag = m.group("tag")
        row = _moe_row("tag", "", m.group("key"), tag != "default")
        row["kernels"] = [] if tag == "default" else [tag]
        return row
    if m := _GEMM.search(line):
        return _gemm_row(m)
    return None


def read_aiter_log(path: str | Path) -> pd.DataFrame:
    """Read the AITER dispatch lines of a log file (gzip or plain) into the table described above."""
    path = Path(path)
    rows = []
    for number, line in iter_lines(path):
        row = parse_aiter_line(line)
        if row is not None:
            rows.append({"line": number, **row})
    if not rows:
        raise M3LabError(f"{path}: no AITER dispatch lines found", field="TRACE",
                         hint="run with AITER_LOG_LEVEL=INFO (and AITER_LOG_TUNED_CONFIG=1 for tuned GEMMs)")
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df.attrs.update({"format": "aiter-log", "source": str(path)})
    return df


def summarize_aiter_log(log: pd.DataFrame) -> pd.DataFrame:
    """Per (op, variant, tuned, kernels): calls and distinct shape keys; untuned (default) first."""
    cols = ["op", "variant", "tuned", "kernels", "calls", "shapes"]
    if log.empty:
        return pd.DataFrame(columns=cols)
    df = log.assign(kernels=log["kernels"].map(", ".join))
    out = (df.groupby(["op", "variant", "tuned", "kernels"], sort=False)
             .agg(calls=("line", "size"), shapes=("key", "nunique")).reset_index())
    return out.sort_values(["tuned", "calls"], ascending=[True, False], kind="stable").reset_index(drop=True)[cols]
