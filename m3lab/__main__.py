"""``python -m m3lab`` is the ``m3lab`` command."""
from m3lab.cli.main import main

main()
