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
               "--json"])
    nk = {(g["n"], g["k"]) for g in d["distinct_gemms"]}
    assert nk == aiter | {(128, 6144), (50016, 6144)}
    assert all({"op", "n", "k", "dtype", "m_values"} <= set(g) and g["m_values"] for g in d["distinct_gemms"])
    assert {(g["op"], g["experts"], g["topk"], g["hidden"], g["inter"]) for g in d["grouped_gemms"]} == {
        ("moe_gate_up", 129, 5, 6144, 768), ("moe_down", 129, 5, 6144, 768)}
    tp8 = _json(["shapes", "--tp", "8", "--isl", "256", "--osl", "4", "--concurrency", "2", "--json"])
    assert {g["inter"] for g in tp8["grouped_gemms"]} == {384}


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
