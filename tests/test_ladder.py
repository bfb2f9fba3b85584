"""The optimisation ladder and the advisor: their mechanics, never their figures.

A fix that is off costs nothing extra; each fix changes only the ops it names (through the decode step's per-op
breakdown); the ladder's steps compose to the target deployment; the advisor ranks by gain and never lists a fix
the deployment has. The write-up's per-fix figures appear only beside an estimate of the configuration they state.
Planted changes prove the checks can fail.
"""
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from m3lab import published
from m3lab.cli.main import app
from m3lab.cost.model import resolve_calibration
from m3lab.errors import M3LabError
from m3lab.ladder import advise as adv
from m3lab.ladder import fixes as fx
from m3lab.ladder import ladder as lad
from m3lab.ladder.before import BEFORE, overrides_for
from m3lab.ladder.evaluate import evaluate, op_changes
from m3lab.cost.model import cost_optable
from m3lab.cost.sensitivity import sensitivity
from m3lab.optable import build_optable
from m3lab.optable.dispatch import OP_DECISION
from m3lab.serving.breakdown import decode_step, decode_step_breakdown
from m3lab.serving.dispatch import dispatch_for
from m3lab.serving.estimate import estimate
from m3lab.spec.settings import canonical
from m3lab.spec.serving import make_deployment

SMALL = {"isl": 2048, "osl": 128, "concurrency": 8, "num_prompts": 16}
LADDER = ["decode_gemm_launcher", "moe_program_order", "aiter", "shared_expert_fusion", "index_sharing",
          "sparse_page_adapter"]
# the fixes whose effect m3lab estimates: every switch fix, and the code fixes it represents the state before of
ESTIMATED = [f for f in fx.FIXES if not f.spec_only and (f.is_switch or f.name in BEFORE)]
SPEC_CODE = [f for f in fx.FIXES if f.spec_only and not f.is_switch]


def _dep(preset, **kw):
    return make_deployment(preset, {**SMALL, **kw})


def _cal(d):
    return resolve_calibration(d.hardware, "default")


def _ops(d, cal, undone=()):
    """The per-op breakdown of a small decode step of ``d`` (``undone``: code fixes in their state before)."""
    return decode_step_breakdown(d, batch=8, context=2048 + 64, calibration=cal, op_overrides=overrides_for(undone))


def _fixed(fix, d):
    """(breakdown without the fix, with it) of the small decode step of ``d``, with what the fix assumes on."""
    d = d.with_settings(fix.requires)
    cal = _cal(d)
    if fix.is_switch:
        return _ops(d, cal), _ops(d.with_settings(fix.settings), cal)
    return _ops(d, cal, (fix.name,)), _ops(d, cal)


def _overridden(fix, d) -> set:
    """The vLLM ops whose rows the state before of code fix ``fix`` re-costs in the small decode step of ``d``."""
    step = decode_step(d, 8, 2048 + 64)
    costed = cost_optable(build_optable(d.model, d.plan, d.quant, step, None, dispatch_for(d)), d.hardware, _cal(d),
                          overrides_for((fix.name,)))
    return {OP_DECISION.get(o, o) for o in costed.loc[costed["override"] == fix.name, "op"]}


def _stray(fix, without, with_fix) -> set:
    """Ops whose decode time the fix moved but does not name."""
    return set(op_changes(without, with_fix)["op"]) - fix.touches()


# ---- the fixes as data ---------------------------------------------------------------------------------------------
def test_fixes_speak_the_record_vocabulary_and_name_their_published_figures():
    base, target = _dep("mxfp8-tp4-baseline"), _dep("mxfp8-tp4-optimised")
    for fix in fx.FIXES:
        assert fix.found_by in fx.CHECKLIST and fix.confirm_step in fx.CHECKLIST and fix.ops and fix.vllm
        if fix.is_switch:
            assert all(canonical(k) for k in fix.settings)
            if not fix.spec_only:
                assert not fx.applied(fix, base) and fx.applied(fix, target), fix.name
        else:   # vLLM's code: the state before is m3lab's, said so
            assert fix.before, fix.name
            with pytest.raises(ValueError):
                fx.applied(fix, base)
    assert {g.fix for g in published.FIX_GAINS} <= set(fx.BY_NAME)
    assert all(set(g.config) <= set(published.FIX_CONFIG_FIELDS) for g in published.FIX_GAINS)
    assert list(fx.table()["fix"]) == [f.name for f in fx.FIXES]


# ---- a fix that is off costs nothing extra -------------------------------------------------------------------------
def test_the_ladder_estimate_is_the_serving_estimate_when_nothing_is_undone():
    d = _dep("mxfp8-tp4-baseline")
    rung, est = evaluate(d), estimate(d)
    top = est.results[est.kind]
    assert {k: rung.figures[k] for k in ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")} == \
        {k: top[k] for k in ("output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms")}
    assert rung.decode_ops["share"].sum() == pytest.approx(1.0)


def test_a_fix_that_is_off_or_absent_costs_nothing_extra():
    bf16 = _dep(None, quant="bf16")   # no MXFP8 GEMM: the launcher's state before touches nothing
    cal = _cal(bf16)
    assert op_changes(_ops(bf16, cal), _ops(bf16, cal, ("decode_gemm_launcher",))).empty
    opt = _dep("mxfp8-tp4-optimised")   # AITER's MoE runs: the Triton MoE's program order touches nothing
    assert op_changes(_ops(opt, _cal(opt)), _ops(opt, _cal(opt), ("moe_program_order",))).empty
    for name in ("request_level_index_batching", "multi_token_verification"):   # no verify rows: nothing to touch
        assert op_changes(_ops(opt, _cal(opt)), _ops(opt, _cal(opt), (name,))).empty, name
    opt = _dep("mxfp8-tp4-optimised")   # a switch fix already on: applying it again changes nothing
    for fix in (f for f in ESTIMATED if f.is_switch):
        assert opt.with_settings(fix.settings).key() == opt.key()
        assert op_changes(*_fixed(fix, opt)).empty, fix.name
    # a ceiling has no efficiency to lose: the code fixes' state before moves no ceiling
    d = _dep("mxfp8-tp4-baseline")
    assert evaluate(d, ("decode_gemm_launcher", "moe_program_order"), calibration=None).figures == \
        evaluate(d, calibration=None).figures


# ---- each fix changes only the ops it touches ----------------------------------------------------------------------
SPEC = {**SMALL, "accept_len": 2.7, "accept_dataset": "MT-Bench"}


@pytest.mark.parametrize("fix", ESTIMATED + SPEC_CODE, ids=[f.name for f in ESTIMATED + SPEC_CODE])
def test_each_fix_changes_only_the_ops_it_touches(fix):
    d = make_deployment("eagle3-mxfp8-tp4", SPEC) if fix.spec_only else _dep("mxfp8-tp4-baseline")
    without, with_fix = _fixed(fix, d)
    assert not _stray(fix, without, with_fix), fix.name
    # it moves the time of one of its ops, or the kernel vLLM runs for one (the page adapter's AITER attention is
    # costed at the Triton attention's efficiency: a kernel change at the same µs)
    repathed = {op for op in fix.touches() if set(without[without.op == op].path) != set(with_fix[with_fix.op == op].path)}
    touched = set() if fix.is_switch else _overridden(fix, d)    # a code fix's state before: the rows it re-costs
    assert touched <= fix.touches(), fix.name
    # (multi-token verification's state before costs the verify attention on the Triton path, at the AITER path's
    # efficiency while aiter_pa_vs_triton is 1: rows touched at the same µs)
    assert len(op_changes(without, with_fix)) or repathed or touched, f"{fix.name} moves none of its ops"


def test_a_fix_that_hides_an_op_it_moves_is_caught():
    fix = fx.get_fix("shared_expert_fusion")
    without, with_fix = _fixed(fix, _dep("mxfp8-tp4-baseline"))
    planted = dataclasses.replace(fix, ops=tuple(o for o in fix.ops if o != "shared_gate_up"))
    assert _stray(planted, without, with_fix) == {"shared_gate_up"}


# ---- the ladder composes to its target -----------------------------------------------------------------------------
def test_ladder_steps_compose_to_the_target(monkeypatch):
    from m3lab.ladder import evaluate as ev

    tables = []   # the cost model's sensitivity: once per rung shown, never per rung climbed
    monkeypatch.setattr(ev, "cost_sensitivity", lambda est: tables.append(est) or sensitivity(est))
    start, target = _dep("mxfp8-tp4-baseline"), _dep("mxfp8-tp4-optimised")
    todo = lad.plan(start, target)
    assert [f.name for f in todo] == LADDER
    d = start
    for fix in todo:
        d = d.with_settings(fix.settings) if fix.is_switch else d
    assert d.key() == target.key()
    run = lad.run(start, target)
    assert [s.fix for s in run.steps] == ["start", *LADDER]
    assert all(s.rung is not None for s in run.steps)            # every code fix has a state before
    rungs = [s.rung for s in run.steps]
    assert rungs[0].undone == ("decode_gemm_launcher", "moe_program_order") and rungs[0].deployment.key() == start.key()
    assert rungs[1].undone == ("moe_program_order",)
    assert rungs[2].undone == () and rungs[2].deployment.key() == start.key()     # code fixes on: the start itself
    assert rungs[2].figures == evaluate(start).figures
    assert rungs[3].deployment.key() == start.with_settings(fx.get_fix("aiter").settings).key()   # AITER alone
    assert rungs[-1].deployment.key() == target.key() and rungs[-1].undone == ()
    assert rungs[-1].figures == evaluate(target).figures                           # the end is the target's estimate
    for prev, step in zip(run.steps, run.steps[1:]):
        assert step.gain_pct == pytest.approx((step.rung.throughput / prev.rung.throughput - 1) * 100)
    out = json.loads(json.dumps(run.to_dict()))["steps"]
    assert out[0]["gain_pct"] is None
    aiter = next(s for s in out if s["fix"] == "aiter")   # a switch, not a write-up fix: never a published figure
    assert aiter["named"] is False and aiter["writeup_gain_pct"] is None and aiter["writeup_text"] is None
    assert tables == []
    table = lad.sensitivity(run, top=3)
    assert len(tables) == 2 and lad.sensitivity(run, top=3).equals(table) and len(tables) == 2
    assert set(table["rung"]) == {"start", "decode_gemm_launcher", "moe_program_order", "end"}
    assert {"launcher_h200_ratio", "moe_order_h200_ratio"} <= set(table["assumption"])


def test_ladder_refuses_two_deployments_that_differ_in_more_than_fixes():
    with pytest.raises(M3LabError, match="tp=8"):
        lad.plan(_dep("mxfp8-tp4-baseline"), _dep("mxfp8-tp4-optimised", tp=8))


def test_speculative_ladder_carries_the_acceptance_to_the_step_that_switches_it_on():
    target = make_deployment("eagle3-mxfp8-tp4", {**SMALL, "accept_len": 2.7, "accept_dataset": "MT-Bench"})
    todo = lad.plan(_dep("mxfp8-tp4-baseline"), target)
    assert [f.name for f in todo] == LADDER + ["eagle3_speculative_decoding", "request_level_index_batching",
                                               "multi_token_verification"]


# ---- the write-up's figure only beside its own configuration -------------------------------------------------------
def test_a_published_fix_gain_shows_only_beside_the_configuration_it_states():
    def gain(fix, preset="mxfp8-tp4-optimised", **kw):
        return published.fix_gain_for(fix, lad.compare_config(_dep(preset, **kw)))

    assert gain("shared_expert_fusion", concurrency=1)["value_pct"] == 30.2
    assert gain("shared_expert_fusion", concurrency=128, num_prompts=256)["value_pct"] == 5.6
    at32 = gain("shared_expert_fusion", concurrency=32, num_prompts=64)
    assert at32["value_pct"] is None and "concurrency 1" in at32["configuration"]
    assert gain("decode_gemm_launcher", tp=8, isl=8192, osl=1024)["value_pct"] == [7.8, 9.4]
    assert gain("decode_gemm_launcher")["value_pct"] is None                           # TP4: not its TP8 figure
    assert gain("moe_program_order", concurrency=1)["value_pct"] is None               # a kernel figure, never
    assert gain("index_sharing", concurrency=1)["metric"] == "mean TPOT"
    spec = make_deployment("eagle3-mxfp8-tp4", {**SMALL, "concurrency": 1, "accept_len": 2.7})
    assert published.fix_gain_for("shared_expert_fusion", lad.compare_config(spec))["value_pct"] is None
    assert published.fix_gain_for("multi_token_verification", lad.compare_config(spec))["value_pct"] == 7.90
    assert published.fix_gain_for("no_such_fix", lad.compare_config(spec)) is None


# ---- the advisor ---------------------------------------------------------------------------------------------------
def test_advise_ranks_by_gain_and_never_lists_what_is_applied(monkeypatch):
    d = _dep("mxfp8-tp4-baseline")
    first = adv.advise(d)
    names = [e["fix"] for e in first.fixes]
    assert set(names) == {"aiter", "shared_expert_fusion", "index_sharing"}
    # the page adapter without AITER: vLLM runs no other kernel, and the advisor says what it assumes
    blocked = {b["fix"]: b["reason"] for b in first.blocked}
    assert "VLLM_ROCM_USE_AITER=1" in blocked["sparse_page_adapter"]
    assert next(e for e in first.fixes if e["fix"] == "shared_expert_fusion")["assumes"] == {"VLLM_ROCM_USE_AITER": "1"}
    gains = [e["gain_pct"] for e in first.fixes]
    assert gains == sorted(gains, reverse=True)
    for e in first.fixes:
        assert {"fix", "op", "gain_pct", "checklist_step", "confirm"} <= set(e)
        assert e["op"] in fx.get_fix(e["fix"]).touches() and e["checklist_step"] in fx.CHECKLIST
    best = first.fixes[0]
    applied = d.with_settings(best["settings"])
    again = adv.advise(applied)
    assert best["fix"] not in [e["fix"] for e in again.fixes]
    assert set(names) - {best["fix"]} <= {e["fix"] for e in again.fixes}
    # planted: a check that forgets the record (and a vLLM that objects to nothing)
    monkeypatch.setattr(adv, "applied", lambda fix, dep: False)
    monkeypatch.setattr(adv, "vllm_objection", lambda fix, dep, after: None)
    assert best["fix"] in [e["fix"] for e in adv.advise(applied).fixes]


def test_advise_lists_what_vllm_refuses_or_turns_off_with_its_reason():
    # TP2 (2 KV heads per rank), AITER on, a bf16 index cache: vLLM refuses the page adapter's AITER sparse PA
    tp2 = _dep("mxfp8-tp4-baseline", tp=2).with_settings({"VLLM_ROCM_USE_AITER": "1"})
    blocked = {b["fix"]: b["reason"] for b in adv.advise(tp2).blocked}
    assert "num_kv_heads" in blocked["sparse_page_adapter"]
    ep = _dep("mxfp8-tp4-optimised", enable_expert_parallel=1)
    advice = adv.advise(ep)
    assert "enable_expert_parallel" in {b["fix"]: b["reason"] for b in advice.blocked}["shared_expert_fusion"]
    assert "shared_expert_fusion" not in [e["fix"] for e in advice.fixes]


# ---- commands ------------------------------------------------------------------------------------------------------
SMALL_FLAGS = ["--isl", "2048", "--osl", "128", "--concurrency", "8", "--num-prompts", "16"]


def test_ladder_and_advise_commands_print_their_json():
    runner = CliRunner()
    res = runner.invoke(app, ["ladder", "--from", "mxfp8-tp4-baseline", "--to", "mxfp8-tp4-optimised",
                              *SMALL_FLAGS, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert [s["fix"] for s in out["steps"]] == ["start", *LADDER]
    for s in out["steps"]:
        assert {"fix", "output_tokens_per_s_per_gpu", "ttft_s", "tpot_ms", "gain_pct", "writeup_gain_pct"} <= set(s)
    res = runner.invoke(app, ["advise", "--preset", "mxfp8-tp4-baseline", *SMALL_FLAGS, "--json"])
    assert res.exit_code == 0, res.output
    fixes = json.loads(res.stdout.strip().splitlines()[-1])["fixes"]
    assert fixes and all({"fix", "op", "gain_pct"} <= set(e) for e in fixes)


@pytest.mark.parametrize("args, field", [(["ladder", "--to", "mxfp4-tp2"], "differs"),
                                         (["ladder", "--from", "nope"], "unknown preset"),
                                         (["advise", "--preset", "mxfp8-tp4-baseline", "--concurrency", "100000"],
                                          "concurrency")])
def test_bad_input_is_one_line_and_exit_2(args, field):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and field in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


# ---- the toggle per fix --------------------------------------------------------------------------------------------
def test_a_toggle_per_fix_re_estimates_live_and_a_pipeline_run_gets_the_static_ladder(monkeypatch):
    from m3lab.plots import ladder as pl

    d = _dep("mxfp8-tp4-baseline")
    todo = lad.plan_from(d)
    monkeypatch.setenv("M3LAB_STEP", "following_the_bottleneck")
    assert isinstance(pl.fix_toggles(d, todo), str)
    monkeypatch.delenv("M3LAB_STEP")
    calls = []
    monkeypatch.setattr(lad, "evaluate", lambda *a, **k: calls.append(a[1]) or evaluate(*a, **k))
    box = pl.fix_toggles(d, todo)
    checks = {c.description: c for c in box.children[0].children}
    assert list(checks) == [f.name for f in todo] and calls == [("decode_gemm_launcher", "moe_program_order")]
    assert not any(c.disabled for c in checks.values())    # every code fix has a state before
    checks["decode_gemm_launcher"].value = True
    assert calls[-1] == ("moe_program_order",)


def test_a_pipeline_names_an_unknown_fix_before_any_step_runs():
    from m3lab.pipeline.validate import validate_step

    with pytest.raises(M3LabError, match="unknown fix 'nope'"):
        validate_step("following_the_bottleneck", {"fixes": ["nope"]}, {"fixes"})
    with pytest.raises(M3LabError, match="list of fix names"):
        validate_step("following_the_bottleneck", {"fixes": "index_sharing"}, {"fixes"})
    validate_step("following_the_bottleneck", {"fixes": ["index_sharing"]}, {"fixes"})
