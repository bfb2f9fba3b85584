"""``m3lab planes`` (step 3) and ``m3lab repetition`` (step 2): JSON fields that agree with the OpTable and the
serving run, one-line errors with exit 2, and terminal output that reads at 80 columns (no token split)."""
import json
import re

import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app

runner = CliRunner()
PLANES = ["planes", "--model", "minimax-m3", "--hardware", "mi300x", "--tp", "8", "--quant", "mxfp8", "--phase",
          "decode", "--batch", "216", "--context", "8704"]
REPETITION = ["repetition", "--model", "minimax-m3", "--hardware", "mi355x", "--tp", "4", "--quant", "mxfp8",
              "--isl", "1024", "--osl", "16", "--concurrency", "4"]


def _json(args):
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_planes_json_is_the_optable_grouped_by_op_and_plane():
    from m3lab.serving.step_cost import cost_step
    from m3lab.spec.serving import make_deployment
    from m3lab.workload.step import EngineStep

    d = _json(PLANES)
    assert d["deployment"]["gpus"] == 8 and d["step"] == {"phase": "decode", "batch": 216, "context": 8704,
                                                           "tokens": 216}
    assert all({"op", "kind", "plane", "bytes_read", "bytes_written", "flops"} <= set(r) for r in d["ops"])
    assert {r["plane"] for r in d["ops"]} == {"compute", "persistent", "communication"}
    dep = make_deployment(model="minimax-m3", hardware="mi300x", tp=8, quant="mxfp8")
    t = cost_step(dep, EngineStep.decode(216, 8704))   # the OpTable of the kernels vLLM runs for it
    assert "routing" in set(t["op"]) == {r["op"] for r in d["ops"]}
    assert [r["bytes_written"] > 0 for r in d["ops"] if r["op"] == "routing"] == [True]
    tot = d["totals"]
    assert tot["compute"]["bytes"] == pytest.approx(t["bytes_compute"].sum())
    assert tot["persistent"]["bytes"] == pytest.approx(t["bytes_weight"].sum() + t["bytes_kv"].sum())
    assert tot["communication"]["bytes"] == pytest.approx(t["bytes_comm"].sum())
    assert tot["persistent"]["bytes_all_gpus"] == pytest.approx(8 * tot["persistent"]["bytes"])
    attn = [r for r in d["ops"] if r["op"] == "attention" and r["plane"] == "persistent"][0]
    assert attn["part"] == "KV cache" and attn["bytes_written"] == 0 and attn["calls"] == 60
    assert sum(r["flops"] for r in d["ops"]) == pytest.approx(t["flops"].sum())
    assert "mi300x" in d["time_label"] and d["time_by_plane_us"]["weights"] > 0


def test_planes_prefill_chunk_is_the_step_it_names():
    d = _json(["planes", "--phase", "prefill", "--batch", "2", "--context", "8192", "--chunk", "2048"])
    assert d["step"]["tokens"] == 4096 and d["step"]["context"] == 8192
    whole = _json(["planes", "--phase", "prefill", "--batch", "2", "--context", "2048"])
    assert whole["step"]["tokens"] == 4096   # --chunk defaults to the whole context: the same tokens ...
    kv = lambda x: x["totals"]["persistent"]["bytes"]  # noqa: E731
    assert kv(d) > kv(whole)                 # ... but the later chunk reads 6K tokens of earlier context


@pytest.mark.parametrize("args, field", [
    (["planes", "--phase", "both"], "--phase"),
    (["planes", "--chunk", "512"], "--chunk"),
    (["planes", "--phase", "prefill", "--context", "1024", "--chunk", "2048"], "--chunk"),
    (["planes", "--context", "99999999"], "--context"),
    (["planes", "--batch", "0"], "--batch"),
    (["planes", "--tp", "3"], "tp"),
    (["planes", "--kv-dtype", "int4"], "kv_dtype"),
    (["repetition", "--top", "0"], "--top"),
    (["repetition", "--isl", "1048576", "--osl", "1024"], "isl + osl = 1,049,600 tokens is longer than"),
    (["repetition", "--concurrency", "0"], "concurrency"),
])
def test_bad_input_is_one_line_and_exit_2(args, field):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and field in lines[0], res.output


def test_repetition_json_ranks_ops_over_the_whole_run():
    d = _json(REPETITION + ["--top", "5"])
    assert d["workload"]["num_requests"] >= 4 and d["totals"]["engine_steps"] > 16
    assert len(d["ops"]) == 5 and [r["rank"] for r in d["ops"]] == [1, 2, 3, 4, 5]
    assert all({"op", "kind", "calls", "calls_per_step", "us_per_call", "ms_per_request", "share",
                "gflop_per_request", "mb_per_request"} <= set(r) for r in d["ops"])
    shares = [r["share"] for r in d["ops"]]
    assert shares == sorted(shares, reverse=True) and sum(r["share"] for r in d["by_kind"]) == pytest.approx(1.0)
    top = d["ops"][0]
    assert top["us_per_call"] * top["calls"] / 1e6 == pytest.approx(top["share"] * d["totals"]["op_time_s"])
    assert "projected for mi355x" in d["label"]


def _no_split_tokens(text: str, tokens) -> None:
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 80, [x for x in lines if len(x) > 80]
    words = {w for x in lines for w in x.split()}
    missing = [t for t in tokens if t not in words]
    assert not missing, f"cut or folded at 80 columns: {missing}"


def test_planes_and_repetition_read_at_80_columns():
    ops = {r["op"] for r in _json(PLANES)["ops"]}
    res = runner.invoke(app, PLANES, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    _no_split_tokens(res.stdout, ops | {"mi300x:", "minimax-m3"})
    rep = _json(REPETITION)
    res = runner.invoke(app, REPETITION, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    _no_split_tokens(res.stdout, {r["op"] for r in rep["ops"]} | {r["kind"] for r in rep["by_kind"]})


def test_narrow_terminal_prints_one_block_per_row():
    res = runner.invoke(app, PLANES, env={"COLUMNS": "40"})
    assert res.exit_code == 0 and re.search(r"^moe_gate_up\n    part weights mxfp8, calls 57,", res.stdout, re.M), res.stdout


def test_planes_and_repetition_take_the_shared_deployment_options():
    """--preset and --set as every deployment command takes them (m3lab.cli.deploy_options)."""
    opt = _json(["planes", "--preset", "mxfp8-tp4-optimised", "--set", "tp=8"])
    assert opt["deployment"]["tp"] == 8 and opt["deployment"]["name"].startswith("mxfp8-tp4-optimised")
    assert "page_table" in {r["op"] for r in opt["ops"]}         # AITER's sparse attention path: its table builder
    plain = _json(["planes", "--tp", "8"])
    assert "page_table" not in {r["op"] for r in plain["ops"]}   # vLLM's defaults: the Triton path, no table
    assert plain["step"] == {"phase": "decode", "batch": 32, "context": 8192 + 1024 // 2, "tokens": 32}
    rep = _json(REPETITION[:1] + ["--preset", "mxfp8-tp4-optimised", "--set", "isl=1024", "--osl", "16",
                                  "--concurrency", "4", "--num-prompts", "16"])
    assert rep["workload"]["isl"] == 1024 and rep["workload"]["num_requests"] == 16
    res = runner.invoke(app, ["repetition", "--tp", "8", "--set", "tp=4"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "given twice" in res.output
