"""The ``m3lab`` command: one typer app; each command group lives in its own module.

Command modules import heavy libraries (torch, pandas, plotly) inside their command functions,
so that ``m3lab --help`` stays instant. Bad input (:class:`~m3lab.errors.M3LabError`) anywhere
below a command prints one line, ``Error: <message>``, and exits with status 2 — no traceback.
"""
import typer
from typer.core import TyperGroup

from m3lab.errors import M3LabError

USER_ERROR_EXIT = 2


class _Group(TyperGroup):
    """The top-level group: turns an :class:`M3LabError` from any command into one line and exit 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except M3LabError as err:
            typer.secho(f"Error: {err}", err=True, fg="red")
            raise typer.Exit(USER_ERROR_EXIT) from None


app = typer.Typer(cls=_Group, help="m3lab: the MiniMax M3 serving performance workbench.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _register_all() -> None:
    # commands (one line per module; each module defines register(app))
    from m3lab.cli import estimate; estimate.register(app)  # noqa: E702
    from m3lab.cli import pipeline; pipeline.register(app)  # noqa: E702
    from m3lab.cli import trace; trace.register(app)  # noqa: E702
    from m3lab.cli import gate; gate.register(app)  # noqa: E702
    from m3lab.cli import shapes; shapes.register(app)  # noqa: E702
    from m3lab.cli import env; env.register(app)  # noqa: E702
    from m3lab.cli import fastpaths; fastpaths.register(app)  # noqa: E702
    from m3lab.cli import pd; pd.register(app)  # noqa: E702
    from m3lab.cli import cache; cache.register(app)  # noqa: E702


_register_all()


def main() -> None:
    """Console entry point (``m3lab``)."""
    app()
