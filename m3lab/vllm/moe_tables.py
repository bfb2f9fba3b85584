"""Fused-MoE launch tables in vLLM's file format, compared by shape and device.

vLLM ships tuned Triton launch parameters for its fused-MoE kernel in
``vllm/model_executor/layers/fused_moe/configs/``, one JSON file per shape and device, named
``E={experts},N={intermediate per shard},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]][,backend={b}].json``
and holding ``{"<M>": {"BLOCK_SIZE_M": .., "BLOCK_SIZE_N": .., "BLOCK_SIZE_K": .., "GROUP_SIZE_M": ..,
"num_warps": .., "num_stages": ..}, ...}`` keyed by token count M (AMD files add ``waves_per_eu``, ...).
At run time vLLM takes the entry whose M is nearest the batch's (``try_get_optimal_moe_config`` in
``fused_moe/fused_moe.py``); without a file for the shape and device it falls back to ``get_default_config``.

:func:`compare_tables` accepts any two folders of such files (m3lab's tuner writes its own in the same format)
and says, per shape and device: which side has a table, which M each covers, and at each of our M whether the
entry vLLM would pick (nearest M) has the same tile configuration.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from m3lab.errors import M3LabError
from m3lab.kernels.moe.tables import read_vllm_table
from m3lab.kernels.nearest import nearest_key
from m3lab.provenance import KERNELS_DIR
from m3lab.vllm_src import install

NAME = re.compile(r"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]+?)(?:,dtype=(?P<dtype>[^,]+?))?"
                  r"(?:,block_shape=\[(?P<bn>\d+),\s*(?P<bk>\d+)\])?(?:,backend=(?P<backend>[^,]+?))?\.json$")
SHAPE_KEYS = ("E", "N", "dtype", "block_shape", "backend")
TILE_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def shipped_dir() -> Path:
    """The installed vLLM's shipped tables (found without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        install.require("comparing with vLLM's shipped fused-MoE tables")
    return Path(list(spec.submodule_search_locations)[0]) / "model_executor" / "layers" / "fused_moe" / "configs"


def our_tables_dir() -> Path:
    """m3lab's own tuned tables (``kernels/moe/configs`` of the checkout)."""
    return KERNELS_DIR / "moe" / "configs"


def parse_name(name: str) -> dict[str, Any] | None:
    """The shape and device a table's file name encodes, or None when the name is not vLLM's pattern."""
    m = NAME.match(name)
    if m is None or "." in m.group("device"):  # vLLM's device names have no dot; NAME.<tool>.json is another format
        return None
    g = m.groupdict()
    return {"E": int(g["E"]), "N": int(g["N"]), "device": g["device"], "dtype": g["dtype"] or "",
            "block_shape": f"[{g['bn']},{g['bk']}]" if g["bn"] else "", "backend": g["backend"] or ""}


def read_table(path: str | Path) -> dict[int, dict[str, Any]]:
    """``{M: config}`` of one table file, read by the kernels' reader (:func:`m3lab.kernels.moe.tables.read_vllm_table`:
    ``triton_version`` dropped as vLLM drops it, any other key that is not a token count refused)."""
    p = Path(path)
    try:
        return read_vllm_table(p)
    except json.JSONDecodeError as err:
        raise M3LabError(f"{p}: not a readable JSON table ({err.__class__.__name__})", field="path") from None
    except (OSError, ValueError) as err:
        raise M3LabError(str(err) if isinstance(err, ValueError) else f"{p}: not readable ({err.__class__.__name__})",
                         field="path") from None


def read_folder(folder: str | Path) -> dict[tuple, tuple[Path, dict[int, dict[str, Any]]]]:
    """``{(E, N, dtype, block_shape, backend, device): (file, table)}`` for every vLLM-named table in ``folder``."""
    root = Path(folder)
    if not root.is_dir():
        raise M3LabError(f"{str(root)!r} is not a folder of fused-MoE tables", field="folder",
                         hint="give a folder of E=..,N=..,device_name=...json files")
    out = {}
    for p in sorted(root.glob("*.json")):
        meta = parse_name(p.name)
        if meta is not None:
            out[tuple(meta[k] for k in SHAPE_KEYS) + (meta["device"],)] = (p, read_table(p))
    return out


def nearest(table: dict[int, dict[str, Any]], m: int) -> int:
    """The M whose entry vLLM uses for a batch of ``m`` tokens (:func:`m3lab.kernels.nearest.nearest_key`)."""
    return nearest_key(table, m)


def _tile(cfg: dict[str, Any]) -> tuple:
    return tuple(cfg.get(k) for k in TILE_KEYS)


def compare_tables(ours: str | Path, theirs: str | Path | None = None, *, every_table: bool = False):
    """One row per (shape, device) of ``ours`` (with ``every_table``: of either folder), against ``theirs``
    (default: vLLM's shipped tables).

    Columns: the shape (E, N, dtype, block_shape, backend), device, ``ours``/``theirs`` file names, ``m_ours``
    and ``m_theirs`` (the token counts each covers), ``same_tile`` / ``compared`` (at each of our M, whether
    vLLM's nearest-M entry has our tile configuration), ``differs`` (the first differing M with both tiles),
    and ``theirs_other_devices`` (devices that have a table of this shape on the other side)."""
    import pandas as pd

    a = read_folder(ours)
    b = read_folder(theirs if theirs is not None else shipped_dir())
    for folder, found, field in ((ours, a, "ours"), (theirs or "vLLM's shipped tables", b, "against")):
        if not found:
            raise M3LabError(f"{folder}: no fused-MoE table (E=..,N=..,device_name=...json) in it", field=field,
                             hint="give a folder of vLLM-format tables")
    rows = []
    keys = set(a) | set(b) if every_table else set(a)
    for key in sorted(keys, key=lambda k: tuple(str(x) for x in k)):
        shape, device = key[:-1], key[-1]
        fa, ta = a.get(key, (None, {}))
        fb, tb = b.get(key, (None, {}))
        same = compared = 0
        differs = ""
        if ta and tb:
            for m in sorted(ta):
                compared += 1
                mb = nearest(tb, m)
                if _tile(ta[m]) == _tile(tb[mb]):
                    same += 1
                elif not differs:
                    differs = f"M={m}: ours {dict(zip(TILE_KEYS, _tile(ta[m])))} vs theirs (M={mb}) " \
                              f"{dict(zip(TILE_KEYS, _tile(tb[mb])))}"
        others = sorted(k[-1] for k in b if k[:-1] == shape and k[-1] != device)
        rows.append({**dict(zip(SHAPE_KEYS, shape)), "device": device, "ours": fa.name if fa else None,
                     "theirs": fb.name if fb else None, "m_ours": sorted(ta), "m_theirs": sorted(tb),
                     "compared": compared, "same_tile": same, "differs": differs,
                     "theirs_other_devices": others})
    return pd.DataFrame(rows, columns=[*SHAPE_KEYS, "device", "ours", "theirs", "m_ours", "m_theirs", "compared",
                                       "same_tile", "differs", "theirs_other_devices"])


def finding(table) -> str:
    """One sentence on what :func:`compare_tables` found: tables vLLM lacks (it then falls back to its default
    config at run time), and how many of the compared M values use the same tile."""
    if not len(table):
        return "No table to compare."
    lacking = table[table["theirs"].isna()]
    compared, same = int(table["compared"].sum()), int(table["same_tile"].sum())
    parts = []
    if len(lacking):
        names = ", ".join(f"E={r.E},N={r.N} on {r.device}" for r in lacking.itertuples())
        parts.append(f"the other side has no table for {len(lacking)} of {len(table)} shapes ({names}), so vLLM "
                     f"would use its default config there")
    if compared:
        parts.append(f"{same} of the {compared} M values compared use the same tile")
    text = "; ".join(parts) or "every table has a counterpart and nothing to compare"
    return text[0].upper() + text[1:] + "."
