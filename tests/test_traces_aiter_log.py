"""AITER log lines -> (op, shape key, chosen kernels)."""
import gzip

import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.traces import load_trace, read_aiter_log, summarize
from m3lab.traces.aiter_log import moe_key, parse_aiter_line


def _moe_line(tokens, kn1="moe_stage1_ck_256x64", kn2="moe_stage2_ck_64x128"):
    return (f"(Worker_TP0 pid=1) [aiter] [fused_moe] using 2stage (kernelName1='{kn1}', kernelName2='{kn2}') "
            f"for ('gfx950', 256, {tokens}, 6144, 768, 129, 5, 'ActivationType.Swiglu', 'torch.bfloat16', "
            f"'torch.float8_e4m3fn', 'torch.float8_e4m3fn', 'QuantType.per_1x32', True, False)")


def test_fused_moe_tuned_and_default():
    tokens = int(np.random.default_rng().integers(1, 9000))
    row = parse_aiter_line(_moe_line(tokens))
    assert row["op"] == "fused_moe" and row["tuned"] and row["variant"] == "2stage"
    assert row["kernels"] == ["moe_stage1_ck_256x64", "moe_stage2_ck_64x128"]
    assert (row["m"], row["n"], row["k"], row["experts"], row["topk"]) == (tokens, 768, 6144, 129, 5)
    assert row["gfx"] == "gfx950" and row["cu_num"] == 256
    default = parse_aiter_line("[aiter] [fused_moe] using 1stage default for (304, 2048, 7168, 256, 256, 8, "
                               "<ActivationType.Silu: 0>, torch.bfloat16, torch.float8_e4m3fnuz, "
                               "torch.float8_e4m3fnuz, QuantType.per_1x128, True, False)")
    assert not default["tuned"] and default["kernels"] == [] and default["experts"] == 256
    assert moe_key("(304, 2048, 7168, 256, 256, 8, <ActivationType.Silu: 0>)")["act_type"] == "ActivationType.Silu"
    bare = parse_aiter_line("[aiter] [fused_moe] using 2stage (kernelName1=a_kern, kernelName2=b_kern) for "
                            "('gfx950', 256, 64, 6144, 768, 129, 5)")
    assert bare["kernels"] == ["a_kern", "b_kern"]


def test_gemm_lines():
    hit = parse_aiter_line("[aiter] shape is M:64, N:6144, K:3072 dtype='torch.bfloat16' otype='torch.bfloat16' "
                           "bias=False, scaleAB=False, bpreshuffle=True found padded_M: 64, N:6144, K:3072 is tuned "
                           "on cu_num = 256 in /cfg/bf16_tuned_gemm.csv, libtype is asm, kernel name is bf16gemm_64x64")
    assert (hit["op"], hit["tuned"], hit["kernels"], hit["m"], hit["cu_num"], hit["libtype"], hit["variant"]) == \
        ("gemm", True, ["bf16gemm_64x64"], 64, 256, "asm", "bf16_tuned_gemm")
    miss = parse_aiter_line("[aiter] shape is M:1024, N:151936, K:5120, not found tuned config in "
                            "/tmp/a8w8_tuned_gemm.csv, will use default config!")
    assert not miss["tuned"] and miss["kernels"] == [] and miss["variant"] == "a8w8_tuned_gemm"
    assert parse_aiter_line("INFO 12-01 loading weights") is None


def test_read_log_file_gzip_and_summary(tmp_path):
    rng = np.random.default_rng()
    n = int(rng.integers(2, 20))
    lines = ["INFO starting"] + [_moe_line(int(t)) for t in rng.integers(1, 512, n)] + ["done"]
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    log = load_trace(path)
    assert log.attrs["format"] == "aiter-log" and len(log) == n and log["line"].min() == 2
    s = summarize(log)
    assert s["calls"].sum() == n


def test_log_without_dispatch_lines(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("[aiter] hello\n")
    with pytest.raises(M3LabError, match="no AITER dispatch lines"):
        read_aiter_log(path)
