"""The review's commands (2026-12-01), each with its exit status and first line: bad input is one line and exit 2
before any work, long commands show progress, successful ones print no warning; large Kineto traces stream."""
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app

os.environ.setdefault("TRITON_INTERPRET", "1")   # gates run in this process: the interpreter before triton loads

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO / "m3lab" / "cache" / "data" / "mooncake_synthetic_trace.jsonl.gz"
cli = CliRunner()


def _m3lab(*args, env=None, unset=(), timeout=300):
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    return subprocess.run([sys.executable, "-m", "m3lab", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def _refused(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("Error: ")
    for w in words:
        assert w in res.output, (w, res.output)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["mx.*", "sparse.attn_triton"])   # the second warns in numpy
def test_gate_only_on_cpu_runs_and_prints_no_interpreter_warning(pattern):
    """Regression: `m3lab gate --device cpu --only PATTERN` failed for every pattern; a passing gate run printed
    the Triton interpreter's numpy RuntimeWarnings."""
    res = _m3lab("gate", "--device", "cpu", "--only", pattern, env={"COLUMNS": "80"}, unset=("TRITON_INTERPRET",))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "gates on cpu" and res.stdout.splitlines()[-1].startswith("PASSED")
    assert "Warning" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_gate_shows_progress_off_a_terminal(monkeypatch):
    import m3lab.cli.output as output
    monkeypatch.setattr(output, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(output, "PROGRESS_EVERY_S", 0.0)
    res = cli.invoke(app, ["gate", "--device", "cpu", "--only", "mx.quant_mxfp8", "--only", "mx.dequant_mxfp8"])
    assert res.exit_code == 0, res.output
    assert "gates: mx.quant_mxfp8 (0/2, " in res.stderr and "gates: mx.dequant_mxfp8 (1/2, " in res.stderr
    assert res.stdout.splitlines()[-1] == "PASSED: 6/6 passed"


def test_gate_only_that_matches_nothing_is_one_line():
    _refused(cli.invoke(app, ["gate", "--device", "cpu", "--only", "nosuch.*"]), "no gate matches --only nosuch.*")


@pytest.mark.parametrize("args, words", [
    (["--capacity-tokens", "1e30"], ("capacity_tokens=1e+30", "simulator's limit of 2,147,483,648")),
    (["--capacity-tokens", "1e400"], ("is not a number",)),
])
def test_cache_sim_absurd_capacity_is_one_line(args, words):
    _refused(cli.invoke(app, ["cache-sim", "--trace", str(MOONCAKE), *args]), *words)


def test_cache_sim_generate_beyond_the_limit_is_one_line_before_any_work():
    _refused(cli.invoke(app, ["cache-sim", "--format", "agentic", "--trace", "generate:100000000"]),
             "sessions=100,000,000", "generator's limit of 100,000")


def test_pd_plan_warns_when_the_hand_off_is_descriptor_bound():
    args = ["pd-plan", "--model", "minimax-m3", "--prefill-tp", "4", "--decode-tp", "8", "--isl", "8192",
            "--kv-dtype", "fp8"]
    mixed = cli.invoke(app, args + ["--decode-layout", "aiter"])
    assert mixed.exit_code == 0 and mixed.stderr.startswith("warning: 534,802,944 descriptors per request"), \
        mixed.stderr
    same = cli.invoke(app, args)
    assert same.exit_code == 0 and same.stderr == ""


def test_moe_tables_against_a_folder_without_tables_is_one_line(tmp_path):
    _refused(cli.invoke(app, ["vllm", "moe-tables", "--against", str(tmp_path)]), "no fused-MoE table")


def test_trace_verify_prints_no_warning_on_success_or_failure():
    dispatch = sorted((REPO / "traces" / "dispatch").glob("*.dispatch.jsonl.gz"))[-1]
    kineto = sorted((REPO / "traces" / "profiler").glob("*.kineto.json.gz"))[-1]
    res = _m3lab("trace", "verify", str(dispatch), str(kineto), "--expect", "preset:mxfp8-tp4-optimised")
    assert res.returncode in (0, 1) and res.stderr == "", res.stderr


# ---- large Kineto traces: streamed, with progress, same table ---------------------------------------------------

def test_a_streamed_kineto_trace_gives_the_whole_document_table(tmp_path):
    from m3lab.traces.examples import write_synthetic_kineto_trace
    from m3lab.traces.kineto import _Events, _columns, _read_whole, read_kineto
    from m3lab.traces.table import make_events

    path = write_synthetic_kineto_trace(tmp_path / "t.json.gz", kernels=3000)
    seen = []
    streamed = read_kineto(path, progress=lambda done, total: seen.append((done, total)))
    whole = _Events(path)
    _read_whole(path, whole)
    pd.testing.assert_frame_equal(streamed, make_events(_columns(whole), fmt="kineto", source=path,
                                                        device_name="synthetic"))
    assert len(streamed) == 3000 and streamed.attrs["device_name"] == "synthetic"
    assert streamed["annotation"].str.startswith("m3lab::op[L").all() and (streamed["attribution"] == "cpu_op").all()
    assert seen and seen[-1][0] == seen[-1][1] == path.stat().st_size      # progress follows the file on disk


def test_a_streamed_kineto_trace_holds_far_less_than_the_whole_document(tmp_path):
    import json

    from m3lab.traces.examples import write_synthetic_kineto_trace
    from m3lab.traces.kineto import read_kineto

    path = write_synthetic_kineto_trace(tmp_path / "t.json", kernels=20000)
    tracemalloc.start()
    read_kineto(path)
    streamed = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    json.loads(path.read_text())                                          # what the reader did before
    whole = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert streamed < 0.5 * whole, (streamed, whole)


def test_trace_summarize_of_a_large_trace_shows_progress(tmp_path, monkeypatch):
    import m3lab.cli.output as output
    from m3lab.traces.examples import write_synthetic_kineto_trace

    monkeypatch.setattr(output, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(output, "PROGRESS_EVERY_S", 0.0)
    path = write_synthetic_kineto_trace(tmp_path / "t.json", kernels=20000)   # several 1 MB reads
    res = cli.invoke(app, ["trace", "summarize", str(path), "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "reading trace: (" in res.stderr and " MB, " in res.stderr
    assert res.stdout.splitlines()[0].startswith("t.json: kineto, 20,000 rows")
