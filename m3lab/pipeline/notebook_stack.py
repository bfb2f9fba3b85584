"""What ``m3lab run`` needs beyond m3lab's core: the notebook stack, checked before a run folder exists.

The core (specs, OpTable, kernels, benchmarks) imports without it, so an offline ``pip install --no-deps -e .``
on a GPU image gives a working ``m3lab gate`` but not ``m3lab run``; a missing package is then one line naming
it and the install command (exit 2), never a traceback from a half-made run folder.
"""
from __future__ import annotations

import importlib.util

from m3lab.errors import M3LabError

#: import name -> pip name of what executing a pipeline imports (papermill and the kernel it starts; the
#: notebooks draw with plotly and save with pyarrow).
NEEDED = {"papermill": "papermill", "nbformat": "nbformat", "nbclient": "nbclient",
          "jupyter_client": "jupyter-client", "ipykernel": "ipykernel", "IPython": "ipython", "plotly": "plotly",
          "pyarrow": "pyarrow"}


def missing_packages() -> list[str]:
    """pip names of the notebook stack's packages this Python cannot import."""
    return [pip for name, pip in NEEDED.items() if importlib.util.find_spec(name) is None]


def require_notebook_stack() -> None:
    """Raise one :class:`M3LabError` naming every missing package and the command that installs them."""
    gone = missing_packages()
    if gone:
        raise M3LabError(f"m3lab run executes notebooks, and this Python lacks {', '.join(gone)}",
                         field="environment",
                         hint=f"python3 -m pip install {' '.join(gone)} (offline: README, 'On a GPU box')")
