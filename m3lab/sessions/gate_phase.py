"""The gate phase of a GPU session: correctness gates on the GPU, written to ``gates_cuda.csv`` and logged."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..gates.runner import run_gates


def gate_phase(outdir: Path, names: list[str], log, phase: str | None = None) -> pd.DataFrame | None:
    """Run the gates matching ``names`` on cuda into ``OUT/gates_cuda.csv`` (column ``phase`` first when given);
    log the summary and every failure or finding. A failure to run is logged -> None."""
    try:
        df = run_gates("cuda", names=list(names))
    except Exception as err:   # a session keeps going: the log says what failed
        log(f"gates failed to run: {type(err).__name__}: {str(err)[:500]}")
        return None
    if phase:
        df.insert(0, "phase", phase)
    df.to_csv(Path(outdir) / "gates_cuda.csv", index=False)
    log(f"gates: {int(df['passed'].sum())}/{len(df)} passed")
    for _, r in df[~df["passed"].astype(bool) | (df["detail"].astype(str) != "")].iterrows():
        log(f"  {'ok  ' if r['passed'] else 'FAIL'} {r['gate']} {r['case']} {r['value']} {str(r['detail'])[:300]}")
    return df
