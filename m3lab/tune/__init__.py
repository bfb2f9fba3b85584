"""Tuners that benchmark candidate launch configs on the GPU and write the kernels' config tables."""
