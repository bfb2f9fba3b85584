"""Hardware profiles and quantisation schemes."""
import pytest

from m3lab.errors import M3LabError
from m3lab.spec import list_hardware, load_hardware, load_quant
from m3lab.spec.quant import weight_bytes


def test_profiles_present_with_sources():
    assert set(list_hardware()) >= {"mi355x", "mi325x", "mi300x", "h200", "b200"}
    for name in list_hardware():
        hw = load_hardware(name)
        assert hw.source and hw.hbm_bw > 1e12 and hw.hbm_bytes > 1e11
        assert all(hw.peak(d) > 1e14 for d in ("bf16", "fp8", "mxfp8", "mxfp4"))
    mi = load_hardware("mi355x")
    assert (mi.peak("fp8"), mi.peak("mxfp4"), mi.hbm_bw, mi.native_mx) == (5.0e15, 1.01e16, 8.0e12, True)
    assert load_hardware("h200").measured["hbm_read_bw"] == 4.4e12 and not load_hardware("h200").native_mx


def test_user_yaml_profile(tmp_path):
    p = tmp_path / "mygpu.yaml"
    p.write_text("name: mygpu\npeak_flops: {bf16: 1e15, fp8: 2e15, mxfp8: 2e15, mxfp4: 4e15}\n"
                 "hbm_bw: 3e12\nhbm_bytes: 9.6e10\nsource: me\n")
    hw = load_hardware(str(p))
    assert hw.ridge("bf16") == pytest.approx(1e15 / 3e12)
    p.write_text("name: broken\npeak_flops: {bf16: 1e15}\nhbm_bw: 3e12\nhbm_bytes: 1\n")
    load_hardware.__globals__["_load_file"].cache_clear()
    with pytest.raises(M3LabError, match="peak_flops"):
        load_hardware(str(p))
    with pytest.raises(M3LabError, match="unknown hardware"):
        load_hardware("tpu-v9")


def test_quant_presets_follow_m3_checkpoints():
    mx8 = load_quant("mxfp8")
    # the index projections are part of the fused qkv GEMM: MXFP8 like qkv (the checkpoint's ignored_layers)
    assert mx8.weight_dtype("routed_expert") == "mxfp8" and mx8.weight_dtype("indexer_qk") == "mxfp8" == \
        mx8.weight_dtype("attn_qkv")
    assert mx8.weight_dtype("router") == "fp32" and mx8.weight_dtype("lm_head") == "bf16"
    mx4 = load_quant("mxfp4")
    assert mx4.weight_dtype("shared_expert") == "mxfp4" and mx4.weight_dtype("attn_qkv") == "bf16"
    assert mx4.weight_dtype("dense_mlp") == "bf16"
    assert load_quant("bf16").with_cache("fp8", "fp8").index_dtype == "fp8"
    with pytest.raises(M3LabError, match="kv_dtype"):
        load_quant("bf16").with_cache("int3")
    with pytest.raises(M3LabError, match="quant"):
        load_quant("int2")


def test_scale_bytes_counted():
    assert weight_bytes(3200, "mxfp8") == 3200 + 100
    assert weight_bytes(3200, "mxfp4") == 1600 + 100
    assert weight_bytes(3200, "bf16") == 6400
