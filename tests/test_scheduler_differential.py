"""m3lab's step generator against vLLM 0.33.0's own ``Scheduler`` / ``AsyncScheduler`` (CPU, fake model outputs).

Both schedulers get the same limits, the same requests as token ids (shared prefixes are shared ids), the same
arrival rule ("added before ``schedule()`` call n") and the same fake model (keyed draft acceptance), and must
produce the same step records: tokens per request, computed tokens before the step, draft tokens verified,
admissions with prefix-hit tokens, preemptions, finishes, running / waiting counts and free KV blocks. Hand-made
cases pin documented behaviours; 500 seeded random workloads cover mixed lengths, shared prefixes, finite KV
pools that force preemption, ``max_num_seqs`` / ``max_num_batched_tokens`` limits, chunked prefill on and off,
prefix caching, ngram and MTP spec decoding, sync and async scheduling. Planted changes of m3lab's rules
(monkeypatched here) must make the comparison fail. vLLM is built once per process (``VLLM_CACHE_ROOT`` keeps its
model-info cache between runs).
"""
from __future__ import annotations

import numpy as np
import pytest

from m3lab.vllm import scheduler_judge
from m3lab.workload.engine_core import EngineCore
from m3lab.workload.requests import (AtCalls, ClosedLoop, FakeOutputs, KeyContents, TokenContents, UniqueContents,
                                    first_divergence)
from m3lab.workload.scheduler import Scheduler, SchedulerConfig

RANDOM_WORKLOADS = 500


def both(cfg, contents, outputs=None, arrivals=None, concurrency=None):
    """(m3lab's records, vLLM's records) for one workload; ``arrivals`` a factory of fresh arrival rules."""
    outputs = outputs or FakeOutputs()
    make = arrivals or (lambda: ClosedLoop(len(contents), concurrency or len(contents)))
    theirs = scheduler_judge.Judge(cfg, contents, outputs, arrivals=make()).run()
    ours = Scheduler(cfg, outputs=outputs).records(contents, make())
    return ours, theirs


def assert_same(cfg, contents, **kwargs):
    ours, theirs = both(cfg, contents, **kwargs)
    diff = first_divergence(ours, theirs)
    assert diff is None, f"{cfg}\n{diff}"
    return theirs


# ---- hand-made cases ----------------------------------------------------------------------------------
@pytest.mark.parametrize("asy", [False, True])
def test_chunked_prefill_admits_one_chunk_per_step(asy):
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512, block_size=16, num_kv_blocks=2000,
                          async_scheduling=asy)
    rec = assert_same(cfg, UniqueContents([512] * 8, [16] * 8))
    assert rec[0].scheduled == {0: 512} and rec[1].scheduled == {0: 1, 1: 511}
    assert rec[2].scheduled == {0: 1, 1: 1, 2: 510}
    assert sum(r.num_tokens for r in rec) == 8 * (512 + 15)            # the last output needs no forward pass


@pytest.mark.parametrize("asy", [False, True])
def test_preemption_recomputes_and_admits_nothing_in_that_step(asy):
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, block_size=16, num_kv_blocks=130,
                          async_scheduling=asy)
    rec = assert_same(cfg, UniqueContents([600] * 6, [200] * 6))
    hit = [r for r in rec if r.preempted]
    assert hit and all(not r.admitted for r in hit)                     # vLLM: no admission in a preempting step
    resumed = [a for r in rec for a in r.admitted if a[2]]
    assert resumed and all(h == 0 for _, h, _ in resumed)               # no prefix caching: recompute from 0
    victim = hit[0].preempted[0]
    assert rec[rec.index(hit[0]) - 1].computed and victim == max(rec[rec.index(hit[0]) - 1].computed)


def test_prefix_hits_within_one_step_and_replay():
    shared = list(range(64))
    prompts = [shared + [1000 + 30 * i + j for j in range(20)] for i in range(4)]
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, block_size=16, num_kv_blocks=200,
                          prefix_caching=True)
    rec = assert_same(cfg, TokenContents(prompts, [4] * 4))
    assert rec[0].admitted == ((0, 0, False), (1, 64, False), (2, 64, False), (3, 64, False))  # cached at allocation
    again = assert_same(cfg, TokenContents(prompts + prompts, [4] * 8), arrivals=lambda: AtCalls([0] * 4 + [40] * 4))
    assert [h for r in again for rid, h, _ in r.admitted if rid >= 4] == [80] * 4   # whole blocks of 84 - 1 tokens


def test_mtp_block_keys_cover_the_next_token():
    shared = list(range(64))
    prompts = [shared + [500, 501, 502], shared + [600, 601, 602]]
    base = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_kv_blocks=100,
                           prefix_caching=True)
    plain = assert_same(base, TokenContents(prompts, [3, 3]), concurrency=1)
    mtp = assert_same(base.replace(spec_method="mtp", spec_tokens=2), TokenContents(prompts, [3, 3]), concurrency=1)
    hits = [[h for r in rec for rid, h, _ in r.admitted if rid == 1] for rec in (plain, mtp)]
    assert hits == [[64], [48]]                                         # the last shared block's next token differs


@pytest.mark.parametrize("method", [None, "mtp"])
def test_trace_keys_and_own_blocks_after_preemption(method):
    """Block keys as traces give them (every token of block i is key i), and a preempted request's own cached
    blocks hit when it resumes."""
    keys = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 10, 11, 12], [1, 2, 13, 14, 15, 16], [1, 2, 3, 4, 5, 17, 18]]
    contents = KeyContents(keys, [40, 36, 33, 38], [90, 76, 70, 80], 16)      # outputs outgrow the pool
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_kv_blocks=20,
                          prefix_caching=True, spec_method=method, spec_tokens=2 if method else 0)
    rec = assert_same(cfg, contents, concurrency=4)
    assert any(h for r in rec for _, h, res in r.admitted if not res)            # shared trace blocks hit
    resumed = [h for r in rec for _, h, res in r.admitted if res]
    assert resumed and max(resumed) > 0                   # its blocks (shared or its own) came back cached


@pytest.mark.parametrize("method,asy", [("ngram", False), ("mtp", False), ("mtp", True)])
def test_spec_decoding_verifies_k_drafts(method, asy):
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, block_size=16, num_kv_blocks=400,
                          spec_method=method, spec_tokens=3, async_scheduling=asy)
    rec = assert_same(cfg, UniqueContents([100] * 6, [40] * 6), outputs=FakeOutputs(p=0.7, seed=3))
    verify = [n for r in rec for rid, n in r.scheduled.items() if rid in r.spec]
    assert verify and set(verify) == {4} and len(rec) < 6 * 40         # 1 + k tokens; fewer steps than tokens


def test_async_refill_comes_one_call_later():
    lengths = UniqueContents([64] * 4, [30] * 4)
    spans = []
    for asy in (False, True):
        rec = assert_same(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=128, block_size=16,
                                          num_kv_blocks=100, async_scheduling=asy), lengths, concurrency=2)
        done = next(r.call for r in rec if 0 in r.finished)          # the step that produced its last token
        spans.append(next(r.call for r in rec if 2 in r.scheduled) - done)
    assert spans == [1, 2]      # async: its output is applied after the next schedule(), which runs empty


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=300, block_size=16, num_kv_blocks=200,
                          chunked_prefill=False)
    rec = assert_same(cfg, UniqueContents([200, 200, 50], [5, 5, 5]))
    assert rec[0].scheduled == {0: 200, 2: 50} or rec[0].scheduled == {0: 200}


@pytest.mark.parametrize("method,caching", [("ngram", False), ("ngram", True), ("mtp", False), ("mtp", True)])
def test_lookahead_facts_are_vllms(method, caching):
    cfg = SchedulerConfig(block_size=16, num_kv_blocks=64, prefix_caching=caching, spec_method=method, spec_tokens=3)
    facts = scheduler_judge.lookahead_facts(cfg)
    assert facts == {"num_lookahead_tokens": cfg.lookahead_tokens,
                     "num_hash_lookahead_tokens": cfg.hash_lookahead_tokens,
                     "num_prefill_lookahead_tokens": cfg.prefill_lookahead_tokens}


# ---- 500 seeded random workloads ------------------------------------------------------------------------
def random_workload(seed: int):
    """(config, contents, arrival-rule factory, fake outputs): sizes kept small so 500 run in well under a minute."""
    rng = np.random.default_rng(seed)
    bs = int(rng.choice([4, 8, 16]))
    n = int(rng.integers(3, 24))
    roots = [rng.integers(0, 50, int(rng.integers(1, 12)) * bs).tolist() for _ in range(3)]
    prompts = []
    for _ in range(n):
        head = []
        if rng.random() < 0.6:
            root = roots[int(rng.integers(0, 3))]
            head = root[:int(rng.integers(1, len(root) + 1))]
        prompts.append(head + rng.integers(0, 50, int(rng.integers(1, 6 * bs))).tolist())
    max_tokens = rng.integers(1, int(rng.choice([8, 40, 120])), n)
    method = rng.choice([None, "ngram", "mtp"])
    k = int(rng.integers(1, 4)) if method else 0
    contents = TokenContents(prompts, max_tokens)
    need = -(-(max(len(p) + m for p, m in zip(prompts, max_tokens)) + k + 2) // bs) + 1
    chunked = bool(rng.random() < 0.8)
    budget = int(rng.integers(max(8, 1 + k), 200))
    cfg = SchedulerConfig(max_num_seqs=int(rng.integers(1, min(12, budget))), max_num_batched_tokens=budget if chunked else
                          max(budget, contents.max_model_len(k)), block_size=bs,   # vLLM's rule without chunking
                          num_kv_blocks=int(rng.integers(need + 1, need * (2 if rng.random() < 0.5 else 5))),
                          chunked_prefill=chunked, prefix_caching=bool(rng.random() < 0.6), spec_method=method,
                          spec_tokens=k, async_scheduling=bool(rng.random() < 0.5))
    if rng.random() < 0.3:
        calls = np.sort(rng.integers(0, 60, n))
        make = lambda: AtCalls(calls)                              # noqa: E731
    else:
        conc = int(rng.integers(1, n + 1))
        make = lambda: ClosedLoop(n, conc)                         # noqa: E731
    return cfg, contents, make, FakeOutputs(p=float(rng.uniform(0.3, 0.95)), seed=seed)


@pytest.fixture(scope="module")
def random_cases():
    """The random workloads with vLLM's records (computed once for the comparison and the planted changes)."""
    cases = []
    for seed in range(RANDOM_WORKLOADS):
        cfg, contents, make, outputs = random_workload(seed)
        theirs = scheduler_judge.Judge(cfg, contents, outputs, arrivals=make()).run()
        cases.append((seed, cfg, contents, make, outputs, theirs))
    return cases


def test_random_workloads_match_vllm(random_cases):
    seen = dict(preempted=0, prefix_hits=0, resumed_hits=0, spec=0, mtp=0, ngram=0, async_=0, unchunked=0,
                at_calls=0, steps=0)
    for seed, cfg, contents, make, outputs, theirs in random_cases:
        arrivals = make()
        ours = Scheduler(cfg, outputs=outputs).records(contents, arrivals)
        diff = first_divergence(ours, theirs)
        assert diff is None, f"seed {seed}: {cfg}\n{diff}"
        seen["preempted"] += any(r.preempted for r in theirs)
        seen["prefix_hits"] += any(h for r in theirs for _, h, res in r.admitted if not res)
        seen["resumed_hits"] += any(h for r in theirs for _, h, res in r.admitted if res)
        seen["spec"] += any(r.spec for r in theirs)
        seen["mtp"] += cfg.spec_method == "mtp"
        seen["ngram"] += cfg.spec_method == "ngram"
        seen["async_"] += cfg.async_scheduling
        seen["unchunked"] += not cfg.chunked_prefill
        seen["at_calls"] += isinstance(arrivals, AtCalls)
        seen["steps"] += len(theirs)
    # every feature is exercised by a good share of the workloads (so the comparison above covers it)
    assert min(v for k, v in seen.items() if k != "steps") >= 50, seen
    assert seen["steps"] > 30_000, seen


# ---- planted changes of m3lab's rules must be caught ---------------------------------------------------------
def _plant_admit_in_preempting_step(mp):
    mp.setattr(EngineCore, "ADMIT_IN_PREEMPTING_STEP", True)


def _plant_admit_first_chunk_only(mp):
    mp.setattr(EngineCore, "FULL_SEQUENCE_MUST_FIT", False)


def _plant_preempt_oldest(mp):
    mp.setattr(EngineCore, "_victim", lambda self, running: 0)


def _plant_no_mtp_lookahead_slots(mp):
    mp.setattr(Scheduler, "lookahead_tokens", lambda self: 0)


def _plant_sync_rules_when_async(mp):
    orig = EngineCore.__init__

    def init(self, cfg, *args, **kwargs):
        orig(self, cfg, *args, **kwargs)
        self.cfg = cfg.replace(async_scheduling=False)
    mp.setattr(EngineCore, "__init__", init)


@pytest.mark.parametrize("plant", [_plant_admit_in_preempting_step, _plant_admit_first_chunk_only,
                                   _plant_preempt_oldest, _plant_no_mtp_lookahead_slots,
                                   _plant_sync_rules_when_async])
def test_a_planted_change_is_caught(plant, random_cases, monkeypatch):
    plant(monkeypatch)
    for seed, cfg, contents, make, outputs, theirs in random_cases:
        try:
            ours = Scheduler(cfg, outputs=outputs).records(contents, make())
        except Exception:                                   # a broken rule may also crash or stall: caught too
            return
        if first_divergence(ours, theirs) is not None:
            return
    pytest.fail(f"{plant.__name__} went unnoticed by {len(random_cases)} workloads")


# ---- the decode-stretch shortcut of records() is exact ------------------------------------------------------
def _stretch_cases():
    """The random workloads, and each again without spec decoding (where stretches can happen), with a pool of
    no pressure too."""
    for seed in range(RANDOM_WORKLOADS):
        cfg, contents, make, outputs = random_workload(seed)
        plain = cfg.replace(spec_method=None, spec_tokens=0)
        for c in (cfg, plain, plain.replace(num_kv_blocks=None if not cfg.prefix_caching else 10_000)):
            yield seed, c, contents, make, outputs


def _stretch_mismatch(count: dict | None = None) -> str | None:
    for seed, cfg, contents, make, outputs in _stretch_cases():
        exact = Scheduler(cfg, outputs=outputs, collapse=False).records(contents, make())
        fast = Scheduler(cfg, outputs=outputs).records(contents, make())
        diff = first_divergence(fast, exact)
        if diff is not None:
            return f"seed {seed}: {cfg}\n{diff}"
        if count is not None and any(a.scheduled is b.scheduled for a, b in zip(fast, fast[1:])):
            count["stretched"] += 1                    # stretch records share one dict of ones
            count["caching"] += cfg.prefix_caching
            count["finite"] += cfg.num_kv_blocks is not None
            count["async_"] += cfg.async_scheduling
            count["resumed_hits"] += any(h for r in exact for _, h, res in r.admitted if res)
    return None


def test_decode_stretches_write_the_exact_records():
    """records() advances pure-decode stretches at once (collapse, the default, as in the comparison with vLLM
    above); on every differential workload it writes the records of the call-by-call path."""
    count = dict(stretched=0, caching=0, finite=0, async_=0, resumed_hits=0)
    assert _stretch_mismatch(count) is None
    assert min(count.values()) >= 20, count


def _plant_stretch_forgets_cached_blocks(mp):
    orig = EngineCore.decode_stretch

    def stretch(self, budget_steps=1 << 62, records=None):
        saved = self.pool.cache_blocks if self.pool is not None else None
        if saved is not None:
            self.pool.cache_blocks = lambda *a, **k: None
        try:
            return orig(self, budget_steps, records)
        finally:
            if saved is not None:
                del self.pool.cache_blocks
    mp.setattr(EngineCore, "decode_stretch", stretch)


def _plant_stretch_frees_no_block(mp):
    mp.setattr(EngineCore, "_stretch_free", lambda self, c0, have, R, free: np.full(R, free))


def _plant_stretch_applies_async_at_once(mp):
    orig = EngineCore._stretch_records

    def recs(self, R, prev, free):
        out = orig(self, R, prev, free)
        for r in out[:-1]:
            if r.applied is not None:
                r.applied = r.call + 1
        return out
    mp.setattr(EngineCore, "_stretch_records", recs)


@pytest.mark.parametrize("plant", [_plant_stretch_forgets_cached_blocks, _plant_stretch_frees_no_block,
                                   _plant_stretch_applies_async_at_once])
def test_a_planted_stretch_change_is_caught(plant, monkeypatch):
    plant(monkeypatch)
    assert _stretch_mismatch() is not None, f"{plant.__name__} went unnoticed"
