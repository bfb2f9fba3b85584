"""m3lab: a performance workbench for serving sparse-attention MoE models (MiniMax M3).

Importing the package has no side effects beyond this: in a source tree that was not installed with
the ``kernels/ -> m3lab.kernels`` mapping (``PYTHONPATH=.``, or an old setuptools' legacy develop
install, as on some GPU images), the package path also covers the tree's root so that the top-level
``kernels/`` folder still imports as ``m3lab.kernels``. Installed wheels carry ``m3lab/kernels`` itself.
"""
import os as _os

__version__ = "0.1.0"

_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "kernels")) and _os.path.isfile(
        _os.path.join(_root, "kernels", "__init__.py")) and _root not in __path__:
    __path__.append(_root)  # noqa: F821 - the package's own search path
del _here, _root
