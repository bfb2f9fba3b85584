"""``m3lab shapes`` and ``m3lab model``: JSON contents, acceptance figures, one-line errors (exit 2)."""
import csv
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app

runner = CliRunner()


def _json(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_model_json_m3_figures():
    d = _json(["model", "--model", "minimax-m3", "--tp", "4", "--json"])
    assert d["params_total"] == 426_174_572_928 and round(d["params_active"] / 1e9, 2) == 23.50
    assert d["kv_bytes_per_token"] == 137_472 and d["weight_bytes_per_gpu"] > 0
    fp8 = _json(["model", "--model", "minimax-m3", "--tp", "4", "--kv-dtype", "fp8", "--index-dtype", "fp8", "--json"])
    assert fp8["kv_bytes_per_token_per_rank"] == 22_656
    idx_default = _json(["model", "--model", "minimax-m3", "--tp", "4", "--kv-dtype", "fp8", "--json"])
    assert idx_default["kv_bytes_per_token_per_rank"] == 29_952


def test_shapes_json_tp4_defaults_match_aiter(shared_dir):
    aiter = {(int(r["N"]), int(r["K"])) for r in
             csv.DictReader(open(shared_dir / "data/aiter/a8w8_bpreshuffle_tuned_gemm_minimax_m3.csv"))}
    d = _json(["shapes", "--model", "minimax-m3", "--tp", "4", "--isl", "1024", "--osl", "8", "--concurrency", "4",
               "--fused-shared", "--json"])
    nk = {(g["n"], g["k"]) for g in d["distinct_gemms"]}
    assert nk == aiter | {(128, 6144), (50016, 6144)}
    assert all({"op", "n", "k", "dtype", "m_values"} <= set(g) and g["m_values"] for g in d["distinct_gemms"])
    assert {(g["op"], g["experts"], g["topk"], g["hidden"], g["inter"]) for g in d["grouped_gemms"]} == {
        ("moe_gate_up", 129, 5, 6144, 768), ("moe_down", 129, 5, 6144, 768)}
    tp8 = _json(["shapes", "--tp", "8", "--isl", "256", "--osl", "4", "--concurrency", "2", "--fused-shared", "--json"])
    assert {g["inter"] for g in tp8["grouped_gemms"]} == {384}


SHAPES_M3 = ["shapes", "--model", "minimax-m3", "--tp", "4", "--quant", "mxfp8", "--isl", "512", "--osl", "4",
             "--concurrency", "2", "--json"]


def _gemms(d, op):
    return [g for g in d["distinct_gemms"] if g["op"] == op]


def test_acceptance_mxfp8_tp4_one_fused_projection():
    """`m3lab shapes --model minimax-m3 --tp 4 --quant mxfp8 --json`: no separate indexer GEMM; the sparse
    layers' (2560, 6144) GEMM is MXFP8 (57 layers), the dense layers' (2304, 6144) too (3 layers)."""
    d = _json(SHAPES_M3)
    assert not [g for g in d["distinct_gemms"] if "index" in g["op"]]
    qkv = {(g["n"], g["k"], g["dtype"], g["layers"]) for g in _gemms(d, "qkv_proj")}
    assert qkv == {(2560, 6144, "mxfp8", 57), (2304, 6144, "mxfp8", 3)}
    assert {g["dtype"] for g in d["distinct_gemms"] if g["kind"] == "gemm"} == {"mxfp8"}
    # asked only: vLLM replicates index q (2944 columns) when it runs the MSA indexer context-parallel; with AITER
    # off and a bf16 index cache it runs its Triton CP indexer on the per-rank heads (m3lab fastpaths)
    cp = _json(SHAPES_M3 + ["--indexer-cp"])
    assert {(g["n"], g["layers"]) for g in _gemms(cp, "qkv_proj")} == {(2560, 57), (2304, 3)}
    assert cp["plan"]["indexer_cp"] and not cp["plan"]["index_q_replicated"]
    # AITER on, the shuffled KV layout and an fp8 index cache: vLLM runs the fp8 MSA indexer context-parallel
    msa = _json(SHAPES_M3 + ["--indexer-cp", "--set", "aiter=1", "--set", "shuffle_kv_cache=1",
                             "--set", "index_dtype=fp8"])
    assert {(g["n"], g["layers"]) for g in _gemms(msa, "qkv_proj")} == {(2944, 57), (2304, 3)}
    assert msa["plan"]["index_q_replicated"]


def test_acceptance_shared_expert_fusion():
    """Fusion is off by default (vLLM's default), on when asked, and off under EP even when asked (vLLM's answer,
    with vLLM's reason)."""
    off = _json(SHAPES_M3)
    assert off["shared_expert_fusion"] == {"asked": False, "fused": False, "reason": off["shared_expert_fusion"]["reason"]}
    assert "not asked for" in off["shared_expert_fusion"]["reason"]
    assert {g["experts"] for g in off["grouped_gemms"]} == {128} and _gemms(off, "shared_gate_up")
    on = _json(SHAPES_M3 + ["--fused-shared"])
    assert on["shared_expert_fusion"] == {"asked": True, "fused": True, "reason": None}
    assert {(g["experts"], g["topk"]) for g in on["grouped_gemms"]} == {(129, 5)} and not _gemms(on, "shared_gate_up")
    ep = _json(SHAPES_M3 + ["--ep", "4", "--fused-shared"])
    fusion = ep["shared_expert_fusion"]
    assert fusion["asked"] and not fusion["fused"] and "enable_expert_parallel" in fusion["reason"]
    assert {g["experts"] for g in ep["grouped_gemms"]} == {32}
    assert {(g["n"], g["k"]) for g in _gemms(ep, "shared_gate_up")} == {(1536, 6144)}   # TP-sharded under EP
    # routed and shared both MXFP4 (vLLM serves MXFP4 experts with AITER on only)
    mx4 = _json([*SHAPES_M3[:6], "mxfp4", *SHAPES_M3[7:], "--fused-shared", "--set", "aiter=1"])
    assert mx4["shared_expert_fusion"]["fused"]
    h200 = _json(SHAPES_M3 + ["--hardware", "h200", "--quant", "bf16", "--fused-shared"])  # vLLM's NVIDIA M3: no fusion
    assert h200["shared_expert_fusion"]["asked"] and not h200["shared_expert_fusion"]["fused"]
    assert {g["experts"] for g in h200["grouped_gemms"]} == {128} and _gemms(h200, "shared_gate_up")


def test_acceptance_index_sharing_reuse_layers():
    """freq 4: reuse layers keep the 2560-wide GEMM and run no index norm, RoPE or index-cache write."""
    d = _json(SHAPES_M3 + ["--index-topk-freq", "4"])
    assert {(g["n"], g["layers"]) for g in _gemms(d, "qkv_proj")} == {(2560, 57), (2304, 3)}
    from m3lab.optable import build_optable
    from m3lab.spec import ParallelPlan, load_model
    from m3lab.workload import EngineStep

    df = build_optable(load_model("minimax-m3").with_index_sharing(4), ParallelPlan(tp=4), "mxfp8",
                       EngineStep.decode(1, 1000))
    reuse = [i for i in range(3, 60) if (i - 3) % 4]
    assert len(reuse) == 42
    for layer in reuse:
        r = df[df.layer == layer].set_index("op")
        assert r.loc["qkv_proj", "n"] == 2560
        assert r.loc["qk_norm", "flops"] == 4 * (2048 + 128)          # q and k only: no index q/k norm
        assert r.loc["rope", "flops"] == 3 * (16 + 1) * 64            # q and k only: no index RoPE
        assert r.loc["cache_write", "bytes_kv"] == 2 * 128 * 2        # K and V only: no index-key write
        assert "indexer" not in r.index and "topk" not in r.index


def test_index_sharing_top_level_config_exits_2(tmp_path):
    from m3lab.spec.model import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "minimax-m3.json").read_text())
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**cfg, "use_index_cache": True, "index_topk_freq": 4}))
    res = runner.invoke(app, ["shapes", "--model", str(bad), "--json"])
    assert res.exit_code == 2 and "use_index_cache" in res.stderr and "text_config" in res.stderr


def test_shapes_accepts_config_path(shared_dir):
    cfg = shared_dir / "data/hf_configs/Qwen__Qwen3-30B-A3B__config.json"
    d = _json(["shapes", "--model", str(cfg), "--tp", "2", "--isl", "128", "--osl", "4", "--concurrency", "2", "--json"])
    assert {g["experts"] for g in d["grouped_gemms"]} == {128}


@pytest.mark.parametrize("args, words", [
    (["shapes", "--model", "gpt-17"], ["model", "gpt-17"]),
    (["shapes", "--tp", "3"], ["tp 3"]),
    (["shapes", "--tp", "4", "--ep", "3"], ["ep 3"]),
    (["model", "--quant", "int2"], ["quant"]),
    (["model", "--kv-dtype", "int3"], ["kv_dtype"]),
])
def test_bad_inputs_one_line_exit_2(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith("Error:") and "\n" not in err and all(w in err for w in words), err
    assert "Traceback" not in res.output


def test_malformed_config_through_console(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    out = subprocess.run([sys.executable, "-m", "m3lab", "model", "--model", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "hidden_size" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_model_facts_read_as_bytes_and_say_where_the_weights_fit():
    import json as _json

    from typer.testing import CliRunner

    from m3lab.cli.main import app
    run = CliRunner().invoke(app, ["model", "--model", "minimax-m3", "--tp", "4", "--json"])
    facts = _json.loads(run.output)
    assert isinstance(facts["weight_bytes_per_gpu"], int) and "mi355x" in facts["weights_fit_on"]
    text = CliRunner().invoke(app, ["model", "--model", "minimax-m3", "--tp", "1", "--quant", "bf16"],
                              env={"COLUMNS": "160"}).output
    assert "137,472 B (137 kB)" in text and "852 GB" in text and "no profile" in text
