"""The ``m3lab`` command line (typer). See :mod:`m3lab.cli.main`."""
