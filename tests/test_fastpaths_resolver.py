"""The fast-path resolver answers the write-up's configurations as vLLM 0.33.0's code does.

Every expected answer names the vLLM line it comes from (a Cite whose needle must still be on a line of the
cited function), so a vLLM upgrade that moves or changes the decision fails here.
"""
import dataclasses
import json

import pytest

from m3lab.errors import M3LabError
from m3lab.spec import load_hardware
from m3lab.spec.serving import deployment, load_preset
from m3lab.vllm.cite import Cite
from m3lab.vllm.fastpaths import resolve
from m3lab.vllm.fastpath_cites import CITES

M3 = "models/minimax_m3/"
# modules whose import needs what a CPU box lacks (torchvision for the M3 model files, a ROCm torch for the
# platform module): their citations are checked in the source only
SOURCE_ONLY = {"vllm.models.minimax_m3.amd.model", "vllm.models.minimax_m3.nvidia.model", "vllm.platforms.rocm"}


def _at(cite: Cite) -> int:
    """The cited line (raises when vLLM no longer has it)."""
    return cite.locate()


def optimised(**settings):
    d = load_preset("mxfp8-tp4-optimised")
    return d.with_settings(settings) if settings else d


# --- 1-5: the optimised MXFP8 TP4 preset (acceptance 3) ------------------------------------------------
def test_optimised_attention_is_aiter_paged_sparse_via_pa_decode_gluon():
    r = resolve(optimised(), tokens=32)
    a = r.decision("attention", "sparse")
    # vllm/models/minimax_m3/common/sparse_attention.py: _minimax_m3_aiter_sparse_pa_requested
    assert _at(Cite(M3 + "common/sparse_attention.py", "_minimax_m3_aiter_sparse_pa_requested",
                    "rocm_aiter_ops.is_enabled() and rocm_aiter_ops.is_shuffle_kv_cache_enabled()"))
    # vllm/models/minimax_m3/amd/ops/sparse_pa.py: _run_gluon_decode calls pa_decode_gluon
    assert _at(Cite(M3 + "amd/ops/sparse_pa.py", "_run_gluon_decode", "pa_decode_gluon("))
    assert (a.decision, a.path, a.status) == ("A1", "aiter_sparse_pa", "runs")
    assert any("pa_decode_gluon" in k for k in a.kernels)
    assert str(a.decided_by).startswith("vllm/models/minimax_m3/amd/ops/sparse_pa.py:")


def test_optimised_decode_topk_is_fused_and_emits_the_page_table():
    r = resolve(optimised(), tokens=32)
    ix, pt = r.decision("indexer", "sparse"), r.decision("page_table", "sparse")
    # vllm/models/minimax_m3/amd/model.py: _run_attention passes sparse_block_table_out to the indexer
    assert _at(Cite(M3 + "amd/model.py", "MiniMaxM3SparseAttention._run_attention",
                    "sparse_block_table_out=decode_sparse_table[0],"))
    assert ix.path == "triton_amd_fused_topk_emit_table" and "_decode_topk_fused_kernel" in ix.kernels
    # 32 rows = 32 requests on gfx950 with a bf16 cache: not the balanced (1-11) kernel, the split-K one
    # (vllm/models/minimax_m3/amd/ops/index_topk.py: _decode_score_program_budget "if 1 <= num_reqs <= 8:")
    assert _at(Cite(M3 + "amd/ops/index_topk.py", "_decode_score_program_budget", "if 1 <= num_reqs <= 8:"))
    assert "_decode_index_score_kernel" in ix.kernels
    assert pt.path == "fused_topk_emits" and pt.status == "skipped"
    # the reuse layers (index sharing, freq 4) rebuild the table from the shared top-k
    assert r.decision("indexer", "sparse_reuse").status == "skipped"
    assert r.decision("page_table", "sparse_reuse").kernels == ("_build_sparse_block_table_kernel",)


def test_optimised_small_batch_uses_the_balanced_score_kernel():
    ix = resolve(optimised(), tokens=8).decision("indexer", "sparse")
    assert ix.kernels[0] == "_decode_index_score_balanced_kernel"


def test_optimised_mxfp8_linear_decode_tile():
    r = resolve(optimised(), tokens=32)
    q = r.decision("qkv_proj", "sparse")
    # vllm/model_executor/kernels/linear/mxfp8/rocm_native.py: _select_cfg, "if M <= 64:" then K % 1024 -> 16x16x1024
    assert _at(Cite("model_executor/kernels/linear/mxfp8/rocm_native.py", "_select_cfg", "return 16, 16, 1024, 2, 2"))
    assert q.decision == "G2" and q.kernels == ("mxfp8_e4m3_quantize", "_mxfp8_linear_kernel")
    assert q.shape == "M=32 N=2560 K=6144"  # one fused q|k|v|index_q|index_k GEMM at TP4
    assert any("BLOCK 16x16x1024" in str(c.value) for c in q.checks)
    prefill = resolve(optimised(), tokens=4096, phase="prefill").decision("qkv_proj", "sparse")
    assert prefill.path == "mxfp8_dot_scaled_prefill"


def test_optimised_mxfp8_experts_backend_and_fusion():
    r = resolve(optimised(), tokens=32)
    e, rt = r.decision("experts", "sparse"), r.decision("routing", "sparse")
    # vllm/model_executor/layers/fused_moe/oracle/mxfp8.py: select_mxfp8_moe_backend picks the first supported
    assert _at(Cite("model_executor/layers/fused_moe/oracle/mxfp8.py", "select_mxfp8_moe_backend", "for backend in backends:"))
    assert e.path == "aiter_mxfp8_flydsl" and e.shape == "129 experts, top-5"
    # vllm/models/minimax_m3/amd/model.py: _aiter_moe_fused_shared_experts_enabled (gfx950 + AITER MoE + FSE)
    assert _at(Cite(M3 + "amd/model.py", "_aiter_moe_fused_shared_experts_enabled", "on_gfx950()"))
    assert rt.path == "aiter_biased_grouped_topk_fse"
    assert not any(d.op == "shared_gate_up" for d in r.decisions)
    triton = resolve(optimised(moe_backend="triton"), tokens=32).decision("experts", "sparse")
    assert triton.kernels[1] == "_mxfp8_grouped_gemm_kernel" and "_swiglu_oai_quant_kernel" in triton.kernels


def test_optimised_fp32_router_kernel_at_32_tokens_and_not_above():
    # vllm/model_executor/layers/fused_moe/router/gate_linear.py: fp32_router_gemm_dispatch_impl, <= 32 tokens
    assert _at(Cite("model_executor/layers/fused_moe/router/gate_linear.py", "fp32_router_gemm_dispatch_impl",
                    "if x.shape[0] <= _FP32_ROUTER_GEMM_MAX_TOKENS:"))
    assert resolve(optimised(), tokens=32).decision("router", "sparse").kernels == ("_rocm_fp32_router_gemm_kernel",)
    assert resolve(optimised(), tokens=33).decision("router", "sparse").path == "fp32_linear"
    assert resolve(optimised(), tokens=4096, phase="prefill").decision("router", "sparse").path == "rocm_bf16x3"


# --- 6: AITER off -> vLLM's Triton sparse attention ---------------------------------------------------
def test_aiter_off_runs_the_triton_sparse_kernels():
    r = resolve(optimised(aiter="0"), tokens=32)
    a = r.decision("attention", "sparse")
    # vllm/models/minimax_m3/common/sparse_attention.py: select_main_backend_and_impl_cls falls back to Triton
    assert _at(Cite(M3 + "common/sparse_attention.py", "select_main_backend_and_impl_cls",
                    "return MiniMaxM3SparseBackend, MiniMaxM3SparseTritonImpl"))
    assert a.path == "triton_sparse" and a.kernels == ("_gqa_sparse_decode_kernel", "_merge_topk_attn_out_kernel")
    assert r.decision("page_table", "sparse").status == "skipped"
    assert r.decision("experts", "sparse").path == "triton_mxfp8_native"  # AITER MoE needs VLLM_ROCM_USE_AITER
    assert r.decision("routing", "sparse").path == "topk_bias_router_cat_shared"  # FSE without the AITER append
    assert r.decision("qkv_proj", "sparse").path == "mxfp8_dot_scaled_decode"  # G2 does not need AITER
    baseline = resolve(load_preset("mxfp8-tp4-baseline"), tokens=32)
    assert baseline.decision("attention", "sparse").path == "triton_sparse"
    assert baseline.decision("shared_gate_up", "sparse").decision == "G2"


# --- 7: TP2 + bf16 index cache + AITER paged attention -> refused ------------------------------------
def test_tp2_bf16_index_cache_with_aiter_paged_attention_is_refused():
    r = resolve(optimised(tp="2"), tokens=32)
    # vllm/models/minimax_m3/common/sparse_attention.py: minimax_m3_use_aiter_sparse_pa raises ValueError
    assert _at(Cite(M3 + "common/sparse_attention.py", "minimax_m3_use_aiter_sparse_pa",
                    "if requested and num_kv_heads != 1 and not emits_sparse_block_table:"))
    assert not r.ok
    refused = r.refused[0]
    assert refused.op == "attention" and "num_kv_heads == 1" in refused.note and "got 2" in refused.note


# --- 8: fp8 index cache on gfx950 -> MSA indexer (and TP2 then works) ----------------------------------
def test_fp8_index_cache_on_gfx950_selects_the_msa_indexer():
    r = resolve(optimised(index_dtype="fp8"), tokens=32)
    # vllm/models/minimax_m3/amd/indexer_msa.py: msa_indexer_unsupported_reason needs fp8 e4m3 and gfx950
    assert _at(Cite(M3 + "amd/indexer_msa.py", "msa_indexer_unsupported_reason", "if not on_gfx950():"))
    ix = r.decision("indexer", "sparse")
    assert ix.path == "msa_fp8" and ix.kernels == ("pa_sparse_block_score_decode", "pa_sparse_block_topk")
    assert r.decision("page_table", "sparse").path == "msa_topk_emits"
    tp2 = resolve(load_preset("mxfp4-tp2"), tokens=32)
    assert tp2.ok and tp2.decision("attention", "sparse").path == "aiter_sparse_pa"


def test_fp8_index_cache_on_rocm_without_msa_is_refused():
    r = resolve(optimised(index_dtype="fp8", shuffle_kv_cache="0"), tokens=32)
    # vllm/models/minimax_m3/common/indexer.py: select_indexer_impl_cls raises NotImplementedError off CUDA
    assert _at(Cite(M3 + "common/indexer.py", "select_indexer_impl_cls", 'requires CUDA fp8 support."'))
    assert not r.ok and "NotImplementedError" in r.refused[0].note
    gfx942 = resolve(dataclasses.replace(optimised(index_dtype="fp8"), hardware=load_hardware("mi300x")), tokens=32)
    assert not gfx942.ok  # the MSA indexer needs gfx950


# --- 9: EP 4 with fusion asked -> fusion off, with the reason ------------------------------------------
def test_ep4_turns_requested_fusion_off_with_the_reason():
    d = deployment("minimax-m3-mxfp8", "mi355x", "mxfp8", tp=4, ep=4, fused_shared_expert=True)
    r = resolve(d.with_settings({"aiter": "1", "shuffle_kv_cache": "1"}), tokens=32)
    # vllm/models/minimax_m3/amd/model.py: MiniMaxM3MoE.__init__ checks enable_expert_parallel
    assert _at(Cite(M3 + "amd/model.py", "MiniMaxM3MoE.__init__",
                    "and not get_current_vllm_config().parallel_config.enable_expert_parallel"))
    off = r.turned_off
    assert len(off) == 1 and off[0].op == "shared_expert_fusion" and "expert parallelism" in off[0].note
    assert r.decision("routing", "sparse").path == "topk_bias_router"
    assert r.decision("experts", "sparse").shape == "32 experts, top-4"
    assert r.decision("shared_gate_up", "sparse").shape == "M=32 N=1536 K=6144"  # shared expert stays TP-sharded


def test_mixed_expert_formats_turn_fusion_off():
    d = optimised()
    mixed = dataclasses.replace(d.quant, weights={**d.quant.weights, "shared_expert": "bf16"})
    r = resolve(dataclasses.replace(d, quant=mixed), tokens=32)
    # vllm/models/minimax_m3/amd/model.py: is_shared_expert_quant_fse_compatible
    assert _at(Cite(M3 + "amd/model.py", "MiniMaxM3MoE.__init__", "if not fse_compatible:"))
    assert r.turned_off and "different weight formats" in r.turned_off[0].note


# --- 10: an H200 -------------------------------------------------------------------------------------
def test_h200_runs_the_common_triton_indexer_and_sparse_attention():
    r = resolve(load_preset("h200-bf16-tp4"), tokens=2)
    # vllm/models/minimax_m3/common/sparse_attention.py: MSA only on the SM100 family
    assert _at(Cite(M3 + "common/sparse_attention.py", "select_main_backend_and_impl_cls",
                    "and current_platform.is_device_capability_family(100)"))
    assert r.ok and r.platform.arch == "sm_90"
    assert r.decision("attention", "sparse").kernels == ("_gqa_sparse_decode_kernel", "_merge_topk_attn_out_kernel")
    assert r.decision("indexer", "sparse").kernels == ("_decode_index_score_kernel", "_topk_index_partial_kernel",
                                                       "_topk_index_merge_kernel")
    pre = resolve(load_preset("h200-bf16-tp4"), tokens=4096, phase="prefill")
    assert pre.decision("attention", "sparse").kernels == ("_gqa_sparse_fwd_kernel",)
    assert pre.decision("indexer", "sparse").kernels == ("_index_block_score_kernel", "_topk_index_kernel")
    b200 = resolve(dataclasses.replace(load_preset("h200-bf16-tp4"), hardware=load_hardware("b200")), tokens=2)
    assert b200.decision("attention", "sparse").path == "msa_sm100"


# --- more: monokernel, CP, EAGLE3 ----------------------------------------------------------------------
def test_monokernel_refused_for_mxfp8_with_vllms_reasons():
    r = resolve(optimised(monokernel="1"), tokens=8)
    # vllm/models/minimax_m3/amd/specialized_decode/runtime/spec.py: DecodeConfig.refusal_reasons
    assert _at(Cite(M3 + "amd/specialized_decode/runtime/spec.py", "DecodeConfig.refusal_reasons",
                    'reasons.append("requires an FP8 KV cache")'))
    note = r.refused[0].note
    assert "requires an FP8 KV cache" in note and "requires --moe-backend aiter" in note
    assert "does not support cross-layer index reuse" in note and "AITER_MXFP4_MXFP4" in note


def test_monokernel_runs_when_every_precondition_holds():
    d = load_preset("mxfp4-tp2").with_settings({"tp": "4", "kv_dtype": "fp8", "monokernel": "1", "moe_backend": "aiter",
                                                "spec_method": "eagle3", "spec_tokens": "1"})
    r = resolve(d, tokens=8)
    mono = r.decision("monokernel", "sparse")
    assert r.ok and mono.path == "mono_ffn" and mono.kernels == ("minimax_m3_mono_ffn_s8_tp4",)
    assert resolve(d, tokens=64).decision("monokernel", "sparse").path == "stock_layers"


def test_indexer_cp_needs_tp_and_eagle3_rows():
    cp = resolve(optimised(indexer_cp="1"), tokens=32).decision("indexer", "sparse")
    assert cp.path == "triton_cp"
    eagle = resolve(load_preset("eagle3-mxfp8-tp4"), tokens=32)  # 8 requests x 4 verify rows
    assert eagle.decision("indexer", "sparse").kernels[0] == "_decode_index_score_balanced_kernel"


# --- every citation resolves; every cited function and flag exists in the installed vllm ---------------
def test_every_citation_is_found_in_the_installed_vllm():
    for key, cite in CITES.items():
        assert cite.locate() > 0, key


def test_every_cited_function_imports_from_the_installed_vllm():
    from m3lab.vllm.imports import vllm_module
    imported = 0
    for key, cite in CITES.items():
        try:
            mod = vllm_module(cite.module)
        except (ImportError, AssertionError, RuntimeError):
            assert cite.module in SOURCE_ONLY, f"{key}: {cite.module} should import on a CPU box"
            continue
        obj = mod
        for part in cite.function.split("."):
            obj = getattr(obj, part)
        imported += 1
    assert imported == sum(c.module not in SOURCE_ONLY for c in CITES.values())


def test_cli_exit_codes_and_json(tmp_path):
    from typer.testing import CliRunner

    from m3lab.cli.main import app
    runner = CliRunner()
    ok = runner.invoke(app, ["fastpaths", "--preset", "mxfp8-tp4-optimised", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert doc["ok"] and doc["vllm_env"]["VLLM_ROCM_USE_AITER"] == "1"
    assert all(d["decided_by"].startswith("vllm/") for d in doc["decisions"])
    refused = runner.invoke(app, ["fastpaths", "--preset", "mxfp8-tp4-optimised", "--tp", "2", "--json"])
    assert refused.exit_code == 2 and json.loads(refused.output)["refused"]
    bad = runner.invoke(app, ["fastpaths", "--model", "llama-3.1-8b"])
    assert bad.exit_code == 2 and "not an M3 model" in bad.output


def test_bad_input_names_the_field():
    with pytest.raises(M3LabError, match="tokens"):
        resolve(optimised(), tokens=0)
    with pytest.raises(M3LabError, match="phase"):
        resolve(optimised(), phase="verify")
