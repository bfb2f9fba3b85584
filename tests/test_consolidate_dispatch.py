"""The dispatch record names the kernel that ran; contracts (op attributes, plan fields, OpTable columns)
fail loudly on a misspelt name."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from m3lab.dispatch.dispatcher import Dispatcher  # noqa: E402
from m3lab.dispatch.fastpath import CallContext, Condition, FastPath, MissingField  # noqa: E402
from m3lab.dispatch.registry import FastPathRegistry  # noqa: E402
from m3lab.errors import M3LabError  # noqa: E402
from m3lab.kernels.gemm import launcher, tables  # noqa: E402
from m3lab.kernels.gemm.reference import linear_ref, quantize_weight  # noqa: E402
from m3lab.kernels.gemm.tables import DECODE_MAX_M, GemmConfig  # noqa: E402
from m3lab.kernels.launches import recording  # noqa: E402
from m3lab.optable import ops  # noqa: E402

N, K = 48, 64


def _prefill_path() -> FastPath:
    """A path declared like the prefill GEMM path: M above the decode boundary, the tiled kernel declared."""
    return FastPath("gemm.prefill", ("gemm",),
                    (Condition(f"M > {DECODE_MAX_M}", lambda c: c.attrs["m"] > DECODE_MAX_M),),
                    ("gemm_tiled_kernel",), impl=launcher.linear)


@pytest.fixture
def tuned_table(tmp_path, monkeypatch):
    """A tuned table for (N, K, bf16) on this device whose M = 64 entry is split-K and M = 4096 tiled."""
    monkeypatch.setattr(tables, "CONFIG_DIR", tmp_path)
    tables.write_table(tables.table_path(N, K, "bf16", tables.device_name("cpu")),
                       {64: GemmConfig("splitk", 16, 32, 32, SPLIT_K=2), 4096: GemmConfig("tiled", 16, 32, 32)})
    yield
    tables.load_table.cache_clear()


def test_m96_dispatch_records_the_kernel_the_launcher_chose(tuned_table):
    m = 96
    assert m > DECODE_MAX_M                                  # declared as prefill ...
    chosen, _ = launcher.launch_config(m, N, K, "bf16", torch.device("cpu"))
    assert chosen.kernel == "splitk"                         # ... but the table's nearest entry (M 64) is split-K
    d = Dispatcher(plan={"tp": 1}, registry=FastPathRegistry([_prefill_path()]))
    x, w = torch.randn(m, K, dtype=torch.float16), (torch.randn(N, K) / K**0.5).half()
    out = d.call("o_proj", 0, "gemm", linear_ref, {"x": x, "w": w, "w_scale": None},
                 {"m": m, "n": N, "k": K, "w_format": "bf16"}, {"w_format": "bf16"})
    rec = d.records[-1]
    assert rec["path"] == "gemm.prefill" and rec["kernels"] == ["gemm_splitk_kernel"]
    ref = linear_ref(x.float(), w)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-3


def test_mx_prefill_reports_the_dequantisation_and_the_bf16_kernel(tuned_table):
    x = torch.randn(5000 // 50, K, dtype=torch.float16)
    w, s = quantize_weight(torch.randn(N, K) / K**0.5, "mxfp8")
    with recording() as launched:
        launcher.linear(x, w, w_format="mxfp8", w_scale=s, regime="prefill", use_native_mx=False)
    assert launched == ["dequant_mx_kernel", "gemm_tiled_kernel"]
    with recording() as launched:
        launcher.linear(x[:2], w, w_format="mxfp8", w_scale=s, config=GemmConfig("gemv", 2, 16, 64))
    assert launched == ["gemv_splitk_kernel"]


def _ctx(**attrs) -> CallContext:
    return CallContext("attention", 3, "attention", {}, {}, "cuda", {"tp": 4}, attrs)


def test_a_condition_reading_a_misspelt_key_raises():
    cond = Condition("one KV head per rank", lambda c: c.attrs["heads_kvv"] == 1)
    with pytest.raises(MissingField, match="heads_kvv"):
        cond.failure(_ctx(heads_kv=1))
    unset = Condition("one KV head per rank", lambda c: c.attrs["heads_kv"] == 1)
    with pytest.raises(MissingField, match="not set"):
        unset.failure(_ctx(sparse=True))
    assert unset.failure(_ctx(heads_kv=1)) is None and unset.failure(_ctx(heads_kv=2)) == "one KV head per rank"
    with pytest.raises(MissingField, match="tpp"):
        Condition("tp 4", lambda c: c.plan.get("tpp") == 4).failure(_ctx())
    assert _ctx().plan["tp"] == 4 and _ctx().plan.tp == 4


def test_a_call_with_a_misspelt_attribute_raises():
    d = Dispatcher(plan={"tp": 1}, registry=FastPathRegistry([_prefill_path()]))
    x, w = torch.randn(2, K), torch.randn(N, K)
    with pytest.raises(MissingField, match="heads_kvv"):
        d.call("o_proj", 0, "gemm", linear_ref, {"x": x, "w": w}, {"m": 2, "heads_kvv": 1})


def test_an_optable_row_with_a_misspelt_column_raises():
    assert ops.row("x", "norm", m=1.0, flops=2.0)["flops"] == 2.0
    with pytest.raises(M3LabError, match="flopz"):
        ops.row("x", "norm", m=1.0, flopz=2.0)
