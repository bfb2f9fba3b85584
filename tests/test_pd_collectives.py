"""The collectives table: reading it back, interpolation, the cost-model hook, and the measurement script's
command line (the measurement itself needs two GPUs)."""
import numpy as np
import pandas as pd
import pytest

from m3lab.bench.table import BenchRow, append_rows
from m3lab.cost import collective_time as ct
from m3lab.spec.hardware import load_hardware
from m3lab.spec.serving import make_deployment


def _table(tmp_path):
    rows = [BenchRow("allreduce", "nccl", f"T={t},H=6144,world=2", "bf16", us * 0.9, us, us * 1.1, 0.0, 0.1, 0.2,
                     "link_tbps=0.45", "NVIDIA_H200", "abc1234", "2026-11-30")
            for t, us in ((1, 10.0), (64, 12.0), (8192, 300.0))]
    rows.append(BenchRow("p2p_kv", "nccl-eager", "blocks=1024,block_bytes=65536,world=2", "uint8", 1, 200.0, 1,
                         0.0, 0.3, 0.7, "link_tbps=0.45", "NVIDIA_H200", "abc1234", "2026-11-30"))
    path = append_rows(tmp_path / "collectives.csv", rows)
    return ct.load_table(path)


def test_interpolation_and_labels(tmp_path):
    t = _table(tmp_path)
    h200, mi355x = load_hardware("h200"), load_hardware("mi355x")
    b = lambda tok: tok * 6144 * 2  # noqa: E731
    assert ct.allreduce_us(b(64), 2, h200, t) == pytest.approx(12.0)
    assert 12.0 < ct.allreduce_us(b(1024), 2, h200, t) < 300.0
    assert ct.allreduce_us(b(16384), 2, h200, t) == pytest.approx(600.0)
    assert ct.allreduce_us(b(64), 4, h200, t) is None          # larger groups: not measured
    assert ct.allreduce_us(b(64), 2, mi355x, t) is None        # other hardware: not measured
    assert ct.p2p_bandwidth(h200, table=t) == pytest.approx(1024 * 65536 / 200e-6)
    assert "measured" in ct.comm_label(h200, table=t) and "uncalibrated" in ct.comm_label(mi355x, table=t)


def test_cost_hook_replaces_only_measured_allreduces(tmp_path):
    t = _table(tmp_path)
    cols = {"kind": np.array(["allreduce", "allreduce", "gemm"], dtype=object),
            "comm_payload": np.array([64 * 6144 * 2, 64 * 6144 * 2, np.nan]),
            "comm_group": np.array([2, 8, np.nan])}
    out = ct.measured_comm_us(cols, load_hardware("h200"), np.array([1.0, 2.0, 3.0]), t)
    assert out.tolist() == [12.0, 2.0, 3.0]


def test_no_table_leaves_the_cost_model_alone(tmp_path):
    assert ct.load_table(tmp_path / "missing.csv") is None
    assert ct.allreduce_us(1e6, 2, load_hardware("h200"), pd.DataFrame()) is None


def test_measurement_script_refuses_without_gpus():
    from m3lab.bench import collectives
    from m3lab.errors import M3LabError
    with pytest.raises(M3LabError, match="need 2 GPUs"):
        collectives.run(out="/dev/null")


def test_the_committed_h200_table_times_the_cost_models_allreduces():
    """traces/bench/collectives.csv (two NVLink H200s) is committed, and a calibrated H200 TP2 step's all-reduces
    take its measured time, not the bound; TP4 groups were not measured and keep the bound."""
    import dataclasses

    from m3lab.cost.calibration import load_calibration
    from m3lab.serving.step_cost import cost_step
    from m3lab.workload.step import EngineStep

    table = ct.load_table()
    assert table is not None and set(table["op"]) >= {"allreduce", "p2p_kv"}
    assert (table["device"] == "NVIDIA_H200").all() and set(table["world"]) == {2}
    h200 = load_hardware("h200")
    cal = dataclasses.replace(load_calibration("aiter-mi355x", "mi355x"), hardware="h200")  # any fitted calibration
    for tp, measured in ((2, True), (4, False)):
        dep = make_deployment(None, model="minimax-m3", hardware=h200.name, tp=tp, quant="mxfp8")
        df = cost_step(dep, EngineStep.decode(8, 4096), calibration=cal)
        ar = df[df["kind"] == "allreduce"]
        assert len(ar)
        want = [ct.allreduce_us(p, int(g), h200, table) for p, g in zip(ar["comm_payload"], ar["comm_group"])]
        if measured:
            assert all(w is not None for w in want)
            np.testing.assert_allclose(ar["t_us"].to_numpy(), np.array(want, dtype=float))
        else:
            assert all(w is None for w in want)
