"""m3lab's parse of every shipped MiniMax M3 config equals vLLM's (MiniMaxM3Config, read as the AMD model reads it)."""
import dataclasses
import json
from pathlib import Path

import pytest

from m3lab.errors import M3LabError
from m3lab.spec.model import CONFIG_DIR, ModelSpec, parse_hf_config
from m3lab.vllm_src import install

needs_vllm = pytest.mark.skipif(not install.available(), reason="vLLM 0.33.0 not installed")
FIELDS = ("layers", "hidden", "heads_q", "heads_kv", "head_dim", "vocab", "experts", "topk", "n_shared",
          "dense_inter", "expert_inter", "shared_inter", "sparse_layers", "moe_layers", "rope_theta", "rotary_dim",
          "swiglu_alpha", "swiglu_limit", "swiglu_beta", "routed_scaling", "mtp_modules", "max_position",
          "rope_scaling", "norm_eps", "qk_norm", "router_bias", "scoring", "tie_embeddings")
SPARSE_FIELDS = ("index_heads", "index_dim", "block_size", "topk_blocks", "init_blocks", "local_blocks",
                 "index_topk_freq", "index_skip_topk_offset")


def _configs(shared_dir: Path) -> list[Path]:
    files = sorted(CONFIG_DIR.glob("minimax-m3*.json")) + sorted((shared_dir / "data/hf_configs").glob("*MiniMax-M3*config.json"))
    assert len(files) >= 5, files  # 2 shipped + BF16, MXFP8, NVFP4 in the shared data
    return files


def _facts(spec: ModelSpec) -> dict:
    out = {f: getattr(spec, f) for f in FIELDS}
    out.update({f"sparse.{f}": getattr(spec.sparse, f) for f in SPARSE_FIELDS})
    out["topk_layers"] = spec.topk_layers
    return out


def _variants(cfg: dict) -> list[dict]:
    """The config as shipped, with index sharing and YaRN under text_config, and without optional keys."""
    shared = json.loads(json.dumps(cfg))
    shared["text_config"].update(use_index_cache=True, index_topk_freq=4, index_skip_topk_offset=2,
                                 rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                               "original_max_position_embeddings": 524288})
    bare = json.loads(json.dumps(cfg))
    for key in ("num_mtp_modules", "max_position_embeddings", "swiglu_beta", "num_nextn_predict_layers"):
        bare["text_config"].pop(key, None)
    bare["text_config"]["sparse_attention_config"].pop("sparse_local_block", None)
    return [cfg, shared, bare]


@needs_vllm
def test_every_shipped_m3_config_parses_as_vllm_does(shared_dir):
    from m3lab.spec.model import spec_via_vllm

    for path in _configs(shared_dir):
        for k, cfg in enumerate(_variants(json.loads(path.read_text()))):
            ours, theirs = parse_hf_config(cfg, name="m", reader="m3lab"), spec_via_vllm(cfg, name="m")
            assert _facts(ours) == _facts(theirs), (path.name, k)
            assert ours == theirs, (path.name, k)   # every ModelSpec field, not only the listed facts


@needs_vllm
def test_vllm_parse_values_and_defaults():
    from m3lab.spec.model import spec_via_vllm

    bf16, shared, bare = _variants(json.loads((CONFIG_DIR / "minimax-m3.json").read_text()))
    m = spec_via_vllm(bf16)
    assert (m.layers, m.hidden, len(m.sparse_layers), len(m.moe_layers), m.mtp_modules, m.max_position) == (
        60, 6144, 57, 57, 7, 1_048_576)
    s = spec_via_vllm(shared)
    assert len(s.topk_layers) == 2 + len(range(2, 57, 4)) and s.rope_scaling_dict["factor"] == 2.0
    b = spec_via_vllm(bare)   # vLLM's defaults: 1 MTP module, 524288 positions, beta 1, local block 0
    assert (b.mtp_modules, b.max_position, b.swiglu_beta, b.sparse.local_blocks) == (1, 524288, 1.0, 0)
    mx8 = parse_hf_config(json.loads((CONFIG_DIR / "minimax-m3-mxfp8.json").read_text()), reader="m3lab")
    assert mx8.mtp_modules == 1 and m.mtp_modules == 7 and dataclasses.replace(mx8, mtp_modules=7, name=m.name) == \
        dataclasses.replace(m, name=m.name)


def test_index_sharing_top_level_is_an_error():
    cfg = json.loads((CONFIG_DIR / "minimax-m3.json").read_text())
    for key, value in (("use_index_cache", True), ("index_topk_freq", 4), ("index_skip_topk_offset", 1)):
        with pytest.raises(M3LabError) as err:
            parse_hf_config({**cfg, key: value})
        assert err.value.field == key and "text_config" in err.value.hint and "\n" not in str(err.value)
    for where in ("top", "text"):
        bad = json.loads(json.dumps(cfg))
        (bad if where == "top" else bad["text_config"])["index_topk_pattern"] = "FSSS"
        with pytest.raises(M3LabError, match="index_topk_pattern.*not a vLLM option"):
            parse_hf_config(bad)
    ok = json.loads(json.dumps(cfg))
    ok["text_config"].update(use_index_cache=True, index_topk_freq=4)
    assert len(parse_hf_config(ok).topk_layers) == 15
    ok["text_config"]["use_index_cache"] = False   # freq without use_index_cache: no sharing (amd/model.py:180)
    assert len(parse_hf_config(ok).topk_layers) == 57


def test_mtp_modules_and_rope_scaling_without_vllm():
    cfg = json.loads((CONFIG_DIR / "minimax-m3.json").read_text())
    assert parse_hf_config(cfg, reader="m3lab").mtp_modules == 7 and parse_hf_config(cfg, reader="m3lab").rope_scaling is None
    cfg["text_config"].pop("num_mtp_modules")
    cfg["text_config"]["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0}
    m = parse_hf_config(cfg, reader="m3lab")
    assert m.mtp_modules == 1 and m.rope_scaling_dict == {"rope_type": "yarn", "factor": 2.0}
    cfg["text_config"]["rope_scaling"] = 2.0
    with pytest.raises(M3LabError, match="rope_scaling"):
        parse_hf_config(cfg, reader="m3lab")


def test_rope_parameters_of_transformers_5():
    cfg = json.loads((CONFIG_DIR / "minimax-m3.json").read_text())
    t = cfg["text_config"]
    for key in ("rope_theta", "partial_rotary_factor", "rotary_dim"):
        t.pop(key)
    t["rope_parameters"] = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5e6, "partial_rotary_factor": 0.25}
    m = parse_hf_config(cfg, reader="m3lab")
    assert (m.rope_theta, m.rotary_dim, m.rope_scaling_dict) == (5e6, 32, {"rope_type": "yarn", "factor": 2.0})


@needs_vllm
def test_the_production_parse_is_vllms(monkeypatch, tmp_path):
    """parse_hf_config hands M3 configs to vLLM's MiniMaxM3Config: a planted change in vLLM's class shows."""
    from m3lab.spec import vllm_config
    monkeypatch.setenv("M3LAB_CACHE_DIR", str(tmp_path))
    cfg = json.loads((CONFIG_DIR / "minimax-m3.json").read_text())
    cfg["text_config"].pop("num_mtp_modules")
    assert parse_hf_config(cfg, name="m").mtp_modules == 1   # vLLM's default
    cls = vllm_config._config_module().MiniMaxM3TextConfig
    init = cls.__init__

    def planted(self, *args, num_mtp_modules=1, **kwargs):
        init(self, *args, num_mtp_modules=3, **kwargs)
    monkeypatch.setattr(cls, "__init__", planted)
    monkeypatch.setenv("M3LAB_CACHE_DIR", str(tmp_path / "fresh"))
    assert parse_hf_config(cfg, name="m").mtp_modules == 3
    assert parse_hf_config(cfg, name="m", reader="m3lab").mtp_modules == 1
