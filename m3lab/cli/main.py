"""The ``m3lab`` command: one typer app; each command group lives in its own module."""
import typer

app = typer.Typer(help="m3lab: the MiniMax M3 serving performance workbench.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
