"""The CLI: --help everywhere, one-line errors with exit 2, run/list/report/lab."""
import subprocess
import sys

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from m3lab.cli.main import app

runner = CliRunner()


def _all_command_paths(group, prefix=()):
    for name, cmd in group.commands.items():
        path = prefix + (name,)
        yield path
        if hasattr(cmd, "commands"):
            yield from _all_command_paths(cmd, path)


def test_every_command_has_help():
    paths = list(_all_command_paths(get_command(app)))
    assert {("run",), ("list",), ("report",), ("lab",)} <= set(paths)
    for path in paths:
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Usage" in res.output


def test_unknown_parameter_is_named_with_valid_keys(tmp_path):
    res = runner.invoke(app, ["run", "-p", "bogus=1", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2
    assert "bogus" in res.output and "valid keys" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()


def test_unknown_pipeline_and_resume_with_params(tmp_path):
    res = runner.invoke(app, ["run", "nope"])
    assert res.exit_code == 2 and "unknown pipeline 'nope'" in res.output and "checklist" in res.output
    res = runner.invoke(app, ["run", "--resume", str(tmp_path), "-p", "x=1"])
    assert res.exit_code == 2 and "not a run folder" in res.output


def test_list_shows_pipelines_notebooks_and_parameters():
    res = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "checklist" in res.output and "kernels" in res.output
    assert "00_overview.ipynb" in res.output and "show_optimisations" in res.output


def test_report_of_a_non_run_folder_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "not a run folder" in res.output


def test_lab_binds_localhost_with_a_token():
    res = runner.invoke(app, ["lab", "--print-command"])
    assert res.exit_code == 0
    assert "--ip=127.0.0.1" in res.output and "--IdentityProvider.token=" in res.output
    token = res.output.split("--IdentityProvider.token=")[1].split()[0]
    assert len(token) >= 32


def test_console_entry_point_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "m3lab", "run", "-p", "bogus=1"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "bogus" in out.stderr and "Traceback" not in out.stderr
