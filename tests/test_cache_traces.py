"""Trace readers, the AgentX-like generator and trace replay (hit rates against an independent count)."""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from m3lab.cache.agentic import AGENTX_MEDIAN_INPUT, AGENTX_MEDIAN_OUTPUT, generate, write_agentx
from m3lab.cache.replay import blocks_for_tokens, replay
from m3lab.cache.trace import MOONCAKE_SYNTHETIC, fixed_length, read_agentx, read_mooncake, read_trace
from m3lab.errors import M3LabError

MOONCAKE = MOONCAKE_SYNTHETIC


def _direct_prefix_reuse(path: Path) -> float:
    """Token-weighted share of prompt tokens whose 512-token prefix block was seen in an earlier request."""
    seen: set = set()
    hit = total = 0
    for line in gzip.open(path, "rt").read().splitlines():
        r = json.loads(line)
        k = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            k += 1
        hit += min(k * 512, r["input_length"])
        total += r["input_length"]
        seen.update(r["hash_ids"])
    return hit / total


def test_mooncake_unlimited_hit_rate_matches_a_direct_count():
    res = replay(read_mooncake(MOONCAKE)).summary()
    assert res["requests"] == 3993 and res["evicted_blocks"] == 0 and res["peak_kv_usage"] is None
    assert abs(res["hit_rate_tokens"] - _direct_prefix_reuse(MOONCAKE)) < 0.01


def test_mooncake_hit_rate_falls_with_capacity():
    trace = read_mooncake(MOONCAKE)
    rates = [replay(trace).summary()["hit_rate_tokens"]]
    for tokens in (8_000_000, 2_000_000, 500_000, 100_000):
        s = replay(trace, num_blocks=blocks_for_tokens(tokens, 128), concurrency=4).summary()
        assert s["evicted_blocks"] > 0 and 0 < s["peak_kv_usage"] <= 1
        rates.append(s["hit_rate_tokens"])
    assert all(a > b for a, b in zip(rates, rates[1:])), rates


def test_vllm_engine_gives_the_same_replay():
    trace = read_mooncake(MOONCAKE, limit=150)
    nb = blocks_for_tokens(300_000, 128)
    ours = replay(trace, "m3lab", num_blocks=nb, concurrency=3)
    ref = replay(trace, "vllm", num_blocks=nb, concurrency=3)
    assert ours.summary()["evicted_blocks"] > 0
    for k in ("requests", "hit_tokens", "query_tokens", "evicted_blocks", "peak_kv_usage", "rejected"):
        assert ours.summary()[k] == ref.summary()[k], k
    assert ours.requests["hit_tokens"].tolist() == ref.requests["hit_tokens"].tolist()


def test_policies_differ_and_lru_is_the_default():
    trace = generate(sessions=12, seed=3, turns_median=12)
    nb = blocks_for_tokens(400_000, 128)
    out = {p: replay(trace, num_blocks=nb, policy=p, concurrency=4).summary() for p in ("lru", "lfu", "radix")}
    assert len({round(s["hit_rate_tokens"], 6) for s in out.values()}) >= 2
    assert replay(trace, num_blocks=nb, concurrency=4).summary()["hit_tokens"] == out["lru"]["hit_tokens"]


def test_malformed_lines_name_the_line_and_skips_are_counted(tmp_path):
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    lines = [json.dumps(good), "{not json", json.dumps({**good, "hash_ids": [1]}), json.dumps({**good, "output_length": -1})]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(M3LabError, match=r"t\.jsonl:2: not valid JSON"):
        read_mooncake(path)
    path.write_text("\n".join([lines[0], lines[2]]) + "\n")
    with pytest.raises(M3LabError, match=r":2: 1 hash_ids .* do not cover input_length 600"):
        read_mooncake(path)
    path.write_text("\n".join(lines) + "\n")
    tr = read_mooncake(path, skip_invalid=True)
    assert len(tr) == 1 and tr.skipped == 3 and tr.summary()["skipped_lines"] == 3
    with pytest.raises(M3LabError, match="unknown trace format"):
        read_trace(path, "csv")


def test_mooncake_blocks_split_deterministically(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 200, "hash_ids": [7, 8, 9]},
            {"timestamp": 5, "input_length": 700, "output_length": 1, "hash_ids": [7, 8]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tr = read_mooncake(path, block_size=128)
    assert tr.keys(0)[:8] == [28, 29, 30, 31, 32, 33, 34, 35]             # 512-token id h -> 4h + j
    assert len(tr.keys(0)) == (1100 + 200) // 128 and min(tr.keys(0)[8:]) < 0  # 8 prompt blocks + output blocks
    assert tr.keys(1) == [28, 29, 30, 31, 32]
    assert replay(tr).summary()["hit_tokens"] == 5 * 128                    # 699 // 128 = 5 blocks may hit


def test_fixed_length_workload_shares_nothing():
    s = replay(fixed_length(50, 1000, 100)).summary()
    assert s["requests"] == 50 and s["hit_tokens"] == 0 and s["query_tokens"] == 50_000


def test_generator_follows_the_published_agentx_figures():
    tr = generate(sessions=1000, seed=0)
    sessions_with_sub = len(np.unique(tr.session[tr.meta["agent"] > 0]))
    assert abs(np.median(tr.prompt) / AGENTX_MEDIAN_INPUT - 1) < 0.10
    assert abs(np.median(tr.output) / AGENTX_MEDIAN_OUTPUT - 1) < 0.10
    assert abs(sessions_with_sub / 1000 - 0.44) < 0.04
    assert tr.prompt.max() + tr.output.max() <= 1_000_000 + 32_768 and tr.prompt.max() > 500_000
    again = generate(sessions=1000, seed=0)
    assert np.array_equal(again.prompt, tr.prompt) and np.array_equal(again.output, tr.output)
    assert not np.array_equal(generate(sessions=1000, seed=1).prompt[:50], tr.prompt[:50])


def test_generated_turns_extend_their_context():
    tr = generate(sessions=20, seed=2)
    for i in np.flatnonzero(tr.after >= 0):
        a = tr.after[i]
        if tr.stream[a] == tr.stream[i]:
            assert tr.prompt[i] > tr.prompt[a] + tr.output[a] - 1
            assert tr.keys(i)[: len(tr.keys(a))] == tr.keys(a)


def test_agentx_format_round_trip(tmp_path):
    tr = generate(sessions=10, seed=5, keep_hash_streams=True, turns_median=8)
    path = write_agentx(tr, tmp_path / "agentx.jsonl")
    back = read_agentx(path)
    assert back.num_sessions == 10 and sorted(back.prompt.tolist()) == sorted(tr.prompt.tolist())
    i = int(np.argmax(tr.prompt))
    j = int(np.flatnonzero(back.prompt == tr.prompt[i])[0])
    n = int(tr.prompt[i]) // 128
    assert back.keys(j)[:n] == tr.keys(i)[:n]
    assert math.isclose(replay(back).summary()["query_tokens"], tr.prompt.sum())
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n" + '{"requests": [{"type": "x"}]}\n')
    with pytest.raises(M3LabError, match=r"bad\.jsonl:2: request type"):
        read_agentx(bad)
    assert read_agentx(bad, skip_invalid=True).skipped == 1
