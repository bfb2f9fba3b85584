"""``m3lab run``, ``m3lab list``, ``m3lab report`` and ``m3lab lab``."""
from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer

from m3lab.errors import M3LabError


def run(
    pipeline: str = typer.Argument("checklist", help="A built-in pipeline name (see 'm3lab list') or a pipeline .yaml file."),
    param: List[str] = typer.Option([], "-p", "--param", help="KEY=VALUE for every step declaring KEY, or STEP.KEY=VALUE for one step. Repeatable."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder in which the run folder is created."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Re-run the unfinished steps of this run folder, with its parameters."),
    quiet: bool = typer.Option(False, "--quiet", help="No per-cell progress bars."),
) -> None:
    """Run a pipeline of notebooks with papermill and print where the run folder is."""
    from m3lab.pipeline.runner import resume_run, run_pipeline

    if resume is not None:
        if param:
            raise M3LabError("--resume re-runs with the parameters the run was started with",
                             hint="drop -p, or start a new run")
        result = resume_run(resume, progress=not quiet)
    else:
        result = run_pipeline(pipeline, param, out, progress=not quiet)
    typer.echo(f"run folder: {result.run_dir}")
    typer.echo(f"report:     {result.run_dir / 'report.html'}")
    if not result.ok:
        step = result.failed_step
        typer.secho(f"error: step {step['name']!r} failed: {step['error']}", err=True, fg="red")
        typer.echo(f"fix it, then: m3lab run --resume {result.run_dir}", err=True)
        raise typer.Exit(1)


def sweep(
    pipeline: str = typer.Argument("checklist", help="A built-in pipeline name or a pipeline .yaml file."),
    grid: List[str] = typer.Option(..., "-g", "--grid", help="KEY=V1,V2 or KEY=[V1, V2]: one axis of the grid. Repeatable."),
    param: List[str] = typer.Option([], "-p", "--param", help="KEY=VALUE applied to every grid point. Repeatable."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder in which the sweep folder is created."),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="Run the points as Ray tasks on this cluster ('auto' for the local one)."),
) -> None:
    """Run a pipeline once per point of a parameter grid (locally, or on a Ray cluster)."""
    from m3lab.pipeline.sweep import parse_axes, run_sweep

    record = run_sweep(pipeline, parse_axes(grid), param, out, ray_address=ray_address)
    failed = [p for p in record["points"] if p["status"] != "ok"]
    typer.echo(f"sweep folder: {record['folder']} ({len(record['points']) - len(failed)} ok, {len(failed)} failed)")
    if failed:
        raise typer.Exit(1)


def list_(
    pipeline: Optional[str] = typer.Argument(None, help="Show only this pipeline."),
) -> None:
    """Show the pipelines, their notebooks, and each notebook's parameters with defaults."""
    from rich.console import Console
    from rich.table import Table

    from m3lab.pipeline.params import notebook_parameters
    from m3lab.pipeline.spec import list_pipelines, load_pipeline

    console = Console()
    for name in [pipeline] if pipeline else list_pipelines():
        pipe = load_pipeline(name)
        console.print(f"[bold]{pipe.name}[/bold]: {pipe.description}")
        table = Table(show_lines=False)
        for col in ("step", "notebook", "parameter", "default", "type", "help"):
            table.add_column(col, overflow="fold")
        for step in pipe.steps:
            params = notebook_parameters(step.notebook)
            first = True
            for p in params.values():
                shown = step.parameters.get(p.name, p.default)
                table.add_row(step.name if first else "", step.notebook.name if first else "", p.name,
                              repr(shown), p.type_name, p.help)
                first = False
            if first:
                table.add_row(step.name, step.notebook.name, "", "", "", "")
        console.print(table)


def report(run_dir: Path = typer.Argument(..., help="A run folder made by 'm3lab run'.")) -> None:
    """(Re)build report.html of a run folder."""
    from m3lab.pipeline.report import build_report
    typer.echo(str(build_report(run_dir)))


def lab(
    port: int = typer.Option(8888, help="Port on localhost."),
    print_command: bool = typer.Option(False, "--print-command", help="Print the command instead of starting JupyterLab."),
) -> None:
    """Open JupyterLab on the notebooks, bound to localhost, with a fresh token."""
    from m3lab.pipeline.spec import notebooks_dir

    token = secrets.token_hex(24)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.root_dir={notebooks_dir()}", f"--IdentityProvider.token={token}"]
    if print_command:
        typer.echo(" ".join(cmd))
        return
    if shutil.which("jupyter") is None and not _has_module("jupyterlab"):
        raise M3LabError("JupyterLab is not installed", hint="pip install jupyterlab (it is in m3lab's dependencies)")
    typer.echo(f"JupyterLab: http://127.0.0.1:{port}/lab?token={token}")
    raise typer.Exit(subprocess.call(cmd))


def _has_module(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("sweep")(sweep)
    app.command("list")(list_)
    app.command("report")(report)
    app.command("lab")(lab)
