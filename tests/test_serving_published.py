"""What the serving estimate shows must be true: a measured or published number only beside an estimate of
the same deployment, and every parameter (concurrency above all) changes what it claims to."""
import re
import subprocess
from pathlib import Path

import pytest

from m3lab import published
from m3lab.plots import serving as ps
from m3lab.serving import estimate as se
from m3lab.spec.serving import make_deployment
from m3lab.spec.traffic import VLLM_BENCH_NUM_PROMPTS

CLAIM = re.compile(r"\bmeasured\b|\bpublished\b", re.I)
PUBLISHED_CASE = dict(model="minimax-m3", hardware="mi355x", tp=4, quant="mxfp8", isl=8192, osl=1024, concurrency=32)


def _dep(**kw):
    return make_deployment(None, kw)


def _labels(fig) -> list[str]:
    """Every text a reader sees as a label: the title, trace names, bar categories, subplot titles."""
    out = [fig.layout.title.text or ""] + [a.text or "" for a in fig.layout.annotations]
    for trace in fig.data:
        out.append(trace.name or "")
        if getattr(trace, "x", None) is not None:
            out += [str(v) for v in trace.x]
    return out


@pytest.mark.parametrize("change", [dict(tp=8), dict(model="llama-3.1-8b", tp=1), dict(concurrency=8),
                                    dict(quant="mxfp4", aiter=1), dict(isl=1024), dict(kv_dtype="fp8"),
                                    dict(spec_tokens=3, accept_len=2.7), dict(aiter=1)])
def test_notebook10_functions_show_no_measurement_for_another_deployment(change):
    change = {"num_prompts": 64, **change}                 # short runs: what is checked here is the labels
    est = se.estimate(_dep(**{**PUBLISHED_CASE, **change}))
    table = se.compare_with_published(est)
    assert "measured" not in table.columns and "measured_over_ceiling" not in table.columns
    assert {"ceiling", "calibrated"} <= set(table.columns)
    fig = ps.measured_vs_estimate(table, se.comparison_title(est))
    claims = [t for t in _labels(fig) if CLAIM.search(t)]
    assert not claims, claims
    sweep = se.add_published(se.sweep(_dep(**{**PUBLISHED_CASE, **change}), [1, 16]), est.deployment)
    assert set(sweep["source"]) == {"ceiling", "calibrated"}
    for fig in (ps.throughput_vs_concurrency(sweep, "t"), ps.latency_vs_concurrency(sweep, "t")):
        assert not [t for t in _labels(fig) if CLAIM.search(t)]


def test_the_published_deployment_shows_its_measurement():
    """The write-up's "after" figures beside the optimised deployment's estimate, its "before" figures beside vLLM's
    defaults (the checklist's deployment): never one beside the other's configuration."""
    est = se.estimate(make_deployment("mxfp8-tp4-optimised"))
    table = se.compare_with_published(est)
    assert table["measured"].tolist() == [342.4, 0.67, 22.1]
    assert table["measured_over_ceiling"].notna().tolist() == [True, False, False]  # throughput only
    assert "measured on MI355X (published)" in se.comparison_title(est)
    points = se.add_published(se.sweep(est.deployment, [8, 32]), est.deployment)
    assert points[points.source.str.startswith("measured")]["concurrency"].tolist() == [32]
    default = se.estimate(_dep(**PUBLISHED_CASE))
    assert se.compare_with_published(default)["measured"].tolist() == [109.1, 1.46, 69.1]


def test_num_requests_is_vllm_bench_default_and_raising_concurrency_changes_the_result():
    args = dict(PUBLISHED_CASE)
    at = {}
    for c in (64, 128):
        est = se.estimate(_dep(**{**args, "concurrency": c}))
        assert est.config["num_requests"] == VLLM_BENCH_NUM_PROMPTS and est.config["steady_state"]
        at[c] = est.summary()
    assert at[128]["ttft_s"] != at[64]["ttft_s"] and at[128]["tpot_ms"] > at[64]["tpot_ms"]
    assert at[128]["output_tokens_per_s_per_gpu"] > at[64]["output_tokens_per_s_per_gpu"]


def test_a_run_too_short_for_steady_state_says_so():
    est = se.estimate(_dep(**{**PUBLISHED_CASE, "concurrency": 64, "num_prompts": 64}))
    assert est.config["steady_state"] is False and any("steady state" in n for n in est.summary()["notes"])
    ok = se.estimate(_dep(**{**PUBLISHED_CASE, "num_prompts": 2 * 32 + 1}))
    assert ok.config["steady_state"] and not any("steady state" in n for n in ok.notes)


def test_no_requests_per_slot_run_length_remains(repo_dir):
    out = subprocess.run(["grep", "-rnE", r"REQUESTS_PER_SLOT|requests_per_slot|default_num_requests",
                          "m3lab", "notebooks"], cwd=repo_dir, capture_output=True, text=True).stdout
    assert not out, out
    assert "num_requests = 64" not in "".join(p.read_text() for p in Path(repo_dir, "notebooks").glob("*.ipynb"))


AFTER = make_deployment("mxfp8-tp4-optimised")


@pytest.mark.parametrize("change", [
    dict(hardware="h200"), dict(tp=8), dict(ep=4), dict(quant="mxfp4"), dict(kv_dtype="fp8"),
    dict(index_dtype="fp8"), dict(isl=4096), dict(osl=2048), dict(concurrency=64), dict(spec_tokens=3),
    dict(aiter=0), dict(shuffle_kv_cache=0), dict(fused_shared_expert=False), dict(index_topk_freq=1),
    dict(max_num_seqs=128), dict(max_num_batched_tokens=8192), dict(gpu_memory_utilization=0.8),
    dict(prefix_caching=False), dict(async_scheduling=False), dict(cudagraph_mode="PIECEWISE"), dict(pd="1:1"),
    dict(model="minimax-m3", quant="bf16")])
def test_no_published_measurement_for_a_deployment_that_differs_in_any_field(change):
    """A measurement is found only for the whole deployment it ran: a change of any kind of field (hardware, plan,
    weights, caches, lengths, concurrency, speculation, a vLLM switch, a scheduler limit, P/D) loses it."""
    assert published.measurement_for(AFTER)["case"] == "after"
    changed = AFTER.with_settings(change)
    assert published.measurement_for(changed) is None, change
    assert published.deployment_differences(changed, published.headline_deployment("after"))


def test_the_published_measurement_follows_the_served_checkpoint_not_the_config_name():
    """The write-up's M3 is MiniMaxAI/MiniMax-M3-MXFP8, named minimax-m3-mxfp8 in the presets or minimax-m3 with
    MXFP8 weights in the checklist's default: both are it. Fields a measurement does not state are not compared."""
    named = AFTER.with_settings({"model": "minimax-m3"})
    assert named.model.name == "minimax-m3" and published.measurement_for(named)["case"] == "after"
    assert published.measurement_for(make_deployment())["case"] == "before"   # vLLM's defaults
    assert published.measurement_for(make_deployment("mxfp8-tp4-baseline", num_prompts=64))["case"] == "before"
    assert published.measurement_for(make_deployment("mxfp8-tp4-baseline", kv_link_gbps=100))["case"] == "before"
    assert published.measurement_for(make_deployment())["figures"] == {
        "output_tokens_per_s_per_gpu": 109.1, "ttft_s": 1.46, "tpot_ms": 69.1}


@pytest.mark.slow
def test_pipeline_concurrency_128_and_64_give_different_ttft_in_the_summary_artifacts(tmp_path):
    import json

    from m3lab.pipeline.runner import run_pipeline
    from m3lab.pipeline.spec import notebooks_dir

    yaml = tmp_path / "serving.yaml"
    yaml.write_text(f"name: serving\nsteps:\n  - notebook: {notebooks_dir() / '10_serving_estimates.ipynb'}\n")
    ttft = {}
    for c in (64, 128):
        res = run_pipeline(yaml, [f"concurrency={c}"], tmp_path / "runs", progress=False, echo=lambda s: None)
        assert res.ok, res.failed_step
        art = json.loads((res.run_dir / "artifacts" / "serving_estimates" / "serving_estimate.json").read_text())
        assert art["concurrency"] == c and art["num_requests"] == VLLM_BENCH_NUM_PROMPTS and art["steady_state"]
        ttft[c] = art["ttft_s"]
    assert ttft[64] != ttft[128]
