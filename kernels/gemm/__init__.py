"""y = x @ W^T for bf16/fp8/MXFP8/MXFP4 weights: reference, two Triton kernels, tuned tables, launcher."""
