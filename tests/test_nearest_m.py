"""One nearest-M rule (vLLM's, first key on ties) and one reader of vLLM's fused-MoE table format."""
import json

import pytest

from m3lab.errors import M3LabError
from m3lab.kernels.gemm import tables as gemm_tables
from m3lab.kernels.moe import tables as moe_tables
from m3lab.kernels.nearest import nearest_key
from m3lab.vllm import moe_tables as vllm_tables


def _vllm_rule(configs: dict, m: int):
    """vLLM's expression, as written in vllm/model_executor/layers/fused_moe/fused_moe.py:try_get_optimal_moe_config."""
    return configs[min(configs.keys(), key=lambda x: abs(x - m))]


@pytest.mark.parametrize("m", [0, 1, 5, 8, 12, 16, 24, 32, 48, 100, 10_000])
def test_every_lookup_is_vllms_rule(m):
    table = {1: "a", 8: "b", 16: "c", 32: "d", 64: "e"}       # ties at M = 12 (8|16), 24 (16|32), 48 (32|64)
    want = _vllm_rule(table, m)
    assert table[nearest_key(table, m)] == want
    assert gemm_tables.nearest(table, m) == want and moe_tables.nearest(table, m) == want
    assert table[vllm_tables.nearest(table, m)] == want


def test_a_tie_takes_the_first_key_which_is_the_smaller_m_in_a_table_read_from_disk(tmp_path):
    assert nearest_key([8, 16], 12) == 8 and nearest_key([16, 8], 12) == 16     # first key, as vLLM
    path = tmp_path / "E=8,N=64,device_name=GPU_X.json"
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}
    path.write_text(json.dumps({"16": {**entry, "num_warps": 8}, "8": entry}))    # written out of order
    table = moe_tables.read_vllm_table(path)
    assert list(table) == [8, 16] and vllm_tables.nearest(table, 12) == 8 and moe_tables.nearest(table, 12) == table[8]
    assert nearest_key([], 3) is None and gemm_tables.nearest({}, 3) is None


def test_one_reader_one_treatment_of_keys_that_are_not_token_counts(tmp_path):
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}
    good = tmp_path / "E=8,N=64,device_name=GPU_X.json"
    good.write_text(json.dumps({"triton_version": "3.6.0", "1": entry}))
    assert moe_tables.read_vllm_table(good) == vllm_tables.read_table(good) == {1: entry}   # dropped, as vLLM does
    bad = tmp_path / "E=8,N=32,device_name=GPU_X.json"
    bad.write_text(json.dumps({"1": entry, "comment": "tuned by hand"}))
    with pytest.raises(ValueError, match="comment"):
        moe_tables.read_vllm_table(bad)
    with pytest.raises(M3LabError, match="comment"):
        vllm_tables.read_table(bad)
    bad.write_text("{not json")
    with pytest.raises(M3LabError, match="not a readable JSON table"):
        vllm_tables.read_table(bad)


def test_m3labs_reader_is_the_kernels_reader(monkeypatch, tmp_path):
    path = tmp_path / "E=8,N=64,device_name=GPU_X.json"
    path.write_text("{}")
    monkeypatch.setattr(vllm_tables, "read_vllm_table", lambda p: {7: {"planted": True}})
    assert vllm_tables.read_table(path) == {7: {"planted": True}}
