"""Differential test: every decision the resolver prints equals what vLLM's own code returns on the emulated
platform, asked by an independent route (vLLM's selectors called directly, ``tests/vllm_probe.py``).

The grid: MI355X, MI300X and H200 x TP 1/2/4/8 x EP x bf16/mxfp8/mxfp4 x AITER on/off x shuffled KV
x shared-expert fusion x KV and index-cache dtypes x EAGLE3 x indexer CP x decode / prefill sizes: 200
distinct deployments, each at one drawn step size (about half of them vLLM refuses, with its own message). It can fail: a planted change in one of vLLM's conditions shows up in the
independent route and in the resolver, and a resolution taken before the plant no longer matches; an
edited restated row no longer matches its independent expectation.
"""
import importlib
import random

import pytest

from m3lab.spec.serving import deployment
from m3lab.vllm import workers
from m3lab.vllm_src import install
from m3lab.vllm.emulate import Target
from m3lab.vllm.fastpaths import plan_of, resolve

pytestmark = pytest.mark.skipif(not install.available(), reason="vLLM 0.33.0 not installed")
probe = importlib.import_module("tests.vllm_probe")  # importable by name in the worker processes too

# hardware -> how many configurations of the grid to draw for it
DRAWS = {"mi300x": 30, "h200": 40, "mi355x": 130}  # MI355X last: its worker (and H200's) stay for later tests
STEPS = (("decode", 8), ("decode", 32), ("prefill", 2048))  # one drawn per deployment


def _draw(rng: random.Random, rocm: bool) -> tuple:
    """One point of the grid; the switches that make vLLM refuse most deployments (indexer CP, an fp8 index
    cache) are drawn less often, so most drawn deployments start and every op is compared."""
    def p(x: float) -> bool:
        return rng.random() < x
    return (rng.choice(("bf16", "mxfp8", "mxfp4") if rocm else ("bf16",)), rng.choice((1, 2, 4, 8)), p(0.5),
            int(p(0.6)), int(p(0.5)), p(0.5), "fp8" if p(0.5) else "bf16", "fp8" if p(0.3) else "bf16", p(0.25),
            p(0.15))


def _grid() -> list:
    """(deployment, phase, tokens) drawn from the grid: >= 200 distinct deployments, one step size each."""
    rng = random.Random(23)
    out = []
    for hw, n in DRAWS.items():
        seen: set[str] = set()
        while len(seen) < n:
            quant, tp, ep, aiter, shuffle, fse, kv, index, eagle, cp = _draw(rng, hw.startswith("mi"))
            model = "minimax-m3-mxfp8" if quant == "mxfp8" else "minimax-m3"
            d = deployment(model, hw, quant, tp=tp, ep=tp if ep and tp > 1 else 1, fused_shared_expert=fse)
            sets = {"aiter": str(aiter), "shuffle_kv_cache": str(shuffle), "kv_dtype": kv, "index_dtype": index,
                    "indexer_cp": str(int(cp))}
            if eagle:
                sets.update(spec_method="eagle3", spec_tokens="3")
            d = d.with_settings(sets)
            if repr(d) not in seen:  # EP 1 at TP 1 either way
                seen.add(repr(d))
                out.append((d, *rng.choice(STEPS)))
    return out


GRID = _grid()


def _row(res, op, kind):
    return next((d for d in res.decisions if d.op == op and d.layer_kind == kind), None)


def differences(res, want: dict) -> list[str]:
    """What the resolver printed that differs from the independent route's answer."""
    out = []
    if ("refused", "any") in want:
        return [] if res.refused else [f"vLLM refuses, the resolver does not ({res.decisions[:1]})"]
    if res.refused:
        return [f"the resolver says refused: {res.refused[0].note}"]
    for (op, kind), value in want.items():
        if (op, kind) == ("fse", "plan"):  # the effective plan's fusion answer (the OpTable's expert rows)
            if plan_of(res).fuses_shared(res.deployment.model) != value:
                out.append(f"effective plan fuses_shared {not value}, vLLM {value}")
            continue
        row = _row(res, op, kind)
        got = (row.shape.n if row is not None and op == "qkv_proj" else row.path if row is not None else None)
        if got != value:
            out.append(f"{op}/{kind}: resolver {got!r}, vLLM {value!r}")
    return out


@pytest.mark.slow
def test_every_decision_equals_vllms_own_answer():
    """>= 200 distinct deployments; per step every row the probe can ask vLLM about directly is compared."""
    assert len({repr(d) for d, _, _ in GRID}) >= 200 and {(p, t) for _, p, t in GRID} == set(STEPS)
    failures, compared = [], 0
    for dep, phase, tokens in GRID:
        tokens = tokens * dep.serving.decode_query_len if phase == "decode" else tokens
        res = resolve(dep, tokens=tokens, phase=phase)
        want = workers.call(Target.of(dep.hardware), probe.expected, dep, tokens, phase)
        compared += len(want)
        failures += [f"{dep.hardware.name} {dep.to_vllm()} {phase} {tokens}: {x}" for x in differences(res, want)]
    assert not failures, "\n".join(failures[:20])
    assert compared >= 1000


def test_a_planted_change_in_vllms_condition_is_caught():
    """AiterMxfp8Experts made to refuse expert parallelism (in the worker): the independent route and the
    resolver both follow vLLM, and the resolution taken before the plant no longer matches (the test's
    comparison fails)."""
    dep = deployment("minimax-m3-mxfp8", "mi355x", "mxfp8", tp=4, ep=4).with_settings({"aiter": "1"})
    got = workers.call(Target.of(dep.hardware), probe.planted_ep, dep, 32)
    assert got == {"before": "aiter_mxfp8_flydsl", "probe_planted": "triton_mxfp8_native",
                   "resolver_planted": "triton_mxfp8_native"}
    before = resolve(dep, tokens=32)
    assert differences(before, {("experts", "sparse"): got["probe_planted"]})  # the differential would fail


RESTATED = {("allreduce_norm", "sparse"): "flashinfer_fused_ar_norm_or_nccl"}  # CUDA, TP > 1


def test_restated_rows_equal_their_independent_expectation():
    """The rows m3lab restates (flashinfer's fused all-reduce on CUDA) against this test's own expectation;
    editing the restated rule (in the worker) makes the comparison fail."""
    dep = deployment("minimax-m3", "h200", "bf16", tp=4)
    res = resolve(dep, tokens=32)
    assert [(d.op, d.layer_kind) for d in res.restated] == [("allreduce_norm", k) for k in ("dense", "sparse")]
    assert not differences(res, RESTATED)
    res.decisions = workers.call(Target.of(dep.hardware), probe.edited_restated, dep, 32)
    assert differences(res, RESTATED) == ["allreduce_norm/sparse: resolver 'nccl_then_norm', vLLM "
                                          "'flashinfer_fused_ar_norm_or_nccl'"]

