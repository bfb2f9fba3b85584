"""Speculative verification in the reference decoder and the acceptance lengths used by estimates."""
import json

import pytest
import torch

from m3lab.errors import M3LabError
from m3lab.model import build_model
from m3lab.serving.speculation import (acceptance_table, bench_acceptance, fit_acceptance_rate, geometric_accept_len,
                                  greedy_accept, projected_accept_len, rollback, verify_step)

PROMPT = 83   # > topk_blocks x block (4 x 16) of the mini model: the indexer really selects


@pytest.fixture(scope="module")
def model():
    return build_model(None, None, seed=1)


def _prefill(model, seed=3):
    cache = model.new_cache(16)
    prompt = torch.randint(0, model.weights["embed"].shape[0], (PROMPT,), generator=torch.Generator().manual_seed(seed))
    last = int(model.step(cache, [(0, prompt)]).argmax(-1))
    return cache, last


def _sequential(model, cache, last, tokens):
    out = []
    for t in [last] + tokens:
        out.append(model.step(cache, [(0, torch.tensor([t]))])[0])
    return torch.stack(out)


def test_one_step_over_k_plus_1_positions_equals_k_plus_1_decode_steps(model):
    g = torch.Generator().manual_seed(5)
    draft = torch.randint(0, 512, (3,), generator=g).tolist()
    cache_a, last = _prefill(model)
    multi = verify_step(model, cache_a, 0, last, draft)
    cache_b, _ = _prefill(model)
    seq = _sequential(model, cache_b, last, draft)
    assert multi.shape == seq.shape == (4, seq.shape[-1])
    assert not torch.isnan(multi).any()
    torch.testing.assert_close(multi, seq, rtol=1e-4, atol=1e-4)


def test_greedy_acceptance_emits_what_greedy_decoding_emits(model):
    cache_g, last = _prefill(model)
    greedy, t = [], last
    for _ in range(4):
        t = int(model.step(cache_g, [(0, torch.tensor([t]))]).argmax(-1))
        greedy.append(t)
    draft = greedy[:2] + [(greedy[2] + 1) % 512]          # two right, then a wrong token
    cache, _ = _prefill(model)
    n, emitted = greedy_accept(verify_step(model, cache, 0, last, draft), draft)
    assert n == 2 and emitted == greedy[:3]
    rollback(cache, 0, len(draft) - n)
    assert cache.lengths[0] == PROMPT + 1 + n
    nxt = int(model.step(cache, [(0, torch.tensor([emitted[-1]]))]).argmax(-1))
    assert nxt == greedy[3]


def test_all_accepted_gives_the_bonus_token():
    logits = torch.zeros(3, 10)
    logits[torch.arange(3), torch.tensor([4, 7, 1])] = 1
    assert greedy_accept(logits, [4, 7]) == (2, [4, 7, 1])
    assert greedy_accept(logits, [5, 7]) == (0, [4])


def test_acceptance_table_holds_the_published_m3_figures():
    t = acceptance_table()
    pub = t[t["kind"] == "published"].set_index("dataset")
    assert pub.loc["MT-Bench", "accept_len"] == 2.70 and pub.loc["GSM8K", "accept_len"] == 3.52
    assert (pub["k"].loc[["MT-Bench", "GSM8K"]] == 3).all()
    assert "EAGLE3" in pub.loc["MT-Bench", "source"]
    inferred = t[t["kind"].str.startswith("inferred")]
    assert len(inferred) == 2 and inferred["accept_len"].between(1, 6).all()   # the shipped MTP runs


def test_bench_file_spec_decode_fields_are_read(tmp_path):
    raw = {"duration": 10.0, "completed": 4, "total_input_tokens": 400, "total_output_tokens": 40,
           "output_throughput": 4.0, "endpoint_type": "openai", "spec_decode_acceptance_length": 2.5,
           "spec_decode_acceptance_rate": 0.5, "spec_decode_num_drafts": 10, "spec_decode_draft_tokens": 30,
           "spec_decode_accepted_tokens": 15}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(raw))
    row = bench_acceptance(p)
    assert row["accept_len"] == 2.5 and row["k"] == 3 and row["kind"].startswith("measured")


def test_geometric_projection_reproduces_the_published_point():
    a = fit_acceptance_rate(2.70, 3)
    assert geometric_accept_len(a, 3) == pytest.approx(2.70, abs=1e-9)
    assert projected_accept_len(3) == pytest.approx(2.70)
    assert 1 < projected_accept_len(1) < projected_accept_len(2) < 2.70 < projected_accept_len(5) < 6
    with pytest.raises(M3LabError):
        fit_acceptance_rate(5.0, 3)
