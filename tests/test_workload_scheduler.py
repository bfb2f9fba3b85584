"""Scheduler: vLLM v1 continuous batching (decode first, chunked prefill, limits), runs, hooks."""
import numpy as np
import pytest

from m3lab.errors import M3LabError
from m3lab.workload import EngineStep, Scheduler, SchedulerConfig, Workload


def _check_invariants(steps, wl, cfg):
    """Token conservation and per-step limits."""
    prompt, out = wl.lengths()
    computed = {}
    produced = {}
    for s in steps:
        assert s.num_tokens <= cfg.max_num_batched_tokens and s.num_reqs <= cfg.max_num_seqs
        assert len(set(s.req_ids.tolist())) == s.num_reqs
        for rid, n, c in zip(s.req_ids.tolist(), s.new_tokens.tolist(), s.context_lens.tolist()):
            assert c - n == computed.get(rid, 0)  # contexts continue where the last step stopped
            computed[rid] = c
        for rid in s.finished:
            produced[rid] = computed[rid]
    # every request computed its prompt and all but its last output token
    assert produced == {i: int(prompt[i] + out[i] - 1) for i in range(wl.n_requests)}
    # the scheduler's decode flags: one decode per output token after the first, prefill tokens = prompts
    assert sum(int(s.is_decode.sum()) for s in steps) == int((out - 1).sum())
    assert sum(int(s.new_tokens[~s.is_decode].sum()) for s in steps) == int(prompt.sum())


def test_small_workload_by_hand():
    steps = list(Scheduler().steps(Workload(100, 5, 2, num_requests=3)))
    assert [s.num_tokens for s in steps] == [200, 2, 2, 2, 2, 100, 1, 1, 1, 1]
    assert steps[0].first_token == (0, 1) and steps[4].finished == (0, 1) and steps[-1].finished == (2,)
    assert steps[4].context_lens.tolist() == [104, 104]


@pytest.mark.parametrize("chunked", [True, False])
def test_random_workloads_conserve_tokens(chunked):
    rng = np.random.default_rng()
    n = int(rng.integers(5, 30))
    wl = Workload(1, 1, int(rng.integers(1, 8)), prompt_lens=tuple(rng.integers(1, 900, n)),
                  output_lens=tuple(rng.integers(1, 40, n)))
    cfg = SchedulerConfig(max_num_seqs=int(rng.integers(1, 6)), max_num_batched_tokens=1024, chunked_prefill=chunked)
    _check_invariants(list(Scheduler(cfg).steps(wl)), wl, cfg)


def test_decode_first_then_chunk():
    cfg = SchedulerConfig(max_num_batched_tokens=512)
    steps = list(Scheduler(cfg).steps(Workload(1000, 3, 2, num_requests=2)))
    # step 0: 512 of request 0; step 1: 488 of request 0 + 24 of request 1; step 2: decode 0 first, then 511 chunk
    assert [s.new_tokens.tolist() for s in steps[:3]] == [[512], [488, 24], [1, 511]]


def test_runs_collapse_and_expand_consistently():
    wl = Workload(300, 50, 4, num_requests=8)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=256))
    runs = list(sched.runs(wl))
    steps = list(Scheduler(SchedulerConfig(max_num_batched_tokens=256)).steps(wl))
    assert sum(r.repeat for r in runs) == len(steps) and len(runs) < len(steps)
    assert [s.index for s in steps] == list(range(len(steps)))
    assert all((r.step.new_tokens == 1).all() for r in runs if r.repeat > 1)


def test_8k_1k_conc128_about_10k_steps():
    n = sum(r.repeat for r in Scheduler().runs(Workload(8192, 1024, 128, num_requests=1280)))
    assert 9_500 < n < 11_000


def test_kv_capacity_preempts_and_finishes():
    wl = Workload(200, 100, 4, num_requests=6)
    cfg = SchedulerConfig(block_size=16, num_kv_blocks=40)  # fewer blocks than 4 x 300 tokens need
    sched = Scheduler(cfg)
    steps = list(sched.steps(wl))
    assert sched.last_state.preemptions > 0 and sched.last_state.finished == 6
    assert sched.last_state.blocks_used == 0 and sched.core.pool.num_free == 40 - 1


def test_hook_subclass_changes_admission():
    class OneAtATime(Scheduler):
        def can_admit(self, state, request, chunk, admitted):
            return len(state.running) + admitted == 0

    steps = list(OneAtATime().steps(Workload(10, 3, 4, num_requests=4)))
    assert max(s.num_reqs for s in steps) == 1


def test_bad_inputs():
    with pytest.raises(M3LabError, match="isl"):
        Workload(0, 10, 1)
    with pytest.raises(M3LabError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(M3LabError, match="context_lens"):
        EngineStep(np.array([5]), np.array([3]))


def test_one_token_prompts_are_prefills_not_decodes():
    wl = Workload(1, 1, 3, prompt_lens=(1, 40, 1, 7, 1), output_lens=(9, 3, 20, 5, 2))
    cfg = SchedulerConfig(max_num_seqs=2)
    _check_invariants(list(Scheduler(cfg).steps(wl)), wl, cfg)


@pytest.mark.parametrize("asy", [False, True])
def test_collapsed_runs_are_the_exact_steps(asy):
    """Pure-decode stretches collapse without changing a step, and runs() steps are records()' steps."""
    from m3lab.workload.requests import ClosedLoop, UniqueContents

    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(3, 25))
        wl = Workload(1, 1, int(rng.integers(1, 8)), prompt_lens=tuple(rng.integers(1, 400, n)),
                      output_lens=tuple(rng.integers(1, 60, n)))
        cfg = SchedulerConfig(max_num_seqs=int(rng.integers(1, 8)), max_num_batched_tokens=int(rng.integers(64, 600)),
                              block_size=16, num_kv_blocks=None if rng.random() < 0.5 else int(rng.integers(40, 200)),
                              async_scheduling=asy)

        def key(steps):
            return [(s.index, s.new_tokens.tolist(), s.context_lens.tolist(), s.req_ids.tolist(), s.finished,
                     s.is_decode.tolist()) for s in steps]
        fast = key(Scheduler(cfg).steps(wl))
        assert fast == key(Scheduler(cfg, collapse=False).steps(wl))
        prompt, out = wl.lengths()
        recs = Scheduler(cfg).records(UniqueContents(prompt, out), ClosedLoop(n, wl.concurrency))
        assert fast == key(r.engine_step(prompt, i) for i, r in enumerate(x for x in recs if x.scheduled))
