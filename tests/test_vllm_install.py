"""vLLM 0.33.0 is installed wherever m3lab runs (the set-up installs it), and m3lab imports its M3 code."""
import json

from typer.testing import CliRunner

from m3lab.cli.main import app
from m3lab.vllm_src import imports, install


def test_the_setup_installed_vllm_0_33():
    assert install.installed_version() == install.VLLM_VERSION
    assert install.problem() is None


def test_every_pinned_package_names_the_import_that_needs_it():
    lines = [ln for ln in install.CPU_REQUIREMENTS.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) >= 20
    for ln in lines:
        req, _, why = ln.partition("#")
        assert "==" in req and why.strip(), f"pin and reason needed: {ln!r}"


def test_m3_kernel_modules_import_without_compiled_extensions():
    sa = imports.m3_module("common.ops.sparse_attn")
    assert sa.SPARSE_BLOCK_SIZE == 128
    norm = imports.m3_module("amd.ops.gemma_rmsnorm")
    assert callable(norm.gemma_rmsnorm) and callable(norm.gemma_fused_add_rmsnorm)


def test_env_command_reports_what_summary_json_records():
    out = CliRunner().invoke(app, ["env", "--json"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    assert info["packages"]["vllm"] == "0.33.0" and info["vllm_problem"] is None
    assert {"m3lab", "torch", "triton"} <= set(info["packages"]) and info["device"]


def test_a_missing_vllm_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setattr(install, "installed_version", lambda: None)
    try:
        install.require("the fast-path resolver")
    except ValueError as err:
        text = str(err)
    assert "the fast-path resolver needs vLLM 0.33.0" in text and "pip install --no-deps vllm==0.33.0" in text
    monkeypatch.setattr(install, "installed_version", lambda: "0.20.1")
    assert "older than 0.33.0" in install.problem()
