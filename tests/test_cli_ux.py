"""Commands that read well and compose: m3lab lab where users run it (as root, on a busy port), m3lab list at
80 columns and through a pipe, estimate hints that can be followed, defaults valid for M3."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app

cli = CliRunner()


def _m3lab(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "m3lab", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_lab_starts_as_root_on_a_busy_port_and_prints_the_port_it_bound():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("the point is running as root (as in GPU containers)")
    pytest.importorskip("jupyterlab")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "m3lab", "lab", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = next(line for line in lines if line.startswith("JupyterLab: "))
        m = re.match(r"JupyterLab: http://127\.0\.0\.1:(\d+)/lab/tree/\S*\?token=(\w{32,})", url)
        assert m, lines
        bound, token = int(m.group(1)), m.group(2)
        assert bound != port and f"port {port} is in use" in lines[0]
        status, deadline = None, time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{bound}/api/status?token={token}", timeout=5).status
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1)
        assert proc.poll() is None, "JupyterLab exited (as root without --allow-root?)"
        assert status == 200
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"http://127.0.0.1:{bound}/api/contents", timeout=5)
        assert denied.value.code == 403
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        busy.close()


def test_lab_command_adds_allow_root_as_root_and_binds_localhost():
    res = cli.invoke(app, ["lab", "--print-command"])
    assert res.exit_code == 0
    assert "--ip=127.0.0.1" in res.output and "--ServerApp.port_retries=0" in res.output
    assert ("--allow-root" in res.output) == (os.geteuid() == 0)
    assert "--allow-root" not in cli.invoke(app, ["lab", "--print-command", "--no-allow-root"]).output


def test_list_is_one_line_per_parameter_when_piped_and_readable_at_80_columns():
    res = _m3lab("list", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for name in ("settings", "show_optimisations", "kv_dtype", "concurrency"):
        assert any(re.match(rf"\s+{name} = ", line) for line in lines), name
    head = [line.split("  (")[0] for line in lines if " = " in line]
    assert all(len(h) <= 80 for h in head), [h for h in head if len(h) > 80]
    assert "│" not in res.stdout and "┃" not in res.stdout          # plain text, no table borders
    assert "MISSION.md" not in res.stdout


def test_list_json():
    res = cli.invoke(app, ["list", "--json"])
    data = json.loads(res.output)
    steps = {s["name"]: s for p in data["pipelines"] for s in p["steps"]}
    params = {q["name"]: q for q in steps["serving_estimates"]["parameters"]}
    # deployment keys default to None ("keep the preset's value"); the help names the preset's value
    assert params["concurrency"]["default"] is None and "(default 32)" in params["concurrency"]["help"]
    assert params["num_prompts"]["default"] is None


def test_estimate_defaults_are_valid_for_m3_and_its_hints_can_be_followed():
    base = ["estimate", "--model", "minimax-m3", "--isl", "8192", "--osl", "1024", "--concurrency", "32", "--json"]
    res = cli.invoke(app, [*base, "--hardware", "mi355x"])                      # default plan: TP4
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["tp"] == 4
    h200 = [*base[:-2], "40", "--json", "--num-prompts", "80"]                   # c=40 fits h200 only with fp8 KV
    res = cli.invoke(app, [*h200, "--hardware", "h200", "--quant", "mxfp8"])   # served as vLLM would: KV waits
    notes = " ".join(json.loads(res.output)["notes"])
    assert res.exit_code == 0 and "admission waits for KV" in notes
    assert "--kv-dtype fp8" in notes and "kv_dtype=fp8" in notes
    res = cli.invoke(app, [*h200, "--hardware", "h200", "--quant", "mxfp8", "--kv-dtype", "fp8"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kv_dtype"] == "fp8"
    res = cli.invoke(app, [*base, "--hardware", "mi355x", "--spec-tokens", "3"])
    assert res.exit_code == 2 and "--accept-len" in res.output
    res = cli.invoke(app, [*base, "--hardware", "mi355x", "--num-prompts", "0"])
    assert res.exit_code == 2 and "num_prompts" in res.output
    for word in ("none", "None", "null"):
        res = cli.invoke(app, [*base, "--hardware", "mi355x", "--calibration", word])
        assert res.exit_code == 0 and json.loads(res.output)["kind"] == "ceiling", (word, res.output)


def test_estimate_table_when_only_the_ceiling_exists_has_no_empty_column():
    res = cli.invoke(app, ["estimate", "--model", "minimax-m3", "--hardware", "b200", "--quant", "mxfp8", "--isl",
                           "8192", "--osl", "1024", "--concurrency", "8"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "ceiling: ceiling" not in res.output
    header = next(line for line in res.output.splitlines() if "figure" in line)
    assert header.split() == ["figure", "ceiling"]


def test_pipeline_parameter_kv_dtype_follows_the_hint():
    from m3lab.pipeline.params import resolve_parameters
    from m3lab.pipeline.spec import load_pipeline
    params = resolve_parameters(load_pipeline("checklist"), ["hardware=h200", "kv_dtype=fp8"])
    assert params["serving_estimates"]["kv_dtype"] == "fp8"
