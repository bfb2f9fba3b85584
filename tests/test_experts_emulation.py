"""MXFP4 experts with AITER off on MI355X: vLLM's OCP MX emulation (the ROCm image has amd-quark), costed as it runs:
every local expert's weights dequantised to BF16 each forward (own launch), then the BF16 fused MoE."""
import numpy as np
import pytest

from m3lab.cost.model import cost_optable
from m3lab.optable import build_optable
from m3lab.serving.dispatch import dispatch_for
from m3lab.spec.dtypes import dtype_bytes, scale_bytes
from m3lab.spec.serving import make_deployment
from m3lab.workload import EngineStep

STEP = EngineStep.decode(8, 4096)


def _costed(**settings):
    d = make_deployment(None, model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp4", concurrency=8, **settings)
    disp = dispatch_for(d)
    disp.check_serves()
    plan = disp.plan(d.plan)
    return d, plan, cost_optable(build_optable(d.model, d.plan, d.quant, STEP, None, disp), d.hardware, "default")


def test_emulated_experts_dequantise_every_local_expert_then_run_bf16():
    d, plan, ot = _costed()
    m = d.model
    moe_layers = [i for i, t in enumerate(m.mlp_types) if t == "moe"]
    deq = ot[ot["op"].str.endswith("_dequant")]
    assert set(deq["op"]) == {"moe_gate_up_dequant", "moe_down_dequant"}
    assert sorted(set(deq["layer"])) == moe_layers and (deq["path"] == "mxfp4_emulation").all()
    experts = plan.experts_local(m) + (m.n_shared if plan.fuses_shared(m) else 0)
    per = dtype_bytes("mxfp4") + scale_bytes("mxfp4")
    for op, n, k in (("moe_gate_up_dequant", 2 * plan.expert_inter_local(m), m.hidden),
                     ("moe_down_dequant", m.hidden, plan.expert_inter_local(m))):
        rows = deq[deq["op"] == op]
        assert np.allclose(rows["bytes_weight"], experts * n * k * per)          # every local expert, not the touched
        assert np.allclose(rows["bytes_compute_written"], experts * n * k * 2)   # BF16 out
        assert (rows["source"] == "elementwise").all() and (rows["t_us"] > 0).all()
    gemms = ot[ot["op"].isin(["moe_gate_up", "moe_down"])]
    assert (gemms["w_dtype"] == "bf16").all() and (gemms["source"] == "triton_moe").all()


def test_aiter_experts_have_no_dequant_and_cost_less():
    _, _, emulated = _costed()
    _, _, aiter = _costed(aiter=1)
    assert not aiter["op"].str.endswith("_dequant").any()
    assert set(aiter.loc[aiter["op"] == "moe_gate_up", "path"]) == {"aiter_mxfp4_mxfp4"}
    moe = lambda t: t.loc[t["op"].str.startswith("moe_"), "t_us"].sum()   # noqa: E731
    assert moe(emulated) > 2 * moe(aiter)
