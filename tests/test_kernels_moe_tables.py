"""MoE launch tables in vLLM's format: vLLM's own lookup (installed vllm) returns the configs we export, and
our reader loads every table vLLM ships (MI355 ones included) and the samples in shared/data."""
import glob
import os
from pathlib import Path

import pytest

from m3lab.kernels.moe import tables
from m3lab.kernels.moe.tables import MoeConfig

SHARED_SAMPLES = Path("/work/shared/data/vllm_moe_configs")
# MiniMax M3 at TP4 with the shared expert fused: 129 experts, 768 intermediate columns per rank, top-5
M3_E, M3_N, M3_H, M3_TOPK = 129, 768, 6144, 5


def _fused_moe_module():
    from m3lab.vllm_src.imports import vllm_module
    return vllm_module("vllm.model_executor.layers.fused_moe.fused_moe", "vLLM's fused-MoE config lookup")


def _vllm_dir() -> Path:
    return Path(_fused_moe_module().__file__).parent / "configs"


@pytest.mark.parametrize("w_format", ["bf16"])
def test_vllm_lookup_returns_our_exported_config(tmp_path, monkeypatch, w_format):
    fm = _fused_moe_module()
    ours = {1: MoeConfig(16, 32, 256, 1, 4, 5, "token", 64, 128, 4, 4),
            64: MoeConfig(32, 64, 128, 4, 8, 3, "expert", 128, 64, 8, 3),
            4096: MoeConfig(128, 128, 64, 8, 8, 3, "token", 128, 64, 8, 4)}
    path = tables.write_table(tmp_path / tables.file_name(M3_E, M3_N, "NVIDIA_H200", w_format), ours)
    assert path.name == "E=129,N=768,device_name=NVIDIA_H200.json"
    # vLLM's folder override (vllm/envs.py: VLLM_TUNED_CONFIG_FOLDER); the device name as on an H200 (install
    # notes, pitfall 12: the CPU platform has none); get_moe_configs is lru_cached
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    monkeypatch.setattr(fm, "get_device_name_as_file_name", lambda device_id=0: "NVIDIA_H200_NVL")
    fm.get_moe_configs.cache_clear()
    try:
        assert fm.get_config_file_name(M3_E, M3_N, None) == path.name
        for m, want in ((1, 1), (2, 1), (40, 64), (64, 64), (3000, 4096), (8192, 4096)):
            got = fm.try_get_optimal_moe_config((M3_E, 2 * M3_N, M3_H), (M3_E, M3_H, M3_N), M3_TOPK, None, m)
            assert got == ours[want].vllm_dict(), (m, got)
            assert tables.nearest(tables.load_table(path), m) == ours[want]     # the same rule, ours
    finally:
        fm.get_moe_configs.cache_clear()
    back = tables.load_table(path)
    assert back == ours and back[64].ORDER == "expert"     # the meta file beside it restores the rest


def test_reader_loads_vllms_shipped_tables_and_the_samples():
    files = sorted(glob.glob(str(_vllm_dir() / "*.json"))) + sorted(glob.glob(str(SHARED_SAMPLES / "*.json")))
    assert len(files) > 300 and any("MI355" in f for f in files) and any(str(SHARED_SAMPLES) in f for f in files)
    for f in files:
        raw = tables.read_vllm_table(f)
        if ",backend=" in f:                                   # another backend's keys (tile_m, ...)
            assert all("tile_m" in v for v in raw.values()), f
            with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
                tables.load_table(Path(f))
            continue
        table = tables.load_table(Path(f))
        assert table and set(table) == set(raw), f
        for m, cfg in table.items():
            assert cfg.vllm_dict() == raw[m], (f, m)          # nothing lost, AMD keys kept as read
    mi355 = tables.load_table(next(Path(f) for f in files if "MI355" in f))
    assert any(c.extra for c in mi355.values())


def test_file_names_follow_vllm():
    assert tables.vllm_device_name(name="NVIDIA_H200_NVL") == "NVIDIA_H200"
    assert tables.file_name(129, 768, "NVIDIA_H200", "mxfp8") == "E=129,N=768,device_name=NVIDIA_H200,dtype=mxfp8.json"
    assert tables.meta_path(Path("E=129,N=768,device_name=NVIDIA_H200.json")).name == \
        "E=129,N=768,device_name=NVIDIA_H200.m3lab.json"
    with pytest.raises(ValueError, match="ORDER"):
        MoeConfig(ORDER="diagonal")
    with pytest.raises(ValueError, match="meta"):
        MoeConfig.from_dicts(MoeConfig().vllm_dict(), {"SPLITS": 2})


def test_committed_tables_load():
    for f in glob.glob(str(tables.CONFIG_DIR / "E=*.json")):
        if not f.endswith(tables.META_SUFFIX):
            assert tables.load_table(Path(f)), f
