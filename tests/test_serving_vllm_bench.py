"""vLLM bench result readers: current and older formats, per-GPU figures, malformed files."""
import json
import math
import random

import pytest

from m3lab.errors import M3LabError
from m3lab.serving.vllm_bench import bench_table, parse_bench_result, read_bench_result


def _current(rng):
    out_tok = rng.randint(1000, 9000)
    return {"date": "20260101-000000", "endpoint_type": "openai", "backend": "openai", "model_id": "m",
            "num_prompts": 10, "request_rate": "inf", "max_concurrency": 8, "duration": 10.0, "completed": 10,
            "failed": 0, "total_input_tokens": 5000, "total_output_tokens": out_tok, "request_throughput": 1.0,
            "request_goodput": None, "output_throughput": out_tok / 10.0, "total_token_throughput": (5000 + out_tok) / 10,
            "mean_ttft_ms": 120.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 300.0, "mean_tpot_ms": 20.0,
            "median_tpot_ms": 19.0, "mean_itl_ms": 20.0, "p99.9_itl_ms": 50.0}


def test_current_format_and_per_gpu():
    rng = random.Random()
    raw = _current(rng)
    res = parse_bench_result(raw)
    assert res.format == "vllm bench serve" and math.isinf(res.request_rate)
    gpus = rng.choice([1, 2, 4, 8])
    row = res.per_gpu(gpus)
    assert row["output_tokens_per_s_per_gpu"] == pytest.approx(raw["output_throughput"] / gpus)
    assert row["median_ttft_s"] == pytest.approx(0.1)
    assert res.stat("itl", "p99.9") == 50.0


def test_older_format_with_typo_key_is_read():
    raw = _current(random.Random())
    del raw["endpoint_type"], raw["request_goodput"]
    raw.update({"best_of": 1, "request_goodput:": None, "p90_tpot_ms": 22.0})
    res = parse_bench_result(raw)
    assert res.format == "benchmark_serving (older)"
    assert res.stat("tpot", "p90") == 22.0


def test_shared_samples(shared_dir):
    files = sorted((shared_dir / "data" / "vllm_bench").glob("*.json"))
    table = bench_table(files, 4)
    assert len(table) == 3
    qwen = table[table["model_id"].str.contains("Qwen3.5")].iloc[0]
    assert qwen["format"] == "benchmark_serving (older)"
    assert qwen["output_tokens_per_s_per_gpu"] == pytest.approx(1865.52 / 4, rel=1e-3)
    assert read_bench_result(files[-1]).format == "vllm bench serve"


def test_malformed_files(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(M3LabError, match="not valid JSON"):
        read_bench_result(p)
    p.write_text(json.dumps([1, 2]))
    with pytest.raises(M3LabError, match="JSON object"):
        read_bench_result(p)
    raw = _current(random.Random())
    del raw["duration"]
    p.write_text(json.dumps(raw))
    with pytest.raises(M3LabError, match="missing key"):
        read_bench_result(p)
    raw = _current(random.Random())
    raw["completed"] = "ten"
    with pytest.raises(M3LabError, match="'completed'"):
        parse_bench_result(raw)
    with pytest.raises(M3LabError, match="gpus"):
        parse_bench_result(_current(random.Random())).per_gpu(0)
