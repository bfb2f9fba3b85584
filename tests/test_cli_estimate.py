"""``m3lab estimate`` and ``m3lab kernel-time``: one JSON object, labelled kinds, clear errors (exit 2)."""
import json
import random

from typer.testing import CliRunner

from m3lab.cli.main import app

runner = CliRunner()
SMALL = ["--model", "minimax-m3", "--tp", "4", "--quant", "mxfp8", "--isl", "1024", "--osl", "16",
         "--concurrency", "2", "--num-requests", "2", "--json"]


def test_estimate_json_calibrated_and_ceiling():
    res = runner.invoke(app, ["estimate", "--hardware", "mi355x", *SMALL])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["kind"] == "calibrated" and out["calibration"] == "aiter-mi355x"
    for key in ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu", "ttft_s", "tpot_ms"):
        assert out[key] > 0 and out["ceiling"][key] > 0
    assert out["ceiling"]["output_tokens_per_s_per_gpu"] > out["output_tokens_per_s_per_gpu"]
    res = runner.invoke(app, ["estimate", "--hardware", "h200", *SMALL])
    assert res.exit_code == 0 and json.loads(res.stdout)["kind"] == "ceiling"
    res = runner.invoke(app, ["estimate", "--hardware", "mi355x", "--calibration", "none", *SMALL])
    assert json.loads(res.stdout)["kind"] == "ceiling"
    human = runner.invoke(app, ["estimate", "--hardware", "mi355x", *SMALL[:-1]])
    assert human.exit_code == 0 and "ceiling" in human.stdout


def test_estimate_spec_decode_flags():
    res = runner.invoke(app, ["estimate", "--hardware", "mi355x", *SMALL, "--spec-tokens", "3", "--accept-len", "2.5"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["spec_tokens"] == 3


def test_kernel_time_gemm_and_grouped():
    m = random.choice([1, 8, 32, 256, 4096])
    res = runner.invoke(app, ["kernel-time", "--hardware", "mi355x", "--op", "gemm", "--m", str(m), "--n", "2560",
                              "--k", "6144", "--quant", "fp8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["us"] >= out["ceiling_us"] > 0 and out["bound"] in ("memory", "compute", "launch floor")
    res = runner.invoke(app, ["kernel-time", "--hardware", "mi355x", "--op", "grouped_gemm", "--tokens", "32",
                              "--hidden", "6144", "--inter", "768", "--experts", "129", "--topk", "5",
                              "--quant", "mxfp8", "--routing", "balanced", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [p["op"] for p in out["parts"]] == ["moe_gate_up", "moe_down"] and out["us"] > 0


def test_bad_inputs_exit_2_with_one_line():
    cases = [
        ["estimate", "--hardware", "mi999", *SMALL],
        ["estimate", "--hardware", "h200", "--model", "minimax-m3", "--tp", "4", "--quant", "mxfp8", "--isl",
         "1000000", "--osl", "1000", "--concurrency", "64"],   # within M3's context, beyond an H200's KV
        ["kernel-time", "--hardware", "mi355x", "--op", "conv", "--m", "1"],
        ["kernel-time", "--hardware", "mi355x", "--op", "gemm", "--m", "1", "--n", "2560"],
    ]
    for args in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "Error:" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, cases[1])
    assert "largest concurrency that fits" in res.output


def test_estimate_with_a_measured_table(tmp_path):
    """An uncalibrated profile becomes 'calibrated' with a long-format bench CSV measured on it."""
    import pandas as pd

    rng = random.Random()
    rows = [{"op": "gemm", "provider": "torch", "shape": f"M={m},N={n},K={k}", "dtype": "mxfp8",
             "us_p50": 8 + 2e-9 * m * n * k / 50 + rng.random(), "device": "NVIDIA_H200"}
            for m in (1, 8, 64, 512, 4096) for n, k in ((2304, 6144), (6144, 2048), (6144, 6144))]
    path = tmp_path / "gemm.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    res = runner.invoke(app, ["estimate", "--hardware", "h200", "--calibration", str(path), *SMALL])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["kind"] == "calibrated" and out["calibration"] == "gemm.csv"
    bad = runner.invoke(app, ["estimate", "--hardware", "h200", "--calibration", str(tmp_path / "no.csv"), *SMALL])
    assert bad.exit_code == 2 and "does not exist" in bad.output


def test_estimate_engine_vllm_schedules_with_vllms_own_scheduler():
    res = runner.invoke(app, ["estimate", "--hardware", "mi355x", *SMALL, "--engine", "vllm"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    chk = out["engine_check"]
    assert out["engine"] == "vllm" and chk["same_schedule"] and chk["vllm_s"] > 0 and chk["vllm_over_m3lab"] > 0
    bad = runner.invoke(app, ["estimate", "--hardware", "mi355x", *SMALL, "--engine", "sglang"])
    assert bad.exit_code == 2 and "engine" in bad.output
    pd = runner.invoke(app, ["estimate", "--hardware", "mi355x", *SMALL, "--pd", "1:1", "--engine", "vllm"])
    assert pd.exit_code == 2 and "--engine vllm" in pd.output


def test_a_first_resolution_says_vllm_is_starting(tmp_path, monkeypatch, capsys):
    """Before vLLM is started to decide a deployment's kernels (seconds), one stderr line says so; a deployment
    already resolved (process or disk cache) prints nothing; --json off a terminal stays quiet."""
    from m3lab.cli.estimate import _announce_vllm_start
    from m3lab.serving import dispatch
    from m3lab.spec.serving import make_deployment

    monkeypatch.setenv(dispatch.CACHE_ENV, str(tmp_path))
    d = make_deployment(concurrency=3)          # a batch no other test resolves: neither cache holds it
    assert not dispatch.resolved_before(d)
    _announce_vllm_start(d, as_json=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "starting it on the CPU" in err and str(tmp_path) in err
    _announce_vllm_start(d, as_json=True)
    assert capsys.readouterr().err == ""
    dispatch.dispatch_for(d)
    assert dispatch.resolved_before(d)
    _announce_vllm_start(d, as_json=False)
    assert capsys.readouterr().err == ""
