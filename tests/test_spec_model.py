"""ModelSpec loading: M3 (nested + transformers>=5 flat names), other families, bad configs."""
import copy
import json
from pathlib import Path

import pytest

from m3lab.errors import M3LabError
from m3lab.spec.model import MINI_M3_CONFIG, ModelSpec, list_models, load_model


def test_m3_published_values():
    m = load_model("minimax-m3")
    assert (m.hidden, m.layers, m.heads_q, m.heads_kv, m.head_dim, m.vocab) == (6144, 60, 64, 4, 128, 200064)
    assert (m.experts, m.topk, m.n_shared, m.expert_inter, m.shared_inter, m.dense_inter) == (128, 4, 1, 3072, 3072, 12288)
    assert m.sparse_layers == tuple(range(3, 60)) and m.moe_layers == tuple(range(3, 60))
    assert (m.index_heads, m.index_dim, m.block_size, m.topk_blocks, m.local_blocks, m.init_blocks) == (4, 128, 128, 16, 1, 0)
    assert (m.rope_theta, m.rotary_dim, m.swiglu_alpha, m.swiglu_limit, m.routed_scaling) == (5e6, 64, 1.702, 7.0, 2.0)
    assert m.router_dtype == "fp32" and m.qk_norm == "per_head" and "MiniMax-M3" in m.source
    assert load_model("MiniMaxAI/MiniMax-M3") is m  # Hugging Face id resolves to the named config


def test_index_sharing_schedule():
    m = load_model("minimax-m3")
    assert len(m.topk_layers) == 57  # vLLM default: use_index_cache off
    s = m.with_index_sharing(4)
    assert s.topk_layers == (3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59)
    src = s.topk_source()
    assert src[4] == 3 and src[6] == 3 and src[8] == 7 and src[59] == 59
    off = m.with_index_sharing(4, offset=2)  # ordinals 0..2 compute, then every 4th after the offset
    assert off.topk_layers[:4] == (3, 4, 5, 9)


def test_index_sharing_from_config_overrides(shared_dir):
    cfg = json.loads((shared_dir / "data/hf_configs/MiniMaxAI__MiniMax-M3__config.json").read_text())
    cfg["text_config"].update(use_index_cache=True, index_topk_freq=4)  # --hf-overrides '{"text_config": {...}}'
    assert len(ModelSpec.from_hf_config(cfg).topk_layers) == 15
    with pytest.raises(M3LabError, match="top level"):   # vLLM on ROCm rejects the top-level keys
        ModelSpec.from_hf_config({**cfg, "index_topk_freq": 4})


def _flat_v5(cfg: dict) -> dict:
    """The transformers>=5 flat naming of the same model."""
    t = dict(cfg["text_config"])
    sp = t.pop("sparse_attention_config")
    t.pop("moe_layer_freq")
    t.update(model_type="minimax_m3", index_n_heads=sp["sparse_num_index_heads"], index_head_dim=sp["sparse_index_dim"],
             index_block_size=sp["sparse_block_size"], index_topk_blocks=sp["sparse_topk_blocks"],
             index_local_blocks=sp["sparse_local_block"], hidden_act="silu",
             layer_types=["full_attention" if f == 0 else "minimax_m3_sparse" for f in sp["sparse_attention_freq"]],
             mlp_layer_types=["dense" if f == 0 else "sparse" for f in cfg["text_config"]["moe_layer_freq"]])
    return t


def test_flat_transformers5_names_match_nested():
    nested = ModelSpec.mini()
    flat = ModelSpec.from_hf_config(_flat_v5(MINI_M3_CONFIG), name="minimax-m3-mini")
    for f in ("hidden", "layers", "heads_q", "heads_kv", "attn_types", "mlp_types", "sparse", "experts", "topk",
              "expert_inter", "shared_inter", "dense_inter"):
        assert getattr(flat, f) == getattr(nested, f), f


@pytest.mark.parametrize("name, family, layers, experts, topk, n_shared, dense_layers", [
    ("minimax-m2", "minimax_m2", 62, 256, 8, 0, 0),
    ("llama-3.1-8b", "dense", 32, 0, 0, 0, 32),
    ("mixtral-8x7b", "mixtral", 32, 8, 2, 0, 0),
    ("qwen3-30b-a3b", "qwen_moe", 48, 128, 8, 0, 0),
    ("deepseek-v3", "deepseek", 61, 256, 8, 1, 3),
])
def test_other_families(name, family, layers, experts, topk, n_shared, dense_layers):
    m = load_model(name)
    assert (m.family, m.layers, m.experts, m.topk, m.n_shared) == (family, layers, experts, topk, n_shared)
    assert len(m.dense_mlp_layers) == dense_layers and m.sparse is None and m.source


def test_mini_is_m3_shaped():
    m = load_model("minimax-m3-mini")
    assert m.family == "minimax_m3" and (m.block_size, m.topk_blocks) == (16, 4)
    assert m.attn_types[0] == "dense" and set(m.attn_types[1:]) == {"sparse"} and m.is_moe
    assert "minimax-m3-mini" in list_models() and "minimax-m3" in list_models()


def test_config_file_path(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MINI_M3_CONFIG))
    assert load_model(str(p)).hidden == 256 and load_model(str(tmp_path)).hidden == 256


@pytest.mark.parametrize("mutate, field", [
    (lambda t: t.pop("hidden_size"), "hidden_size"),
    (lambda t: t.update(num_attention_heads="many"), "num_attention_heads"),
    (lambda t: t.update(moe_layer_freq=[0, 1]), "moe_layer_freq"),
    (lambda t: t["sparse_attention_config"].update(sparse_num_index_heads=3), "sparse_num_index_heads"),
    (lambda t: t["sparse_attention_config"].pop("sparse_block_size"), "sparse_block_size"),
])
def test_malformed_config_names_field(mutate, field):
    cfg = copy.deepcopy(MINI_M3_CONFIG)
    mutate(cfg["text_config"])
    with pytest.raises(M3LabError) as err:
        ModelSpec.from_hf_config(cfg)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_unknown_model_and_bad_json(tmp_path):
    with pytest.raises(M3LabError, match="unknown model 'gpt-17'"):
        load_model("gpt-17")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(M3LabError, match="not valid JSON"):
        load_model(str(bad))
    with pytest.raises(M3LabError, match="model_type"):
        ModelSpec.from_hf_config({"model_type": "mamba", "hidden_size": 8})


def test_every_shared_config_loads_or_names_model_type(shared_dir):
    unsupported: set = set()  # qwen3_5_moe (hybrid linear attention) and glm_moe_dsa (MLA + DSA) are modelled now
    files = sorted((shared_dir / "data/hf_configs").glob("*config*.json"))
    assert len(files) >= 10
    for f in files:
        cfg = json.loads(f.read_text())
        if cfg.get("model_type") in unsupported:
            with pytest.raises(M3LabError, match="model_type"):
                load_model(str(f))
        else:
            m = load_model(str(f))
            assert m.layers > 0 and len(m.attn_types) == m.layers


def test_shipped_configs_are_the_shared_copies(shared_dir):
    pairs = {"minimax-m3": "MiniMaxAI__MiniMax-M3__config.json", "minimax-m2": "MiniMaxAI__MiniMax-M2.7__config.json",
             "llama-3.1-8b": "meta-llama__Llama-3.1-8B-Instruct__config.json",
             "deepseek-v3": "deepseek-ai__DeepSeek-V3__config__partial.json"}
    from m3lab.spec.model import CONFIG_DIR
    for name, fname in pairs.items():
        assert json.loads((CONFIG_DIR / f"{name}.json").read_text()) == \
            json.loads((shared_dir / "data/hf_configs" / fname).read_text())


def test_a_shipped_models_record_names_no_checkout_path():
    """The deployment key hashes the model's fields: a shipped config is named relative to m3lab/spec/configs, so
    two clones in different folders key the same deployment the same (raw_config still finds the file)."""
    from m3lab.spec.model import CONFIG_DIR, raw_config
    m = load_model("minimax-m3")
    assert not Path(m.extra["config_file"]).is_absolute() and (CONFIG_DIR / m.extra["config_file"]).is_file()
    assert raw_config(m)["text_config"]["hidden_size"] == m.hidden
