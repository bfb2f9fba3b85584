"""m3lab: a performance workbench for serving sparse-attention MoE models (MiniMax M3).

Importing the package has no side effects; submodules are imported on demand.
"""
__version__ = "0.1.0"
