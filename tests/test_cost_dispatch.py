"""The cost follows vLLM's dispatch: every path the resolver returns has a cost source, the OpTable follows the
resolver's structure, and each fast path changes only the ops it touches (mechanics, not figures)."""
import dataclasses
import re

import numpy as np
import pytest

from m3lab.cost import paths, sources
from m3lab.cost.assumptions import ASSUMPTIONS
from m3lab.errors import M3LabError
from m3lab.optable import build_optable
from m3lab.optable.dispatch import OP_DECISION
from m3lab.serving.breakdown import decode_step_breakdown
from m3lab.serving.dispatch import dispatch_for
from m3lab.serving.step_cost import StepCoster, cost_step
from m3lab.spec.serving import make_deployment
from m3lab.vllm.fastpaths import resolve
from m3lab.workload.step import EngineStep

# the persistent FFN kernel's preconditions (MXFP4 experts, BF16 attention, fp8 KV and index caches, no sharing)
MONO = {"quant": "mxfp4", "model": "minimax-m3", "kv_dtype": "fp8", "index_dtype": "fp8", "monokernel": True,
        "moe_backend": "aiter", "model_runner_v2": True, "index_topk_freq": 1}
# deployments that reach every family of decisions: AITER on/off, shuffle, fusion, sharing, dtypes, spec, TP,
# EP, formats, platforms
GRID = [
    ("mxfp8-tp4-baseline", {}), ("mxfp8-tp4-optimised", {}), ("mxfp4-tp2", {}), ("eagle3-mxfp8-tp4", {}),
    ("h200-bf16-tp4", {}), ("mxfp8-tp4-baseline", {"aiter": True}),
    ("mxfp8-tp4-optimised", {"kv_dtype": "fp8", "index_dtype": "fp8"}),
    ("mxfp8-tp4-optimised", {"ep": 4}), ("mxfp8-tp4-optimised", {"tp": 8}), ("mxfp8-tp4-baseline", {"tp": 1}),
    ("mxfp8-tp4-optimised", {"quant": "bf16", "model": "minimax-m3"}),
    ("mxfp8-tp4-baseline", {"quant": "mxfp4", "model": "minimax-m3"}),
    ("mxfp8-tp4-optimised", {"indexer_cp": True}), ("mxfp8-tp4-baseline", {"indexer_cp": True}),
    ("mxfp8-tp4-baseline", {"hardware": "mi300x"}), ("h200-bf16-tp4", {"hardware": "b200"}),
    ("mxfp8-tp4-optimised", {"moe_backend": "triton"}), ("mxfp8-tp4-baseline", {"cudagraph_mode": "PIECEWISE"}),
    ("mxfp8-tp4-optimised", MONO),
]
SIZES = [("decode", 1), ("decode", 32), ("decode", 128), ("decode", 512), ("prefill", 64), ("prefill", 8192)]


def _resolutions():
    for preset, settings in GRID:
        d = make_deployment(preset, settings)
        for phase, tokens in SIZES:
            if d.serving.spec_tokens and phase == "decode":
                tokens *= d.serving.decode_query_len
            try:
                yield (preset, settings, phase, tokens), resolve(d, tokens=tokens, phase=phase)
            except M3LabError:   # a deployment the resolver rejects as input (not a vLLM path)
                continue


def missing_cost_sources(resolutions, table) -> list[str]:
    """Every (path, op) the resolutions return that ``table`` cannot cost."""
    missing = []
    for where, res in resolutions:
        for x in res.decisions:
            entry = table.get(x.path)
            if entry is None:
                missing.append(f"{x.path} ({x.op}, {x.status}) at {where}")
            elif not isinstance(entry, str) and "*" not in entry:
                missing.append(f"{x.path} has no default source")
    return sorted(set(missing))


@pytest.fixture(scope="module")
def resolutions():
    return list(_resolutions())


def test_every_path_the_resolver_returns_has_a_cost_source(resolutions):
    assert len(resolutions) > 60
    assert missing_cost_sources(resolutions, paths.PATH_COST) == []
    used = {src for entry in paths.PATH_COST.values()
            for src in ([entry] if isinstance(entry, str) else entry.values())} - {None}
    assert used - {"none"} <= set(sources.SOURCES)


def documented_paths() -> set[str]:
    """The path ids the resolver documents (``m3lab.vllm.fastpaths``' docstring, after "Op names")."""
    from m3lab.vllm import fastpaths
    return set(re.findall(r"``([a-z0-9_]+)``", fastpaths.__doc__.split("Op names", 1)[1]))


def test_every_cost_source_belongs_to_a_path_the_resolver_can_return():
    """No dead entries: every PATH_COST key is a path id the resolver documents (the grid above proves the
    converse for the paths it reaches)."""
    assert set(paths.PATH_COST) - documented_paths() == set()
    planted = {**paths.PATH_COST, "rccl_then_triton_norm": "rccl"}
    assert set(planted) - documented_paths() == {"rccl_then_triton_norm"}


def test_a_path_without_a_cost_source_is_caught(resolutions):
    planted = {k: v for k, v in paths.PATH_COST.items() if k != "aiter_sparse_pa"}
    assert any(m.startswith("aiter_sparse_pa") for m in missing_cost_sources(resolutions, planted))
    with pytest.raises(M3LabError, match="no cost source"):
        paths.source_of("attention", "attention", "a_new_vllm_path")


def test_every_named_assumption_is_used_and_every_used_one_is_named():
    import inspect
    text = inspect.getsource(sources)
    assert all(f'"{name}"' in text for name in ASSUMPTIONS if not name.startswith("generic_")), \
        "an assumption no source reads"
    for a in ASSUMPTIONS.values():
        assert a.low <= a.value <= a.high and a.source and a.kind in ("efficiency", "floor")


def test_every_optable_row_of_the_presets_maps_to_a_running_decision():
    for preset in ("mxfp8-tp4-baseline", "mxfp8-tp4-optimised", "mxfp4-tp2", "eagle3-mxfp8-tp4"):
        d = make_deployment(preset)
        disp = dispatch_for(d)
        step = EngineStep.mixed(16, 9000, 4096, 4096)
        ot = build_optable(d.model, d.plan, d.quant, step, None, disp)
        resolved = ot[ot["op"].isin(list(OP_DECISION))]
        assert resolved["path"].notna().all(), resolved[resolved["path"].isna()]["op"].unique()
        assert set(ot.loc[ot["op"] == "attention", "phase"]) == {"decode", "prefill"}  # mixed: both launch


def _by_op(d, **kw):
    t = decode_step_breakdown(d, batch=32, context=8704, **kw)
    return t.groupby("op").agg(us=("us", "sum"), bytes=("bytes", "sum"), calls=("calls", "max"),
                               path=("path", lambda p: ",".join(sorted(set(p)))))


def _changed(a, b) -> set:
    ops = set(a.index) | set(b.index)
    return {op for op in ops if op not in a.index or op not in b.index
            or not np.isclose(a.loc[op, "us"], b.loc[op, "us"], rtol=1e-9)
            or a.loc[op, "path"] != b.loc[op, "path"]}


BASE = make_deployment("mxfp8-tp4-baseline", {"concurrency": 32})


@pytest.mark.parametrize("switch, touches", [
    ({"fused_shared_expert": True}, {"experts", "routing", "shared_gate_up", "activation", "shared_down"}),
    ({"index_topk_freq": 4}, {"indexer", "qk_norm_rope_insert"}),
    ({"aiter": True}, {"experts", "routing", "allreduce_norm", "lm_head"}),
])
def test_each_switch_changes_only_the_ops_it_touches(switch, touches):
    before, after = _by_op(BASE), _by_op(BASE.with_settings(switch))
    changed = _changed(before, after)
    assert changed and changed <= touches, changed - touches
    assert before["us"].sum() != after["us"].sum()


def test_the_page_adapter_adds_the_attend_and_table_ops_only():
    aiter = BASE.with_settings({"aiter": True})
    before, after = _by_op(aiter), _by_op(aiter.with_settings({"shuffle_kv_cache": True}))
    assert _changed(before, after) <= {"attention", "indexer", "qk_norm_rope_insert", "page_table"}
    assert "page_table" not in before.index   # the adapter off: no table builder at all


def test_a_requested_path_that_vllm_turns_off_costs_nothing_extra():
    """FSE asked for under EP: vLLM turns it off, so the step costs exactly what it costs unasked."""
    ep = BASE.with_settings({"ep": 4})
    asked = ep.with_settings({"fused_shared_expert": True})
    assert any(c.status == "off" for c in dispatch_for(asked).choices["decode"].values())
    a, b = decode_step_breakdown(ep, batch=32, context=8704), decode_step_breakdown(asked, batch=32, context=8704)
    assert a["us"].sum() == pytest.approx(b["us"].sum(), rel=1e-12)


def test_index_sharing_removes_the_indexer_from_the_reuse_layers():
    shared = _by_op(BASE.with_settings({"index_topk_freq": 4}))
    full = _by_op(BASE)
    assert full.loc["indexer", "calls"] == 57 and shared.loc["indexer", "calls"] == 15
    assert shared.loc["indexer", "us"] == pytest.approx(full.loc["indexer", "us"] * 15 / 57, rel=1e-9)


def test_long_contexts_cost_what_they_read():
    """The indexer reads every request's whole-context index keys; the attend only its top-k blocks."""
    short, long_ = (decode_step_breakdown(BASE, batch=16, context=c).set_index("op") for c in (8192, 65536))
    idx = long_.loc["indexer", "bytes"] / short.loc["indexer", "bytes"]
    att = long_.loc["attention"]
    att = att[att["path"] == "triton_sparse"]["bytes"].sum() / \
        short.loc["attention"][short.loc["attention"]["path"] == "triton_sparse"]["bytes"].sum()
    assert 7.5 < idx < 8.1 and att == pytest.approx(1.0, abs=0.01)
    assert long_.loc["indexer", "us"] > 4 * short.loc["indexer", "us"]


def test_a_mixed_step_costs_the_decode_and_the_prefill_kernels():
    d = BASE
    mixed = cost_step(d, EngineStep.mixed(31, 8704, 2048, 6144), calibration="default")
    att = mixed[(mixed["op"] == "attention") & (mixed["layer"] == 3)].set_index("phase")
    assert set(att.index) == {"decode", "prefill"}
    assert "_gqa_sparse_decode_kernel" in att.loc["decode", "kernel"]
    assert "_gqa_sparse_fwd_kernel" in att.loc["prefill", "kernel"]
    alone = cost_step(d, EngineStep.decode(31, 8704), calibration="default")
    dec_alone = alone[(alone["op"] == "attention") & (alone["layer"] == 3)]["t_us"].iloc[0]
    assert att.loc["decode", "t_us"] == pytest.approx(dec_alone, rel=1e-9)


def test_speculative_verify_takes_the_spec_peers():
    spec = make_deployment("eagle3-mxfp8-tp4", {"concurrency": 32, "accept_len": 2.7})
    plain = spec.with_settings({"spec_method": None, "spec_tokens": 0, "accept_len": None})
    a, b = (cost_step(x, EngineStep(np.full(32, 1 + x.serving.spec_tokens), np.full(32, 8704),
                                    decode_mask=np.ones(32, bool)), calibration="default") for x in (spec, plain))
    ea = a[(a["op"] == "attention") & (a["layer"] == 3)]["efficiency"].iloc[0]
    eb = b[(b["op"] == "attention") & (b["layer"] == 3)]["efficiency"].iloc[0]
    assert ea > eb   # the 4-row verify runs at the measured q=4 efficiency, higher than 1-row decode


def test_host_time_hook_adds_its_time_to_the_calibrated_step_only():
    from m3lab.cost.model import resolve_calibration
    cal = resolve_calibration(BASE.hardware, "default")
    plain = StepCoster(BASE, cal)
    hooked = StepCoster(BASE, cal, host_time=lambda step: 100.0 + step.num_reqs)
    step = EngineStep.decode(8, 4000)
    assert hooked.time_us(step, "calibrated") == pytest.approx(plain.time_us(step, "calibrated") + 108.0)
    assert hooked.time_us(step, "ceiling") == pytest.approx(plain.time_us(step, "ceiling"))
    host = hooked.op_totals("calibrated").set_index("op").loc["host_time"]
    assert host["t_us"] == pytest.approx(108.0) and host["kind"] == "host"
    assert "host_time" not in set(plain.op_totals("calibrated")["op"])
    bad = StepCoster(BASE, cal, host_time=lambda step: float("nan"))
    with pytest.raises(M3LabError, match="host_time"):
        bad.time_us(step, "calibrated")


def test_refused_deployments_do_not_cost():
    refused = make_deployment("mxfp4-tp2", {"index_dtype": "bf16"})   # 2 KV heads/rank, no MSA table emitter
    if not dispatch_for(refused).refused():
        pytest.skip("the resolver no longer refuses this deployment")
    with pytest.raises(M3LabError, match="vLLM refuses"):
        StepCoster(refused)


def test_dispatch_is_cached_on_disk_and_read_back(tmp_path, monkeypatch):
    from m3lab.serving import dispatch as dmod
    monkeypatch.setenv("M3LAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dmod, "_CACHE", {})
    d = make_deployment("mxfp8-tp4-optimised", {"concurrency": 7})
    first = dispatch_for(d)
    assert list((tmp_path / "dispatch").glob("*.json"))
    monkeypatch.setattr(dmod, "_CACHE", {})
    monkeypatch.setattr(dmod, "_resolve", lambda *a: pytest.fail("resolved again despite the disk cache"))
    again = dispatch_for(d)
    assert again.choices == first.choices and again.tokens == first.tokens
    other = dataclasses.replace(d, serving=dataclasses.replace(d.serving, aiter=False))
    with pytest.raises(pytest.fail.Exception):
        dispatch_for(other)   # another deployment is not read from this entry


def test_rows_the_monokernel_replaces_are_costed_as_its_launch():
    """Where vLLM marks the replaced ops skipped and runs the monokernel, their rows take its path and source."""
    d = make_deployment("mxfp8-tp4-optimised", dict(MONO, concurrency=8))
    disp = dispatch_for(d)   # built with the launch's --block-size 128, vLLM starts the monokernel
    assert disp.choice("monokernel", "sparse", "decode").path == "mono_ffn"
    assert {disp.choice(op, "sparse", "decode").status for op in ("allreduce_norm", "router", "routing", "experts")} \
        == {"skipped"}   # vLLM's runtime substitutes the layer after attention
    ot = build_optable(d.model, d.plan, d.quant, EngineStep.decode(8, 4000), None, disp)
    sparse = ot[ot["layer"] == 3].set_index("op")
    assert sparse.loc["moe_gate_up", "path"] == "mono_ffn" and sparse.loc["allreduce_ffn", "path"] == "mono_ffn"
    assert sparse.loc["attention", "path"] != "mono_ffn"
    from m3lab.cost.model import cost_optable
    c = cost_optable(ot, d.hardware, "default")
    assert set(c.loc[c["path"] == "mono_ffn", "source"]) == {"monokernel"}


def test_the_all_reduce_is_costed_by_the_communicator_vllm_built():
    # one path (allreduce_then_norm), three communicators: the decision's kernel names which one all-reduces
    # (vLLM's own custom all-reduce for a decode message with AITER off, AITER's with it on, RCCL above 8 MiB)
    floors = {}
    steps = {"decode": EngineStep.decode(8, 2048), "prefill": EngineStep.prefill(2048)}
    for preset, phase in (("mxfp8-tp4-baseline", "decode"), ("mxfp8-tp4-baseline", "prefill"),
                          ("mxfp8-tp4-optimised", "decode")):
        t = cost_step(make_deployment(preset, {}), steps[phase])
        ar = t[(t.kind == "allreduce") & (t.path == "allreduce_then_norm")]
        assert len(ar), preset
        floors[preset, phase] = set(ar.floor_term)
        assert all(("custom all-reduce" in k.lower()) == (f == {"custom_allreduce_us"})
                   for k, f in zip(ar.kernel, [floors[preset, phase]] * len(ar)))
    assert floors == {("mxfp8-tp4-baseline", "decode"): {"custom_allreduce_us"},
                      ("mxfp8-tp4-baseline", "prefill"): {"rccl_allreduce_us"},
                      ("mxfp8-tp4-optimised", "decode"): {"custom_allreduce_us"}}
    assert paths.source_of("allreduce_attn", "allreduce", "allreduce_then_norm", "RCCL / NCCL all-reduce") == "rccl"
