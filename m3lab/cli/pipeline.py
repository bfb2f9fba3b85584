"""``m3lab run``, ``m3lab sweep``, ``m3lab list``, ``m3lab report`` and ``m3lab lab``."""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import typer

from m3lab.cli.output import echo_json
from m3lab.errors import M3LabError
from m3lab.pipeline.grid_file import is_grid_file, load_grid
from m3lab.pipeline.params import notebook_parameters
from m3lab.pipeline.report import build_report
from m3lab.pipeline.runner import RunInterrupted, resume_run, run_pipeline
from m3lab.pipeline.spec import DEFAULT_PIPELINE, list_pipelines, load_pipeline, notebooks_dir
from m3lab.pipeline.sweep import (SweepInterrupted, is_sweep_folder, parse_axes, rebuild_comparison, resume_sweep,
                                  run_sweep)
from m3lab.pipeline.sweep_report import COMPARISON, SWEEP_REPORT

INTERRUPTED_EXIT = 130   # the shell's code for a process ended by SIGINT


def run(
    pipeline: Optional[str] = typer.Argument(None, help="A built-in pipeline name (see 'm3lab list') or a pipeline "
                                                        ".yaml file; default: checklist."),
    param: List[str] = typer.Option([], "-p", "--param", metavar="KEY=VALUE",
                                    help="KEY=VALUE for every step declaring KEY, or STEP.KEY=VALUE for one step. "
                                         "Repeatable. With --resume: re-run from the first step it changes."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder in which the run folder is created."),
    resume: Optional[Path] = typer.Option(None, "--resume", metavar="RUN_DIR",
                                          help="Re-run the unfinished steps of this run folder, with its parameters "
                                               "(changed by any -p)."),
    progress: bool = typer.Option(False, "--progress/--quiet", help="Show papermill's per-cell progress bars."),
) -> None:
    """Run a pipeline of notebooks with papermill and print where the run folder is."""
    try:
        if resume is not None:
            name = _pipeline_name(pipeline) if pipeline is not None else None
            result = resume_run(resume, param, pipeline=name, progress=progress)
        else:
            result = run_pipeline(pipeline or DEFAULT_PIPELINE, param, out, progress=progress)
    except RunInterrupted as stop:
        typer.secho(f"interrupted: resume with: m3lab run --resume {stop.run_dir}", err=True, fg="yellow")
        raise typer.Exit(INTERRUPTED_EXIT) from None
    typer.echo(f"run folder: {result.run_dir}")
    typer.echo(f"report:     {result.run_dir / 'report.html'}")
    if not result.ok:
        step = result.failed_step
        typer.secho(f"error: step {step['name']!r} failed: {step['error']}", err=True, fg="red")
        typer.echo(f"fix the cause, then: m3lab run --resume {result.run_dir} (add -p KEY=VALUE to change a "
                   f"parameter; the steps from the first one it changes run again)", err=True)
        raise typer.Exit(1)


def _pipeline_name(pipeline: str) -> str:
    return load_pipeline(pipeline).name


def sweep(
    pipeline: Optional[str] = typer.Argument(None, help="A built-in pipeline name, a pipeline .yaml file, or a "
                                                        "grid .yaml (pipeline, axes, overrides, executor: see "
                                                        "m3lab.pipeline.grid_file); default: checklist."),
    grid: List[str] = typer.Option([], "-g", "--grid", metavar="KEY=V1,V2",
                                   help="KEY=V1,V2 or KEY=[V1, V2]: one axis of the grid. Repeatable, once per KEY. "
                                        "Not needed with a grid file (PIPELINE = a YAML with 'axes')."),
    param: List[str] = typer.Option([], "-p", "--param", metavar="KEY=VALUE",
                                    help="KEY=VALUE applied to every grid point. Repeatable."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder in which the sweep folder is created."),
    ray_address: Optional[str] = typer.Option(None, "--ray", "--address", metavar="ADDRESS",
                                              help="The Ray cluster for --executor ray ('auto': a running one)."),
    executor: Optional[str] = typer.Option(None, "--executor", help="local or ray (default: the grid file's, else "
                                                                    "local; ray when --address is given)"),
    resume: Optional[Path] = typer.Option(None, "--resume", metavar="SWEEP_DIR",
                                          help="Finish this sweep folder here (after Ctrl-C or a failure): resume "
                                               "each unfinished point, then rebuild the comparison."),
    progress: bool = typer.Option(False, "--progress/--quiet", help="Show papermill's per-cell progress bars."),
) -> None:
    """Run a pipeline once per point of a parameter grid; end with one comparison table across the points."""
    try:
        if resume is not None:
            if pipeline or grid or param:
                raise M3LabError("--resume takes the sweep folder alone", field="resume",
                                 hint="the folder keeps its pipeline, grid and parameters")
            record = resume_sweep(resume, progress=progress)
        elif pipeline and is_grid_file(pipeline):
            g = load_grid(pipeline)
            axes = {**g.axes, **(parse_axes(grid) if grid else {})}
            record = run_sweep(g.pipeline, axes, g.overrides + list(param), out, ray_address=ray_address or g.address,
                               progress=progress, executor=executor or g.executor, ray_options=g.ray or None)
        else:
            if not grid:
                raise M3LabError("a sweep needs a grid", field="--grid", hint="-g KEY=V1,V2, or a grid file")
            record = run_sweep(pipeline or DEFAULT_PIPELINE, parse_axes(grid), param, out, ray_address=ray_address,
                               progress=progress, executor=executor)
    except SweepInterrupted as stop:
        typer.secho(f"interrupted: the finished points are compared in {stop.folder / SWEEP_REPORT}; finish the "
                    f"sweep with: m3lab sweep --resume {stop.folder}", err=True, fg="yellow")
        raise typer.Exit(INTERRUPTED_EXIT) from None
    _sweep_summary(record)


def _sweep_summary(record: dict) -> None:
    failed = [p for p in record["points"] if p["status"] != "ok"]
    folder = Path(record["folder"])
    typer.echo(f"sweep folder: {folder} ({len(record['points']) - len(failed)} ok, {len(failed)} failed)")
    for p in failed:
        typer.secho(f"  {p['name']}: {p['status']}: {p.get('error') or 'no reason recorded'}", err=True, fg="red")
    typer.echo(f"comparison:   {folder / COMPARISON}")
    typer.echo(f"report:       {folder / SWEEP_REPORT}")
    if failed:
        typer.echo(f"fix the cause, then: m3lab sweep --resume {folder}", err=True)
        raise typer.Exit(1)


def list_(
    pipeline: Optional[str] = typer.Argument(None, help="Show only this pipeline."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show the pipelines, their notebooks, and each notebook's parameters with defaults."""
    pipes = [load_pipeline(name) for name in ([pipeline] if pipeline else list_pipelines())]
    listing = {"pipelines": [
        {"name": p.name, "description": p.description,
         "steps": [{"name": s.name, "notebook": s.notebook.name,
                    "parameters": [{"name": q.name, "default": s.parameters.get(q.name, q.default),
                                    "type": q.type_name, "help": q.help}
                                   for q in notebook_parameters(s.notebook).values()]}
                   for s in p.steps]}
        for p in pipes]}
    if as_json:
        echo_json(listing)
        return
    tty = sys.stdout.isatty()
    width = shutil.get_terminal_size((100, 24)).columns if tty else None
    for p in listing["pipelines"]:
        name = typer.style(p["name"], bold=True) if tty else p["name"]
        desc = f": {p['description']}"
        if width is not None:
            desc = textwrap.fill(desc, width=max(40, width - 1), initial_indent=" " * len(p["name"]),
                                 subsequent_indent="  ")[len(p["name"]):]
        typer.echo(name + desc)
        for s in p["steps"]:
            typer.echo(f"  {s['name']}  ({s['notebook']})")
            for q in s["parameters"]:
                head = f"    {q['name']} = {q['default']!r}  ({q['type']})"
                if not q["help"]:
                    typer.echo(head)
                elif width is None or len(head) + 2 + len(q["help"]) <= width:
                    typer.echo(f"{head}  {q['help']}")
                else:
                    typer.echo(head)
                    typer.echo(textwrap.fill(q["help"], width=max(40, width - 1), initial_indent=" " * 8,
                                             subsequent_indent=" " * 8))
    if tty:
        typer.echo("\nChange a parameter with -p KEY=VALUE (every step declaring it) or -p STEP.KEY=VALUE.")


def report(run_dir: Path = typer.Argument(..., metavar="RUN_OR_SWEEP_DIR",
                                         help="A run folder made by 'm3lab run', or a sweep folder made by "
                                              "'m3lab sweep'.")) -> None:
    """(Re)build report.html of a run folder, or comparison.parquet and sweep.html of a sweep folder."""
    typer.echo(str(rebuild_comparison(run_dir) if is_sweep_folder(run_dir) else build_report(run_dir)))


def lab(
    port: int = typer.Option(8888, help="Port on localhost; the next free one is used if it is taken."),
    allow_root: Optional[bool] = typer.Option(None, "--allow-root/--no-allow-root",
                                              help="Let JupyterLab run as root (default: on when running as root, "
                                                   "as in most GPU containers)."),
    print_command: bool = typer.Option(False, "--print-command", help="Print the command instead of starting JupyterLab."),
) -> None:
    """Open JupyterLab on the repository (notebooks/ and runs/), bound to localhost, with a fresh token."""
    if not 1 <= port <= 65535:
        raise M3LabError(f"--port {port} is not a TCP port", field="port", hint="use 1024-65535, e.g. 8888")
    token = secrets.token_hex(24)
    bound = free_port(port)
    root, start = _lab_root()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={bound}",
           "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}"]
    if allow_root if allow_root is not None else _is_root():
        cmd.append("--allow-root")
    if print_command:
        typer.echo(" ".join(cmd))
        return
    if not _has_module("jupyterlab"):
        raise M3LabError("JupyterLab is not installed", hint="pip install jupyterlab (it is in m3lab's dependencies)")
    if bound != port:
        typer.echo(f"port {port} is in use; using {bound}")
    typer.echo(f"JupyterLab: http://127.0.0.1:{bound}/lab/tree/{start}?token={token}", nl=True)
    sys.stdout.flush()
    try:
        code = subprocess.call(cmd)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def free_port(start: int, tries: int = 50) -> int:
    """The first port from ``start`` on that nothing listens on at 127.0.0.1."""
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise M3LabError(f"ports {start}-{start + tries - 1} are all in use", field="port", hint="pass --port N")


def _lab_root() -> tuple[Path, str]:
    """(root folder, folder to open): the repository with notebooks/ and runs/ when in a checkout, else the
    notebooks folder."""
    nbs = notebooks_dir().resolve()
    if (nbs.parent / "m3lab").is_dir():
        return nbs.parent, nbs.name
    return nbs, ""


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _has_module(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("sweep")(sweep)
    app.command("list")(list_)
    app.command("report")(report)
    app.command("lab")(lab)
