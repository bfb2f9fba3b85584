"""Gates: `m3lab gate --device cpu` passes; perturbed kernels (scaled, unwritten, NaN, a flipped code)
make it fail; NaN never passes; perf gates fail on a regression over the threshold; new gates plug in."""
import json
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from m3lab.errors import M3LabError  # noqa: E402
from m3lab.bench import perf_gate as perf  # noqa: E402
from m3lab.bench.perf_gate import run_gates  # noqa: E402
from m3lab.gates import Case, Gate, checks, register  # noqa: E402
from m3lab.gates.runner import summary  # noqa: E402
from m3lab.kernels.gemm import launcher  # noqa: E402
from m3lab.kernels.mx import triton_mx  # noqa: E402


@pytest.mark.slow
def test_cpu_gates_pass():
    df = run_gates("cpu", names=["gemm.mxfp4", "gemm.bf16", "mx.*"])
    assert len(df) > 20 and df["passed"].all(), df[~df["passed"]]
    assert set(df["kind"]) == {"correctness"}        # no perf rows without a cpu baseline


@pytest.mark.slow
def test_cli_gate_exit_codes(monkeypatch):
    from m3lab.cli.main import app
    runner = CliRunner()
    ok = runner.invoke(app, ["gate", "--device", "cpu", "--only", "gemm.fp8", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["passed"] is True
    real = launcher.linear
    monkeypatch.setattr(launcher, "linear", lambda *a, **k: real(*a, **k).mul_(1.03))
    bad = runner.invoke(app, ["gate", "--device", "cpu", "--only", "gemm.fp8", "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.output)["failed"] > 0
    assert runner.invoke(app, ["gate", "--device", "tpu"]).exit_code == 2


def _perturbed(kind):
    real = launcher.linear

    def linear(x, w, *, out=None, **kw):
        y = real(x, w, out=out, **kw)
        if kind == "scaled":
            y.mul_(1.03)                              # 3% off: over every tolerance
        elif kind == "unwritten":
            y[-1] = float("nan") if out is not None else y[-1]   # the poisoned last row left alone
        elif kind == "nan":
            y[0, 0] = float("nan")
        return y
    return linear


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["scaled", "unwritten", "nan"])
def test_perturbed_gemm_kernel_fails(monkeypatch, kind):
    monkeypatch.setattr(launcher, "linear", _perturbed(kind))
    df = run_gates("cpu", names=["gemm.mxfp8"])
    assert not df["passed"].any()
    assert not summary(df)["passed"]


def test_perturbed_quant_kernel_fails(monkeypatch):
    real = triton_mx.quantize

    def quantize(x, fmt, out=None):
        q, s = real(x, fmt, out=out)
        q.view(torch.uint8).view(-1)[5] ^= 1          # one element code off by one ulp
        return q, s
    monkeypatch.setattr(triton_mx, "quantize", quantize)
    df = run_gates("cpu", names=["mx.quant_mxfp8"])
    codes = df[df["case"].str.endswith("codes")]
    assert not codes["passed"].any() and df[df["case"].str.endswith("scales")]["passed"].all()


def test_checks_nan_never_passes_and_poison():
    a = torch.randn(8, 8)
    assert checks.rel_rms(a, a) == 0.0
    b = a.clone()
    b[3, 3] = float("nan")
    assert math.isnan(checks.rel_rms(b, a)) and not checks.passes(checks.rel_rms(b, a), 1.0)
    assert torch.isnan(checks.poison_(torch.empty(3, dtype=torch.bfloat16))).all()
    q = checks.poison_(torch.empty(4, dtype=torch.float8_e4m3fn))
    assert torch.isnan(q.float()).all()
    assert (checks.poison_(torch.empty(4, dtype=torch.uint8)) == 0xFF).all()
    assert checks.TOLERANCES["float16"] < checks.TOLERANCES["bfloat16"]


def test_perf_gate_threshold():
    base = pd.DataFrame([{"op": "gemm", "provider": "triton", "shape": "M=1,N=64,K=64", "dtype": "bf16",
                          "us_p50": 10.0}] * 2)
    from m3lab.bench.timing import Timing

    def timer(us):
        return {"gemm": lambda row: Timing(us, us, us)}
    assert all(r["passed"] for r in perf.perf_results(base, 0.10, timer(10.9)))
    slow = perf.perf_results(base, 0.10, timer(11.5))
    assert not any(r["passed"] for r in slow) and slow[0]["value"] == pytest.approx(0.15)
    assert all(r["passed"] for r in perf.perf_results(base, 0.20, timer(11.5)))     # configurable
    assert not perf.perf_results(base, 0.10, {})[0]["passed"]                        # no timer: fail
    once = iter([11.5, 10.5, 11.5, 10.5])                                            # a slow first timing only
    flaky = perf.perf_results(base, 0.10, {"gemm": lambda row: Timing(*(next(once),) * 3)})
    assert all(r["passed"] for r in flaky) and "re-measured" in flaky[0]["detail"]


def test_a_new_gate_plugs_in():
    def cases(device):
        x = torch.randn(16)
        yield Case("ok", "float32", lambda: (x * 2, x + x))
        yield Case("bad", "float32", lambda: (x * 2.1, x + x))
    register(Gate("custom.double", "custom", cases))
    df = run_gates("cpu", names=["custom.*"])
    assert df.set_index("case")["passed"].to_dict() == {"ok": True, "bad": False}


def test_bad_input():
    with pytest.raises(M3LabError, match="device"):
        run_gates("tpu")
    with pytest.raises(M3LabError, match="threshold"):
        run_gates("cpu", names=["nothing"], threshold=-1)


def test_committed_gpu_gate_results(repo_dir):
    df = pd.read_csv(repo_dir / "traces" / "gates" / "gates_cuda_NVIDIA_H200.csv")
    after = df[df["phase"] == "after_tune"]
    assert len(after) >= 200 and after["passed"].all()
    every = df[df["phase"] == "all_gates"]          # `m3lab gate --device cuda`: every gate, bf16 on the H200
    assert len(every) >= 400 and every["passed"].all() and set(every["commit"]) and set(every["date"])
    families = {g.split(".")[0] for g in every["gate"]}
    assert {"gemm", "mx", "moe", "sparse", "vllm", "perf"} <= families
    assert every["gate"].str.startswith("vllm.").sum() >= 6 and (every["dtype"] == "bfloat16").any()
    allg = df[df["phase"] == "gemm_all_gates"]      # `m3lab gate --device cuda --only 'gemm.*' 'mx.*' 'perf.*'`
    assert allg[~allg["gate"].str.startswith("perf.")]["passed"].all() and len(allg) >= 480
    recheck = df[(df["phase"] == "perf_recheck") & (df["commit"] == allg["commit"].iloc[0])]
    assert (~allg["passed"]).sum() <= 1 and recheck["gate"].str.startswith("perf.").sum() >= 100
    assert recheck["passed"].all()                  # the perf gates alone, right after, on the same commit
    session = df[df["phase"] == "gemm_session"]     # the GEMM session that re-tuned the tables
    assert len(session) >= 400 and session["passed"].all() and session["gate"].str.endswith("_layout").sum() >= 70
    # the newest peers session (m3lab.sessions.peers): what `m3lab gate --device cuda` runs, in three groups, at its
    # commit, against the baseline it re-recorded minutes before; three compute-bound perf points ran 11-13% over
    peers = df[df["phase"] == "peers_session_c"]
    correct = peers[~peers["gate"].str.startswith("perf.")]
    assert len(correct) >= 470 and correct["passed"].all()
    assert {"gemm", "mx", "moe", "sparse", "vllm"} <= {g.split(".")[0] for g in correct["gate"]}
    timed = peers[peers["gate"].str.startswith("perf.")]
    assert len(timed) == 112 and timed["passed"].sum() >= 109
    # the final kernels commit, gated against that baseline: every correctness case; four prefill points at the
    # card's power limit over their baseline (kernels/gemm/README.md)
    final = df[df["phase"] == "gates_final"]
    assert len(final[~final["gate"].str.startswith("perf.")]) >= 470
    assert final[~final["gate"].str.startswith("perf.")]["passed"].all()
    assert final[final["gate"].str.startswith("perf.")]["passed"].sum() >= 108
    base = perf.load_baseline(repo_dir / "traces" / "gates" / "baseline_NVIDIA_H200.csv")
    first = df.loc[df["phase"] == "peers_session_a", "commit"]
    assert set(base["provider"]) == {"triton"} and len(base) == 112
    assert set(base["commit"]) <= set(peers["commit"]) | set(first)


def test_cli_tune_rejects_bad_input():
    from m3lab.cli.main import app
    runner = CliRunner()
    for args, field in ((["--shapes", "12y"], "shapes"), (["--formats", "int3"], "formats"),
                        (["--formats", "bf16_layout"], "formats"),
                        (["--formats", "mxfp4_layout,mxfp8_layout"], "needs a GPU")):   # valid formats; no GPU here
        res = runner.invoke(app, ["tune", "gemm", *args])
        assert res.exit_code == 2 and field in res.output
