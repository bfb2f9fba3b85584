"""The ``m3lab`` command: one typer app; each command group lives in its own module.

Command modules import heavy libraries (torch, pandas, plotly) inside their command functions,
so that ``m3lab --help`` stays instant. Bad input (:class:`~m3lab.errors.M3LabError`) and operating-system
errors anywhere below a command print one line, ``Error: <message>``, and exit with status 2 — no traceback.
"""
import typer
from typer.core import TyperGroup

from m3lab.cli import (advise, bench, cache, env, estimate, fastpaths, gate, ladder, pd, pipeline, planes,
                       repetition, shapes, trace, tune, vllm)
from m3lab.errors import M3LabError

USER_ERROR_EXIT = 2


INTERRUPTED_EXIT = 130
BROKEN_PIPE_EXIT = 141   # 128 + SIGPIPE, what a shell reports for a writer whose reader left


class _Group(TyperGroup):
    """The top-level group: bad input (:class:`M3LabError`) and operating-system errors (a read-only or full
    disk, a path that is a file) from any command become one line and exit 2; Ctrl-C exits 130."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except M3LabError as err:
            typer.secho(f"Error: {err}", err=True, fg="red")
            raise typer.Exit(USER_ERROR_EXIT) from None
        except BrokenPipeError:  # `m3lab list | head`: the reader left; end quietly, as a SIGPIPE would
            import os
            import sys
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(BROKEN_PIPE_EXIT) from None
        except OSError as err:
            typer.secho(f"Error: {os_error_line(err)}", err=True, fg="red")
            raise typer.Exit(USER_ERROR_EXIT) from None
        except KeyboardInterrupt:
            typer.secho("interrupted", err=True, fg="yellow")
            raise typer.Exit(INTERRUPTED_EXIT) from None


def os_error_line(err: OSError) -> str:
    """``[Errno 30] Read-only file system: 'x/.summary.json.abc.partial.json'`` -> one readable line."""
    import errno
    import re

    name = err.filename or ""
    name = re.sub(r"(^|/)\.([^/]+)\.[^./]+\.partial(\.[^/]*)?$", r"\1\2", str(name))  # atomic temp -> target
    hints = {errno.ENOSPC: "free some space, then resume or re-run", errno.EROFS: "choose a writable folder",
             errno.EACCES: "choose a folder you can write to", errno.ENOTDIR: "a path component is a file, not a folder",
             errno.EISDIR: "give a file, not a folder", errno.ENOENT: "check the path"}
    text = f"{err.strerror or type(err).__name__}" + (f": {name}" if name else "")
    hint = hints.get(err.errno)
    return f"{text} ({hint})" if hint else text


app = typer.Typer(cls=_Group, help="m3lab: the MiniMax M3 serving performance workbench.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)  # plain click help: option names are never cut at 80 columns


def _version(value: bool) -> None:
    if value:
        from importlib import metadata
        try:
            version = metadata.version("m3lab")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed; running from a source tree)"
        typer.echo(f"m3lab {version}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print m3lab's version and exit.")) -> None:
    """m3lab: the MiniMax M3 serving performance workbench."""


def _register_all() -> None:
    """Every command group, in the order ``m3lab --help`` lists them (each module defines ``register(app)``)."""
    for group in (estimate, pipeline, trace, gate, tune, bench, shapes, repetition, planes, env, fastpaths, pd, cache,
                  vllm, ladder, advise):
        group.register(app)


_register_all()


def main() -> None:
    """Console entry point (``m3lab``)."""
    app()
