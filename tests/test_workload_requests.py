"""The fake model's draws and the chained block keys, drawn or chained ahead, equal the one-at-a-time definitions."""
import random

import pytest

from m3lab.workload import chains
from m3lab.workload.requests import FakeOutputs, KeyContents


@pytest.mark.parametrize("p", [0.0, 0.35, 0.8, 0.999, 1.0])
def test_accepted_run_equals_accepted(p):
    rng = random.Random(7)
    for seed in (0, 3, 2**63 + 5):
        out = FakeOutputs(p=p, seed=seed)
        for _ in range(10):
            rid, start, k = rng.randrange(10**7), rng.randrange(10**6), rng.randrange(6)
            run = out.accepted_run(rid, start, 40, k)
            assert run == [out.accepted(rid, start + i, k) for i in range(40)]
            for fewer in range(k):
                assert [min(a, fewer) for a in run] == [out.accepted(rid, start + i, fewer) for i in range(40)]


def _direct(raw: list, n: int, lookahead: int, rid: int) -> list:
    """The chained keys one block at a time (no prefix shared with another request)."""
    return chains.chain(raw, n, lookahead, -1 - rid, [])


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_block_keys_share_prefixes_exactly(lookahead):
    rng = random.Random(lookahead)
    system = [rng.randrange(50) for _ in range(6)]
    streams = [system + [rng.randrange(50) for _ in range(60)] for _ in range(4)]
    keys, prompt, out = [], [], []
    for _ in range(60):                       # turns over growing contexts, forks, and unrelated requests
        s = rng.choice(streams)
        n = rng.randrange(0, len(s))
        raw = s[:n] if rng.random() < 0.8 else s[:n // 2] + [rng.randrange(50) for _ in range(n - n // 2)]
        keys.append(raw)
        out.append(rng.randrange(1, 3))
        prompt.append(max(len(raw) * 4 - out[-1] - rng.randrange(6), 1))
    contents = KeyContents(keys, prompt, out, 4)
    for rid in rng.sample(range(60), 60):
        n = (prompt[rid] + out[rid] - lookahead) // 4
        assert contents.block_keys(rid, 4, lookahead) == _direct(keys[rid][:n + 1], n, lookahead, rid)


def test_a_planted_reuse_of_a_longer_prefix_is_caught(monkeypatch):
    """The prefix shared with a neighbour is what is reused: claiming one block more breaks the equality."""
    monkeypatch.setattr(chains, "common_prefix", lambda a, b: min(len(a), len(b)))
    contents = KeyContents([[1, 2, 3, 4], [1, 2, 9, 9]], [16, 16], [1, 1], 4)
    contents.block_keys(0, 4)
    assert contents.block_keys(1, 4) != _direct([1, 2, 9, 9], 4, 0, 1)
