"""``m3lab env``: what m3lab found here (the same record every run's summary.json keeps)."""
from __future__ import annotations

import typer

from m3lab.cli.output import echo_json
from m3lab.pipeline.environment import describe
from m3lab.vllm_src import install


def env_cmd(json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """m3lab, vLLM, torch and triton versions, the device and the git commit (as summary.json records them)."""
    info = describe()
    info["vllm_problem"] = install.problem()
    if json_out:
        echo_json(info)
        return
    pk = info["packages"]
    for name in ("m3lab", "vllm", "torch", "triton"):
        typer.echo(f"{name:<8} {pk.get(name) or 'not installed'}")
    typer.echo(f"{'device':<8} {info['device']}")
    typer.echo(f"{'python':<8} {info['python']}")
    typer.echo(f"{'commit':<8} {info['git_commit']}")
    if info["vllm_problem"]:
        typer.secho(info["vllm_problem"], fg="yellow")


def register(app: typer.Typer) -> None:
    app.command("env")(env_cmd)
