"""Run the correctness gates: every registered kernel against its reference.

Result columns: gate, case, kind (correctness | perf), device, dtype, metric (rel_rms |
mismatch | regression), value, limit, passed, detail. The whole run passes iff every row passes. The perf gates
(kind perf, metric regression) re-time benchmark rows: :func:`m3lab.bench.perf_gate.run_gates` runs both.
"""
import fnmatch
import math
import os
from pathlib import Path

import pandas as pd
import torch

from ..errors import M3LabError
from ..kernels.gemm.tables import device_name
from ..provenance import TRACES_DIR
from . import checks
from .registry import all_gates

TRACES_GATES = TRACES_DIR / "gates"   # recorded gate results, perf baselines
RESULT_COLUMNS = ("gate", "case", "kind", "device", "dtype", "metric", "value", "limit", "passed", "detail")


def check_device(device: str) -> None:
    """Raise M3LabError unless ``device`` is 'cpu', or 'cuda' with a GPU visible."""
    if device not in ("cpu", "cuda"):
        raise M3LabError(f"device: {device!r} is not 'cpu' or 'cuda'", field="device")
    if device == "cuda" and not torch.cuda.is_available():
        raise M3LabError("device: cuda requested but no GPU is visible (use the cpu device)", field="device")


def prepare(device: str) -> torch.device:
    """cpu: the Triton interpreter (must be on before the kernels are imported); cuda: a GPU."""
    check_device(device)
    if device == "cuda":
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise M3LabError("device: cuda with TRITON_INTERPRET=1 set (unset it)", field="device")
        return torch.device("cuda")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from ..kernels.gemm import gemm_tiled  # local: pulls in triton (its kernels need TRITON_INTERPRET set first)
    if type(gemm_tiled.gemm_tiled_kernel).__name__ != "InterpretedFunction":
        raise M3LabError("device: cpu gates need the Triton interpreter, but the kernels were imported "
                         "without it (set TRITON_INTERPRET=1 before starting)", field="device")
    return torch.device("cpu")


def correctness_results(device: torch.device, names: list[str] | None = None, progress=None) -> list[dict]:
    """``progress(done, total, gate_name)``, when given, is called before each gate runs."""
    out = []
    gates = [g for g in all_gates().values() if not names or any(fnmatch.fnmatch(g.name, p) for p in names)]
    for done, gate in enumerate(gates):
        if progress is not None:
            progress(done, len(gates), gate.name)
        for case in gate.cases(device):
            metric = "mismatch" if case.exact else "rel_rms"
            limit = 0.0 if case.exact else checks.TOLERANCES[case.dtype]
            res = {"gate": gate.name, "case": case.name, "kind": "correctness", "dtype": case.dtype,
                   "metric": metric, "limit": limit}
            try:
                got, ref = case.run()
                value = checks.mismatch_fraction(got, ref) if case.exact else checks.rel_rms(got, ref)
                detail = "NaN in output (unwritten or invalid)" if math.isnan(value) else ""
                if case.finding is not None and not detail:
                    detail = "finding: " + case.finding()
            except Exception as err:   # a crashing kernel fails its gate, the others still run
                value, detail = math.nan, f"{type(err).__name__}: {str(err)[:200]}"
            out.append({**res, "value": value, "passed": checks.passes(value, limit), "detail": detail})
    return out


def run_gates(device: str = "cpu", names: list[str] | None = None, perf: bool = False,
              progress=None) -> pd.DataFrame:
    """All correctness gates on ``device`` -> results DataFrame (see module doc). ``names``: fnmatch patterns;
    ``progress(done, total, gate_name)``: called before each gate. ``perf=True`` is refused: the perf gates re-time
    benchmarks and run through :func:`m3lab.bench.perf_gate.run_gates`."""
    if perf:
        raise M3LabError("perf: the performance gates run through m3lab.bench.perf_gate.run_gates", field="perf")
    dev = prepare(device)
    rows = correctness_results(dev, names, progress)
    df = pd.DataFrame(rows, columns=[c for c in RESULT_COLUMNS if c != "device"])
    df.insert(3, "device", device_name(dev))      # "cpu" or the GPU's name, e.g. NVIDIA_H200
    return df


def summary(df: pd.DataFrame) -> dict:
    """{passed: bool, cases, failed, failures: [...]} for the CLI's --json and exit code."""
    failed = df[~df["passed"].astype(bool)]
    return {"passed": bool(len(df)) and failed.empty, "cases": len(df), "failed": len(failed),
            "failures": failed[["gate", "case", "value", "limit", "detail"]].to_dict("records")}


def recorded_results(device_name: str = "NVIDIA_H200") -> pd.DataFrame:
    """Gate results recorded on a GPU and committed (traces/gates/gates_cuda_<device>.csv; column ``phase``:
    before_tune / after_tune / perf_recheck of a GEMM tuning session, gemm_session of ``m3lab.sessions.gemm``,
    gemm_all_gates for ``m3lab gate --device cuda`` on the GEMM, MX and perf gates, or all_gates for every gate;
    ``commit`` and ``date`` say what ran when)."""
    path = TRACES_GATES / f"gates_cuda_{device_name}.csv"
    if not path.exists():
        raise M3LabError(f"device_name: no recorded gate results at {path}", field="device_name")
    return pd.read_csv(path)
