"""The vllm.mxfp8_linear gate runs vLLM's own launcher and quantiser: a planted change in either fails it."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: the launcher runs on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.gates.runner import run_gates  # noqa: E402
from m3lab.vllm_src import install  # noqa: E402

pytestmark = pytest.mark.skipif(not install.available(), reason="vLLM 0.33.0 not installed")


def _gate():
    return run_gates("cpu", names=["vllm.mxfp8_linear"], perf=False)


def test_a_planted_change_in_vllms_quantiser_fails_the_gate(monkeypatch):
    from vllm.model_executor.layers.quantization.utils import mxfp8_utils
    torch_quantiser = mxfp8_utils._mxfp8_e4m3_quantize_torch

    def doubled_scales(x, *args, **kwargs):
        q, scales = torch_quantiser(x, *args, **kwargs)
        return q, scales + 1   # E8M0: one more in the exponent doubles every block's scale
    monkeypatch.setattr(mxfp8_utils, "_mxfp8_e4m3_quantize_torch", doubled_scales)
    df = _gate()
    assert len(df) == 4 and not df["passed"].any() and df["case"].str.endswith("vllm-torch-quant").all()


def test_a_planted_change_in_vllms_launcher_fails_the_gate(monkeypatch):
    from m3lab.gates.vllm_gemm import _linear_module
    mod = _linear_module()
    launcher = mod._mxfp8_dot_scaled_linear
    monkeypatch.setattr(mod, "_mxfp8_dot_scaled_linear", lambda x, w, s, *a, **k: launcher(x, w, s, *a, **k)[:, :-1])
    assert not _gate()["passed"].any()
