"""The declared fast paths of MiniMax M3's reference model: vLLM 0.33.0's real paths (one registry).

Path names are ``<op family>.<path>`` with the path names of the resolver (:mod:`m3lab.vllm.fastpaths`), so a
dispatch trace can be checked against the resolver's expectations for a plan. Which path vLLM takes is the
resolver's answer, never restated here: a registry built with ``m3_registry(answers=...)`` (a
:class:`VllmAnswers`, made from a deployment by ``m3lab.vllm.fastpath_expectations.registry_answers``) gives
every path one more condition, "vLLM takes this path here". The conditions declared below are what one
reference call must satisfy for an implementation to run at all: the device, the op's weight format, the
layer kind, the phase of the call, and the shape contract the kernels are built for. Implementations
attach by name:

- ``m3lab.vllm.reference_kernels.attach_vllm_kernels``: vLLM's own Triton kernels (sparse attention, indexer score + top-k, Gemma
  RMSNorm, SwiGLU-OAI) and its CUDA unquantized GEMM, on a CUDA device (:mod:`m3lab.vllm.reference_kernels`);
- :func:`attach_repo_kernels`: this repo's kernels (:data:`REPO_KERNELS`: the GEMM launcher, the grouped MoE,
  the indexer score + top-k and the block-sparse attention, :mod:`m3lab.dispatch.repo_kernels`); they report
  their launches (``m3lab.kernels.launches``), so a dispatch record names the kernels that ran. This repo's
  kernels stand in under vLLM's path names: a record can read path ``moe.triton_mxfp8_native`` while
  ``align_kernel`` / ``gate_up_kernel`` / ``down_kernel`` ran. :data:`KERNEL_SLOTS` names the repo kernel
  family each not-yet-implemented path waits for. ``register_impl(name, fn)`` attaches one.

Without answers, the two MXFP8 GEMM paths split at this repo's GEMM launcher's decode bound (m3lab's
bound, named as such); with answers, at the tile vLLM's ``_select_cfg`` gives the call's (M, N, K).

Device conditions require a GPU; ``m3_registry(also_on=("cpu",))`` lets them accept another device type as well
(the Triton interpreter in tests), every other condition unchanged.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from m3lab.dispatch.fastpath import CallContext, Condition, FastPath
from m3lab.errors import M3LabError
from m3lab.kernels.gemm.tables import DECODE_MAX_M as LAUNCHER_DECODE_MAX_M  # m3lab's GEMM launcher, not vLLM

GPU_DEVICES = ("cuda", "hip")
KV_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")  # MiniMaxM3SparseBackend.supported_kv_cache_dtypes
NORM_OPS = ("input_norm", "post_attn_norm", "final_norm")
ACT_OPS = ("act", "shared_act")  # dense MLP and unfused shared expert (N3); the MoE activation is inside the experts
GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "shared_gate_up", "shared_down", "lm_head")
MOE_OPS = ("moe_experts",)  # routed (+ fused shared) experts: align, gate_up + SwiGLU-OAI, down + combine


@dataclass
class IndexerHandoff:
    """What the last indexer call of a fast path left for the layer's top-k op (the reference model splits
    score and top-k into two ops; vLLM's decode indexer selects in the same call). Written by the indexer
    implementation, read by the top-k paths' conditions and implementation."""

    scores: Any = None                 # the scores tensor the indexer op returned
    topk: Any = None                   # decode: the selection vLLM's call already made
    prefill_args: tuple | None = None  # prefill: (cu_seqlens_q, prefix_lens, max_query_len) for the top-k

    def matches(self, shape: list[int]) -> bool:
        return self.scores is not None and list(self.scores.shape) == list(shape)


INDEXER_HANDOFF = IndexerHandoff()


def _path(name: str, ops: tuple[str, ...], description: str, conditions: tuple[Condition, ...],
          kernels: tuple[str, ...]) -> FastPath:
    return FastPath(name=name, ops=ops, conditions=conditions, kernels=kernels, description=description)


@dataclass(frozen=True)
class DeviceCondition(Condition):
    """A condition on the device type (what :func:`m3_registry`'s ``also_on`` widens)."""


def _on(*devices: str) -> Condition:
    return DeviceCondition(f"runs on {'/'.join(devices)}", lambda c: c.device in devices, lambda c: c.device)


def _requests_from_shapes(c: CallContext) -> int:
    return c.shapes["cu_seqlens_q"][0] - 1


@dataclass(frozen=True)
class VllmAnswers:
    """The fast-path resolver's answers for one deployment, as this registry reads them (data only).

    ``paths``: ``"<family>:<phase>"`` (family = the registry path's prefix, phase ``decode`` / ``prefill`` /
    ``any``) -> the registry path vLLM takes; ``gemm_regime(m, n, k)``: ``"decode"`` when vLLM's MXFP8
    ``_select_cfg`` gives the call the tile of one row, else ``"prefill"``; ``source``: the deployment;
    ``refused``: vLLM's own reason when it refuses the deployment at start-up (then no path runs).
    """

    paths: Mapping[str, str] = field(default_factory=dict)
    gemm_regime: Callable[[int, int, int], str] | None = None
    source: str = ""
    refused: str = ""

    def path_for(self, family: str, phase: str) -> str | None:
        return self.paths.get(f"{family}:{phase}", self.paths.get(f"{family}:any"))


def _call_phase(c: CallContext) -> str:
    """decode / prefill for the call (the reference model's own split of a step's calls)."""
    a, sh = c.attrs, c.shapes
    if c.op == "attention":
        return "decode" if a.get("q_tokens") == a.get("requests") else "prefill"
    if c.op == "indexer":
        return "decode" if sh["iq"][0] == _requests_from_shapes(c) else "prefill"
    return "any"


def _vllm_takes(name: str, answers: VllmAnswers) -> Condition:
    """The resolver's answer: vLLM takes ``name`` for this call (one condition, the same for every path)."""
    family = name.split(".")[0]

    if answers.refused:
        return Condition(f"vLLM starts this deployment ({answers.source})", lambda c: False,
                         lambda c: answers.refused)

    def want(c: CallContext) -> str | None:
        if name.startswith("gemm.mxfp8") and answers.gemm_regime is not None:
            return f"gemm.mxfp8_dot_scaled_{answers.gemm_regime(c.attrs['m'], c.attrs['n'], c.attrs['k'])}"
        return answers.path_for(family, _call_phase(c))

    return Condition(f"vLLM takes {name} here ({answers.source})", lambda c: want(c) in (name, None),
                     lambda c: f"vLLM takes {want(c)}")


def _also_on(cond: Condition, devices: tuple[str, ...]) -> Condition:
    if not isinstance(cond, DeviceCondition) or not devices:
        return cond
    return DeviceCondition(f"{cond.description} (or {'/'.join(devices)})",
                           lambda c: c.device in devices or cond.check(c), cond.seen)


def _sparse() -> Condition:
    return Condition("sparse-attention layer", lambda c: bool(c.attrs["sparse"]), lambda c: "dense layer")


def _uniform_decode(field_t: str, field_r: str, want: bool) -> Condition:
    word = "decode (one row per request)" if want else "prefill or mixed step"
    return Condition(word, lambda c: (c.attrs[field_t] == c.attrs[field_r]) is want,
                     lambda c: f"{c.attrs.get(field_t)} rows for {c.attrs.get(field_r)} requests")




def _attention_paths() -> list[FastPath]:
    common = (_sparse(), Condition("KV block size 128", lambda c: c.attrs["block_size"] == 128,
                                   lambda c: f"block size {c.attrs['block_size']}"),
              Condition("head_dim 128", lambda c: c.attrs["head_dim"] == 128, lambda c: c.attrs.get("head_dim")),
              Condition("KV cache bf16/fp16/fp8", lambda c: c.dtypes["k_cache"] in KV_DTYPES,
                        lambda c: c.dtypes.get("k_cache")))
    return [
        _path("attention.aiter_sparse_pa", ("attention",),
                 "AITER page-16 sparse paged attention (pa_decode_gluon) (A1)", (*common, _on("hip")),
                 ("pa_decode_gluon",)),
        _path("attention.triton_sparse_decode", ("attention",),
                 "vLLM's Triton split-K block-sparse decode + LSE merge (common/ops/sparse_attn.py)",
                 (*common, _uniform_decode("q_tokens", "requests", True), _on("cuda")),
                 ("_gqa_sparse_decode_kernel", "_merge_topk_attn_out_kernel")),
        _path("attention.triton_sparse_prefill", ("attention",),
                 "vLLM's Triton block-sparse prefill (common/ops/sparse_attn.py)",
                 (*common, _uniform_decode("q_tokens", "requests", False), _on("cuda")),
                 ("_gqa_sparse_fwd_kernel",)),
    ]


def _indexer_paths() -> list[FastPath]:
    def decode(want: bool) -> Condition:
        word = "decode (one row per request)" if want else "prefill or mixed step"
        return Condition(word, lambda c: (c.shapes["iq"][0] == _requests_from_shapes(c)) is want,
                         lambda c: f"{c.shapes['iq'][0]} rows for {_requests_from_shapes(c)} requests")

    def from_vllm_indexer() -> Condition:
        def check(c: CallContext) -> bool:
            return INDEXER_HANDOFF.matches(c.shapes["scores"])
        return Condition("scores from vLLM's indexer call of this layer", check, lambda c: "reference scores")

    def selected(want: bool) -> Condition:
        def check(c: CallContext) -> bool:
            return (INDEXER_HANDOFF.topk is not None) is want
        word = "decode: vLLM's indexer call already selected" if want else "prefill: scores only, top-k to select"
        return Condition(word, check, lambda c: "the other phase")

    index_dim = Condition("index head_dim 128", lambda c: c.attrs["head_dim"] == 128, lambda c: c.attrs.get("head_dim"))
    return [
        _path("indexer.msa_fp8", ("indexer",), "AITER fp8 MFMA block score (MSA indexer, gfx950, fp8 index cache) (A2)",
                 (index_dim, Condition("fp8 index cache", lambda c: c.dtypes["index_cache"].startswith("float8"),
                                       lambda c: c.dtypes.get("index_cache")), _on("hip")),
                 ("pa_sparse_block_score_decode", "pa_sparse_block_score_prefill")),
        _path("indexer.triton_decode", ("indexer",), "vLLM's Triton decode index score + top-k (one call) (A3)",
                 (index_dim, decode(True), _on("cuda")),
                 ("_decode_index_score_kernel", "_topk_index_partial_kernel", "_topk_index_merge_kernel")),
        _path("indexer.triton_prefill", ("indexer",), "vLLM's Triton prefill block-max index score (A3)",
                 (index_dim, decode(False), _on("cuda")), ("_index_block_score_kernel",)),
        _path("indexer.triton_amd_decode", ("indexer",), "vLLM's AMD Triton decode score (balanced or split-K) + "
                 "fused last-arriver top-k, which can emit the page-16 table (A3)", (index_dim, decode(True), _on("hip")),
                 ("_decode_index_score_kernel", "_decode_index_score_balanced_kernel", "_decode_topk_fused_kernel")),
        _path("indexer.triton_amd_prefill", ("indexer",), "vLLM's AMD Triton prefill block score (A3)",
                 (index_dim, decode(False), _on("hip")), ("_index_block_score_kernel",)),
        _path("topk.triton_decode", ("topk",), "the top-k of vLLM's fused decode indexer call (no extra launch)",
                 (from_vllm_indexer(), selected(True)), ("_topk_index_merge_kernel",)),
        _path("topk.triton_prefill", ("topk",), "vLLM's Triton bitonic top-k with init/local forcing (A3)",
                 (from_vllm_indexer(), selected(False)), ("_topk_index_kernel",)),
    ]


@dataclass(frozen=True)
class LauncherRows(Condition):
    """m3lab's GEMM launcher's decode bound (what splits the two MXFP8 paths without the resolver's
    answers; with them, vLLM's tile decides and this condition is dropped)."""


def _launcher_rows(decode: bool) -> Condition:
    bound = LAUNCHER_DECODE_MAX_M
    word = f"M <= {bound} (m3lab's GEMM launcher decode bound)" if decode else f"M > {bound} (m3lab's launcher)"
    return LauncherRows(word, lambda c: (c.attrs["m"] <= bound) is decode, lambda c: f"M={c.attrs['m']}")


def _gemm_paths() -> list[FastPath]:
    def fmt(*formats: str) -> Condition:
        return Condition(f"weights {'/'.join(formats)}", lambda c: c.attrs["w_format"] in formats,
                         lambda c: c.attrs.get("w_format"))
    return [
        _path("gemm.mxfp8_dot_scaled_decode", GEMM_OPS,
                 "MXFP8 dot_scaled linear with the one-row (decode) tile of vLLM's _select_cfg (G2)",
                 (fmt("mxfp8"), _launcher_rows(True), _on(*GPU_DEVICES)), ("_mxfp8_linear_kernel",)),
        _path("gemm.mxfp8_dot_scaled_prefill", GEMM_OPS, "MXFP8 dot_scaled linear, larger tiles (G2)",
                 (fmt("mxfp8"), _launcher_rows(False), _on(*GPU_DEVICES)), ("_mxfp8_linear_kernel",)),
        _path("gemm.unquantized", GEMM_OPS, "vLLM's CUDA unquantized GEMM: F.linear (cuBLAS) (G1 on CUDA)",
                 (fmt("bf16"), _on("cuda")), ("cublas",)),
    ]


def _moe_paths() -> list[FastPath]:
    def fmt(*formats: str) -> Condition:
        return Condition(f"expert weights {'/'.join(formats)}", lambda c: c.attrs["w_format"] in formats,
                         lambda c: c.attrs.get("w_format"))
    return [
        _path("moe.aiter_mxfp8_flydsl", MOE_OPS, "AITER FlyDSL MXFP8 2-stage MoE (M2)",
                 (fmt("mxfp8"), _on("hip")),
                 ("fused_moe",)),
        _path("moe.triton_mxfp8_native", MOE_OPS,
                 "Triton native MXFP8 grouped GEMM (GROUP_SIZE_M program swizzle) + fused SwiGLU-quant (M2)",
                 (fmt("mxfp8"), _on(*GPU_DEVICES)), ("_mxfp8_grouped_gemm_kernel", "_swiglu_oai_quant_kernel")),
        _path("moe.triton_fused_moe", MOE_OPS, "Triton fused_moe_kernel for BF16 experts (M2)",
                 (fmt("bf16"), _on(*GPU_DEVICES)), ("fused_moe_kernel",)),
    ]


def _elementwise_paths() -> list[FastPath]:
    return [
        _path("norm.triton_gemma_rmsnorm", NORM_OPS, "vLLM's fp32 Triton Gemma RMSNorm (N1; a peer of FlashInfer's "
                 "on CUDA)", (Condition("2-D rows", lambda c: len(c.shapes["x"]) == 2, lambda c: c.shapes.get("x")),
                              _on(*GPU_DEVICES)), ("_gemma_rmsnorm_kernel",)),
        _path("activation.triton_swiglu_oai", ACT_OPS, "vLLM's fp32 Triton SwiGLU-OAI (N3; a peer of "
                 "SiluAndMulWithClamp on CUDA)", (_on(*GPU_DEVICES),), ("_swiglu_oai_kernel",)),
    ]


def _m3_fast_paths() -> list[FastPath]:
    """The M3 fast paths, in priority order within each op."""
    return [*_attention_paths(), *_indexer_paths(), *_gemm_paths(), *_moe_paths(), *_elementwise_paths()]


class FastPathRegistry:
    """Named fast paths; kernels attach implementations by name."""

    def __init__(self, paths: list[FastPath] | None = None):
        self.paths: dict[str, FastPath] = {p.name: p for p in (paths or [])}

    def candidates(self, op: str, kind: str) -> list[FastPath]:
        """The declared paths that apply to this op, in declaration order."""
        return [p for p in self.paths.values() if p.applies_to(op, kind)]

    def declare(self, path: FastPath) -> None:
        """Add a path (names are unique)."""
        if path.name in self.paths:
            raise M3LabError(f"fast path {path.name!r} is already declared", field="name")
        self.paths[path.name] = path

    def register_impl(self, name: str, fn: Callable[..., Any], *, reports_launches: bool = False) -> None:
        """Attach the kernel implementation of a declared path (called with the reference's kwargs).

        ``reports_launches``: ``fn`` reports every kernel it launches (``m3lab.kernels.launches``), so a call that
        launched none (a top-k the indexer call already made) is recorded with no kernels, not the declared ones.
        """
        if name not in self.paths:
            raise M3LabError(f"unknown fast path {name!r}; declared: {sorted(self.paths)}", field="name")
        self.paths[name].impl = fn
        self.paths[name].reports_launches = reports_launches

    def table(self) -> list[dict[str, Any]]:
        """One row per path: name, ops, kernels, conditions (descriptions), implemented."""
        return [{"path": p.name, "ops": list(p.ops), "kernels": list(p.kernels),
                 "conditions": [c.description for c in p.conditions], "implemented": p.impl is not None,
                 "description": p.description} for p in self.paths.values()]


_MOE = ("m3lab.kernels.moe.launcher", "fused_moe")
_ATTN = ("m3lab.kernels.sparse_attn.launcher", "attention_varlen")
_INDEXER = ("m3lab.dispatch.repo_kernels", "indexer")
_TOPK = ("m3lab.dispatch.repo_kernels", "topk_blocks")
REPO_KERNELS = {  # fast path -> (module, function) taking the reference's kwargs; each launch is reported
    "gemm.mxfp8_dot_scaled_decode": ("m3lab.kernels.gemm.launcher", "linear"),
    "gemm.mxfp8_dot_scaled_prefill": ("m3lab.kernels.gemm.launcher", "linear"),
    "moe.triton_fused_moe": _MOE, "moe.triton_mxfp8_native": _MOE,
    "attention.triton_sparse_decode": _ATTN, "attention.triton_sparse_prefill": _ATTN,
    "indexer.triton_decode": _INDEXER, "indexer.triton_prefill": _INDEXER,
    "indexer.triton_amd_decode": _INDEXER, "indexer.triton_amd_prefill": _INDEXER,
    "topk.triton_decode": _TOPK, "topk.triton_prefill": _TOPK,
}
KERNEL_SLOTS = {  # declared path -> the repo kernel family that implements it (attached via register_impl)
    "attention.aiter_sparse_pa": "m3lab.kernels.sparse_attn: paged page-16 sparse attention",
    "indexer.msa_fp8": "m3lab.kernels.indexer: fp8 block score + top-k emitting the page table",
    "moe.aiter_mxfp8_flydsl": "m3lab.kernels.moe: MXFP8 grouped MoE with the shared expert as row 128",
}


def attach_impls(registry: FastPathRegistry, impls: dict[str, tuple[str, str] | Callable[..., Any]], *,
                 reports_launches: bool = False) -> dict[str, str]:
    """Attach implementations ({path: (module, function) or a callable}); -> {path: "ok" | error text}."""
    import importlib
    status = {}
    for path, target in impls.items():
        try:
            fn = getattr(importlib.import_module(target[0]), target[1]) if isinstance(target, tuple) else target
            registry.register_impl(path, fn, reports_launches=reports_launches)
            status[path] = "ok"
        except (ImportError, AttributeError) as err:  # a kernel module missing or broken stays unattached
            status[path] = f"{type(err).__name__}: {err}"
    return status


def attach_repo_kernels(registry: FastPathRegistry) -> dict[str, str]:
    """Attach the kernels of this repo that implement declared paths; -> {path: "ok" | error text}."""
    return attach_impls(registry, REPO_KERNELS, reports_launches=True)


def m3_registry(with_kernels: bool = False, *, also_on: tuple[str, ...] = (),
                answers: VllmAnswers | None = None) -> FastPathRegistry:
    """A fresh registry with the M3 fast paths declared; ``with_kernels`` attaches this repo's kernels;
    ``also_on``: device types the device conditions accept besides their GPUs (``("cpu",)``: the Triton
    interpreter, with ``TRITON_INTERPRET=1`` set before triton is imported); ``answers``: the resolver's
    answers for a deployment (each path then also requires that vLLM takes it there)."""
    paths = _m3_fast_paths()
    for p in paths:
        conds = tuple(_also_on(c, tuple(also_on)) for c in p.conditions)
        if answers is not None:
            regime = answers.gemm_regime is not None
            conds = (_vllm_takes(p.name, answers), *(c for c in conds if not (regime and isinstance(c, LauncherRows))))
        p.conditions = conds
    reg = FastPathRegistry(paths)
    if with_kernels:
        attach_repo_kernels(reg)
    return reg
