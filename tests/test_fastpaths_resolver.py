"""The fast-path resolver: vLLM's own code decides on an emulated platform; each test names a decision where
restating vLLM's rules goes wrong (MoE backends under EP, routing, AR+norm sizes, widths under indexer CP,
gfx950 tile stages, page-table writers, MSA-CP limits, KV formats, index sharing, the monokernel, citations).

Every row says how it was decided; citations point at the vLLM code that decided (computed from the call
that ran, so they move with vLLM).
"""
import dataclasses
import importlib

import pytest

from m3lab.errors import M3LabError
from m3lab.spec.serving import PRESETS, deployment, load_preset
from m3lab.vllm import decide, workers
from m3lab.vllm_src import install
from m3lab.vllm.fastpaths import effective_plan, resolve
from m3lab.vllm.fastpath_types import Decision
from m3lab.vllm.serve_command import launch_line

pytestmark = pytest.mark.skipif(not install.available(), reason="vLLM 0.33.0 not installed")
MI355X_PRESETS = [n for n, p in PRESETS.items() if p.hardware == "mi355x"]


def ep4(quant="mxfp8", **sets):
    model = "minimax-m3-mxfp8" if quant == "mxfp8" else "minimax-m3"
    return deployment(model, "mi355x", quant, tp=4, ep=4).with_settings({"aiter": "1", **sets})


# --- acceptance 3 (the Python form of m3lab fastpaths ... --set VLLM_ROCM_USE_AITER=1) ----------------------
def test_mxfp8_under_ep_runs_aiter_flydsl_experts_and_aiter_biased_grouped_topk():
    """FlyDSL MXFP8 experts support EP; with AITER MoE on the routing is AITER's biased_grouped_topk."""
    r = resolve(ep4(), tokens=32)
    ex, rt = r.decision("experts"), r.decision("routing")
    assert (ex.path, ex.vllm) == ("aiter_mxfp8_flydsl", "AITER_MXFP8 -> AiterMxfp8Experts")
    assert str(ex.decided_by).startswith("vllm/model_executor/layers/fused_moe/experts/aiter_mxfp8_moe.py:")
    assert rt.path == "aiter_biased_grouped_topk" and rt.kernels == ("vllm.rocm_aiter_biased_grouped_topk",)
    assert str(rt.decided_by).startswith("vllm/_aiter_ops.py:") and "biased_grouped_topk" in str(rt.decided_by)
    assert all(d.how in ("executed", "restated") for d in r.decisions)
    forced = resolve(ep4(moe_backend="aiter"), tokens=32)   # no false "vLLM refuses"
    assert forced.ok and forced.decision("experts").path == "aiter_mxfp8_flydsl"


def test_mxfp4_with_aiter_off_names_no_aiter_expert_kernel():
    """AiterMxfp4Experts needs AITER's fused MoE on; with vLLM's default (off) no AITER kernel runs."""
    r = resolve(deployment("minimax-m3", "mi355x", "mxfp4", tp=4), tokens=32)
    rows = [d for d in r.decisions if d.op == "experts"]
    assert rows and all("aiter" not in " ".join((d.path, *d.kernels)).lower() for d in rows)
    # the ROCm image has amd-quark (vLLM's requirements/rocm.txt): vLLM falls back to its OCP MX emulation
    assert r.ok and {d.path for d in rows} == {"mxfp4_emulation"}


@pytest.mark.parametrize("name", MI355X_PRESETS)
def test_mi355x_presets_are_executed_by_vllm(name):
    """Every row says how; at most 10% restated on the MI355X presets (none are)."""
    dep = load_preset(name)
    r = resolve(dep, tokens=32, phase="prefill" if dep.plan.role == "prefill" else "decode")
    assert r.ok, r.refused[0].note   # vLLM starts every preset as its launch line renders it (P/D roles too)
    assert r.decisions and all(d.how in ("executed", "restated") for d in r.decisions)
    assert len(r.restated) <= 0.1 * len(r.decisions)


# --- the defects, one test each ---------------------------------------------------------------------------
def test_fused_allreduce_norm_checks_the_message_size():
    """vLLM's _can_use_aiter_fused_ar_rms: 1-stage fused AR+norm up to 21 tokens at TP4 (< 256 KiB)."""
    opt = load_preset("mxfp8-tp4-optimised")
    assert resolve(opt, tokens=16).decision("allreduce_norm").path == "aiter_fused_ar_rmsnorm"
    assert resolve(opt, tokens=32).decision("allreduce_norm").path == "allreduce_then_norm"
    prefill = resolve(opt, tokens=8192, phase="prefill").decision("allreduce_norm")
    assert prefill.path == "allreduce_then_norm" and "_can_use_aiter_fused_ar_rms" in str(prefill.checks[1].cite)


def test_tp_all_reduce_follows_the_communicator_vllm_builds():
    """AITER off on gfx950: vLLM's own CustomAllreduce takes a message below its max_size (8 MiB: 682 x 6144
    bf16 rows fit, 683 do not), RCCL a larger one; AITER on: AITER's custom all-reduce."""
    base = load_preset("mxfp8-tp4-baseline")
    kernels = lambda dep, tokens, phase="decode": resolve(dep, tokens=tokens, phase=phase).decision(
        "allreduce_norm").kernels[0]
    assert kernels(base, 32) == "vLLM custom all-reduce"
    assert kernels(base, 8192, "prefill") == "RCCL / NCCL all-reduce"          # 96 MiB > max_size
    assert kernels(load_preset("mxfp8-tp4-optimised"), 32) == "AITER custom all-reduce"
    assert kernels(base, 682, "prefill") == "vLLM custom all-reduce"
    assert kernels(base, 683, "prefill") == "RCCL / NCCL all-reduce"


@pytest.mark.parametrize("tp, index, width, path", [(4, "bf16", 2560, "triton_cp"), (8, "bf16", 1536, "triton_cp"),
                                                   (4, "fp8", 2944, "msa_fp8_cp"), (8, "fp8", 1536, "msa_fp8")])
def test_indexer_cp_widens_qkv_only_where_vllms_model_does(tp, index, width, path):
    """the width printed (ParallelPlan's) equals the width vLLM's built module holds."""
    dep = load_preset("mxfp8-tp4-optimised").with_settings({"tp": str(tp), "index_dtype": index, "indexer_cp": "1"})
    r = resolve(dep, tokens=32)
    q = r.decision("qkv_proj")
    assert r.decision("indexer").path == path and q.shape.n == width
    assert q.checks[0].holds, q.checks[0].value          # "ParallelPlan's local width = vLLM's module"
    assert sum(effective_plan(dep).qkv_widths(dep.model, sparse=True)) == width


def test_gfx950_prefill_tiles_carry_gfx950_stages():
    """_select_cfg imported under gfx950, so its BLOCK_K 256 tiles run 2 stages (3 on a CPU import)."""
    q = resolve(load_preset("mxfp8-tp4-optimised"), tokens=8192, phase="prefill").decision("qkv_proj")
    assert q.path == "mxfp8_dot_scaled_prefill" and "(128, 128, 256, 8, 2)" in q.vllm


def test_triton_cp_page_table_is_written_by_merge_topk_keys():
    """under Triton indexer CP the table comes from _merge_topk_keys (EMIT_SPARSE_TABLE), not the fused
    top-k."""
    r = resolve(load_preset("mxfp8-tp4-optimised").with_settings({"indexer_cp": "1"}), tokens=32)
    pt = r.decision("page_table")
    assert pt.path == "cp_merge_emits" and pt.vllm.startswith("_merge_topk_keys")
    assert "_merge_topk_keys" in r.decision("indexer").kernels


def test_msa_cp_counts_speculative_rows():
    """MSA-CP needs num_index_heads x (1 + n_spec) <= SCORE_MFMA_COLS (16): EAGLE3 k=3 fits, k=4 not."""
    base = load_preset("eagle3-mxfp8-tp4").with_settings({"index_dtype": "fp8", "indexer_cp": "1"})
    assert resolve(base, tokens=32).decision("indexer").path == "msa_fp8_cp"
    k4 = base.with_settings({"spec_tokens": "4"})
    r = resolve(k4, tokens=40)
    assert r.decision("indexer").path == "msa_fp8" and r.decision("qkv_proj").shape.n == 2560


def test_citations_point_at_the_code_that_decided():
    """the router's tier is the gfx950 tier-5 dispatch (its op body); non-FSE routing cites the AITER
    call it reached; the AR row cites _can_use_aiter_fused_ar_rms; the E8M0 rule citation locates."""
    from m3lab.gates.vllm_act import E8M0_RULE
    from m3lab.vllm.cite import Cite
    r = resolve(load_preset("mxfp8-tp4-optimised"), tokens=32)
    router = r.decision("router")
    assert router.checks[0].value == "vllm.rocm_bf16x3_router_gemm_dispatch"
    assert "rocm_fp32_router_gemm" in str(router.decided_by)
    assert "_can_use_aiter_fused_ar_rms" in str(r.decision("allreduce_norm").checks[1].cite)
    assert Cite(*E8M0_RULE).locate() > 0


@pytest.mark.parametrize("name", ["mxfp8-tp4-optimised", "h200-bf16-tp4"])
def test_every_citation_of_a_preset_locates(name):
    """Every decided_by and check citation of a decode and a prefill step names a line of the installed vLLM."""
    for tokens, phase in ((32, "decode"), (8192, "prefill")):
        for d in resolve(load_preset(name), tokens=tokens, phase=phase).decisions:
            for cite in (d.decided_by, *(c.cite for c in d.checks)):
                assert cite is None or ":" in str(cite), (d.op, cite)


def test_the_sparse_attend_row_shows_the_switches_vllm_read():
    """AITER off: the attend row's VLLM_ROCM_USE_AITER check (read by vLLM's accessor) no longer holds."""
    on, off = (resolve(load_preset("mxfp8-tp4-optimised").with_settings({"aiter": a}), tokens=32)
               .decision("attention", "sparse") for a in ("1", "0"))
    assert [(c.name, c.holds) for c in on.checks[:2]] == [("VLLM_ROCM_USE_AITER", True),
                                                         ("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", True)]
    assert (off.path, off.checks[0].value, off.checks[0].holds) == ("triton_sparse", 0, False)


def test_a_one_block_prefill_on_the_emitted_page_table():
    """A prefill inside one KV block with the MSA indexer emitting AITER's page table: the step's caches are
    laid out as vLLM's engine resolves the layout (interleaved K/V blocks), beside the null block."""
    r = resolve(load_preset("mxfp4-tp2"), tokens=64, phase="prefill")
    assert r.decision("attention").path == "aiter_sparse_pa" and r.decision("page_table").path == "msa_topk_emits"


def test_fp8_e5m2_kv_cache_is_not_e4m3():
    """e5m2 is its own cache format: vLLM refuses it with an fp8 (MXFP8) checkpoint, and with BF16
    weights AITER's fused QK-norm + insert (e4m3 only) gives way to vLLM's kernel + AITER's cache insert."""
    bf16 = deployment("minimax-m3", "mi355x", "bf16", tp=4).with_settings({"aiter": "1", "shuffle_kv_cache": "1"})
    e5 = bf16.with_settings({"kv_dtype": "fp8_e5m2"})
    assert e5.quant.kv_dtype == "fp8_e5m2" and "--kv-cache-dtype fp8_e5m2" in launch_line(e5)
    assert resolve(e5, tokens=32).decision("qk_norm_rope_insert").path == "vllm_fused_qknorm_rope_aiter_cache"
    e4 = bf16.with_settings({"kv_dtype": "fp8"})
    assert resolve(e4, tokens=32).decision("qk_norm_rope_insert").path == "aiter_fused_qknorm_idxrqknorm"
    mx = resolve(load_preset("mxfp8-tp4-optimised").with_settings({"kv_dtype": "fp8_e5m2"}), tokens=32)
    assert not mx.ok and "fp8_e5m2" in mx.refused[0].vllm


def test_index_sharing_is_rocm_only():
    """the NVIDIA model has no index sharing: no reuse layer on an H200."""
    h200 = deployment("minimax-m3", "h200", "bf16", tp=4)
    h200 = dataclasses.replace(h200, model=h200.model.with_index_sharing(4))
    assert not [d for d in resolve(h200, tokens=32).decisions if d.layer_kind == "sparse_reuse"]
    assert [d for d in resolve(load_preset("mxfp8-tp4-optimised"), tokens=32).decisions
            if d.layer_kind == "sparse_reuse"]


def test_the_monokernel_replaces_the_stock_rows_it_runs_for():
    """when the monokernel takes the step, the router, experts and all-reduces it replaces are not listed
    as running (vLLM's runtime/decode.py substitutes the layer after attention)."""
    rows = resolve(load_preset("mxfp8-tp4-optimised"), tokens=8).decisions
    mono = Decision("monokernel", "sparse", "M3", "mono_ffn", ("minimax_m3_mono_ffn_s8_tp4",), (),
                    rows[0].decided_by)
    out = decide._suppressed(rows, mono)
    replaced = [d for d in out if d.layer_kind.startswith("sparse") and d.op in decide.MONO_REPLACES]
    assert replaced and all(d.status == "skipped" for d in replaced)
    assert decide._suppressed(rows, Decision("monokernel", "sparse", "M3", "stock_layers", (), (),
                                             rows[0].decided_by)) == rows


def test_a_monokernel_deployment_starts_with_the_launch_block_size():
    """vLLM checks the monokernel's config against the block size at model construction: built with the
    launch's --block-size 128 (as `m3lab vllm plan` renders it), it starts and takes a small decode step."""
    mono = load_preset("mxfp8-tp4-optimised").with_settings(
        {"quant": "mxfp4", "model": "minimax-m3", "kv_dtype": "fp8", "index_dtype": "fp8", "monokernel": "1",
         "moe_backend": "aiter", "model_runner_v2": "1", "index_topk_freq": "1"})
    r = resolve(mono, tokens=8)
    assert r.ok and r.decision("monokernel").path == "mono_ffn"
    assert r.decision("experts").status == "skipped"          # replaced by the monokernel in this step


def test_the_effective_plan_is_vllms_answer_on_fusion():
    """Fusion asked for: vLLM fuses on the MI355X TP4 deployment, not under EP, never in its NVIDIA model."""
    opt = load_preset("mxfp8-tp4-optimised")
    assert effective_plan(opt).fuses_shared(opt.model) and effective_plan(opt).expert_rows_local(opt.model) == 129
    ep = opt.with_settings({"enable_expert_parallel": "1"})
    assert not effective_plan(ep).fuses_shared(ep.model)
    assert "enable_expert_parallel" in effective_plan(ep).shared_fusion_reason(ep.model)
    h200 = load_preset("h200-bf16-tp4").with_settings({"fused_shared_expert": "1"})
    plan = effective_plan(h200)
    assert not plan.fuses_shared(h200.model) and plan.expert_rows_local(h200.model) == 128


# --- refusals and input errors ----------------------------------------------------------------------------
def test_a_refusal_is_vllms_own_exception_at_its_line():
    r = resolve(load_preset("mxfp8-tp4-optimised").with_settings({"tp": "2"}), tokens=32)
    (x,) = r.refused
    assert x.op == "attention" and "num_kv_heads == 1" in x.vllm
    assert str(x.decided_by).startswith("vllm/models/minimax_m3/common/sparse_attention.py:")
    limits = load_preset("mxfp8-tp4-optimised").with_settings({"max_num_seqs": 256, "max_num_batched_tokens": 128})
    bad = resolve(limits, tokens=16)  # a pydantic error: its message, on one line
    assert bad.refused[0].note == "vLLM raises ValidationError: Value error, max_num_batched_tokens (128) must be " \
                                  "greater than or equal to max_num_seqs (256)."


def test_bad_steps_are_one_line_errors():
    opt = load_preset("mxfp8-tp4-optimised")
    with pytest.raises(M3LabError) as err:
        resolve(opt.with_settings({"spec_method": "eagle3", "spec_tokens": "3"}), tokens=30)
    assert err.value.field == "--tokens" and "multiple" in str(err.value)
    with pytest.raises(M3LabError) as err:
        resolve(deployment("minimax-m3", "mi355x", "bf16", tp=4, ep=2))
    assert err.value.field == "ep"


def test_mi355x_then_h200_in_one_session():
    """One process per platform: a notebook that resolves an MI355X and then an H200 gets both right (two
    worker processes; the caller's process never imports vLLM's platform code)."""
    import sys
    mi = resolve(load_preset("mxfp8-tp4-optimised"), tokens=32)
    h = resolve(load_preset("h200-bf16-tp4"), tokens=32)
    again = resolve(load_preset("mxfp8-tp4-optimised"), tokens=32)
    assert mi.decision("attention").path == again.decision("attention").path == "aiter_sparse_pa"
    assert h.decision("attention").path == "triton_sparse" and h.decision("experts").path == "triton_fused_moe"
    assert {("rocm", "gfx950"), ("cuda", "sm_90")} <= set(workers.running())
    assert "vllm.platforms.rocm" not in sys.modules


def test_the_emulation_restores_everything_on_exit():
    """Platform, its bindings in every vLLM module, the TP group, torch.cuda, the stub AITER / amdsmi, the
    environment and the ROCm arch flags are back after the context (checked in the MI355X worker)."""
    from m3lab.spec import load_hardware
    from m3lab.vllm.emulate import Target
    probe = importlib.import_module("tests.vllm_probe")
    target = Target.of(load_hardware("mi355x"))
    got = workers.call(target, probe.restore_check, target)
    assert got["inside"] == {"platform": "RocmPlatform", "tp": 4, "aiter_found": True, "env": "x"}
    assert got == {**got, "platform_restored": True, "stale": [], "tp_group_restored": True, "cuda_restored": True,
                   "aiter_gone": True, "env_gone": True, "no_arch": True}


def test_the_router_split_sees_a_finite_weight():
    """vLLM's bf16x3 split refuses an inf/NaN router weight; the emulated model's is uninitialised memory, so the
    resolver hands vLLM's post-load hook a finite weight whatever that memory holds (else the tier flips)."""
    import types

    import torch

    from m3lab.vllm import decide_moe
    seen = {}

    class PostLoad:
        def process_weights_after_loading(self, layer):
            seen["finite"] = bool(torch.isfinite(layer.weight).all())
            raise LookupError("stop before the tier is traced")

    gate = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        gate.weight.fill_(float("nan"))
    gate._bf16x3_weight, gate.allow_rocm_bf16x3_router_gemm, gate.quant_method = None, True, PostLoad()
    with pytest.raises(LookupError):
        decide_moe.router("sparse", types.SimpleNamespace(gate=gate), 4)
    assert seen == {"finite": True}
