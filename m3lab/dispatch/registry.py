"""The declared fast paths of MiniMax M3 (one registry; kernels plug in with :func:`register_impl`).

Each entry states the conditions from the serving write-up and the vLLM/AITER sources
(reference §3–4): the paged sparse kernel needs one KV head per rank and 128-token blocks seen as
8 × 16-token pages; the fused MoE runs the shared expert as expert 128 (129 experts, top-5); decode
GEMMs (M <= 64) use the decode tile table.
"""
from typing import Any, Callable

from m3lab.dispatch.fastpath import CallContext, Condition, FastPath
from m3lab.errors import M3LabError
from m3lab.kernels.gemm.tables import DECODE_MAX_M as DECODE_M_MAX  # our launcher's decode/prefill boundary

GPU_DEVICES = ("cuda", "hip")
GEMM_DTYPES = ("bf16", "fp8", "mxfp8", "mxfp4")


def _on_gpu() -> Condition:
    return Condition("runs on a GPU (cuda/hip)", lambda c: c.device in GPU_DEVICES, lambda c: c.device)


def _m3_fast_paths() -> list[FastPath]:
    """The M3 fast paths, in priority order."""
    return [
        FastPath(
            name="sparse_attn.paged_page16",
            ops=("attention",),
            description="paged sparse attention: 128-token blocks as 8 x 16-token pages, one KV head per rank",
            conditions=(
                Condition("sparse-attention layer", lambda c: bool(c.attrs["sparse"]),
                          lambda c: "dense layer"),
                Condition("one KV head per rank (kv heads per rank == 1, i.e. TP4 or TP8)",
                          lambda c: c.attrs["heads_kv"] == 1,
                          lambda c: f"{c.attrs['heads_kv']} KV heads per rank at tp={c.plan.get('tp', 1)}"),
                Condition("KV block size 128 (= 8 consecutive 16-token pages)",
                          lambda c: c.attrs["block_size"] == 128, lambda c: f"block size {c.attrs['block_size']}"),
                Condition("KV dtype bf16 or fp8", lambda c: c.dtypes["k_cache"] in ("bfloat16", "float8_e4m3fn", "float8_e5m2"),
                          lambda c: c.dtypes.get("k_cache")),
                _on_gpu(),
            ),
            kernels=("sparse_paged_attention_page16",),
        ),
        FastPath(
            name="moe.fused_shared_grouped_gemm",
            ops=("moe_gate_up", "moe_down"),
            description="one grouped GEMM for 128 routed + 1 shared expert (top-4 + 1)",
            conditions=(
                Condition("shared expert fused (plan.fused_shared_expert)",
                          lambda c: bool(c.plan.get("fused_shared_expert")),
                          lambda c: f"fused_shared_expert={c.plan.get('fused_shared_expert')}"),
                Condition("129 experts in the table (128 routed + shared as expert 128)",
                          lambda c: c.attrs["experts"] == c.attrs["routed_experts"] + 1,
                          lambda c: f"{c.attrs['experts']} experts"),
                Condition("weights bf16, mxfp8 or mxfp4", lambda c: c.attrs["w_format"] in GEMM_DTYPES,
                          lambda c: c.attrs.get("w_format")),
                _on_gpu(),
            ),
            kernels=("fused_moe_kernel",),
        ),
        FastPath(
            name="gemm.decode_tile_table",
            ops=("gemm", "lm_head"),
            description="shape-aware GEMM launcher, decode tiles (narrow N tile, larger K step) for M <= 64",
            conditions=(
                Condition(f"decode-sized M <= {DECODE_M_MAX}", lambda c: c.attrs["m"] <= DECODE_M_MAX,
                          lambda c: f"M={c.attrs['m']}"),
                Condition("weights bf16, fp8, mxfp8 or mxfp4", lambda c: c.attrs["w_format"] in GEMM_DTYPES,
                          lambda c: c.attrs.get("w_format")),
                _on_gpu(),
            ),
            # kernels/gemm decode regime: GEMV split-K for M <= 4, the tensor-core split-K kernel above
            kernels=("gemv_splitk_kernel", "gemm_splitk_kernel"),
        ),
        FastPath(
            name="gemm.prefill_tile_table",
            ops=("gemm", "lm_head"),
            description="shape-aware GEMM launcher, prefill tiles for M > 64",
            conditions=(
                Condition(f"prefill-sized M > {DECODE_M_MAX}", lambda c: c.attrs["m"] > DECODE_M_MAX,
                          lambda c: f"M={c.attrs['m']}"),
                Condition("weights bf16, fp8, mxfp8 or mxfp4", lambda c: c.attrs["w_format"] in GEMM_DTYPES,
                          lambda c: c.attrs.get("w_format")),
                _on_gpu(),
            ),
            kernels=("gemm_tiled_kernel",),  # kernels/gemm: prefill regime = tiled kernel
        ),
        FastPath(
            name="indexer.index_topk",
            ops=("indexer",),
            description="fused block-max index scores + top-k blocks",
            conditions=(_on_gpu(),),
            kernels=("index_topk_kernel",),
        ),
    ]


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

    def register_impl(self, name: str, fn: Callable[..., Any]) -> None:
        """Attach the kernel implementation of a declared path (called with the reference's kwargs)."""
        if name not in self.paths:
            raise M3LabError(f"unknown fast path {name!r}; declared: {sorted(self.paths)}", field="name")
        self.paths[name].impl = fn

    def table(self) -> list[dict[str, Any]]:
        """One row per path: name, ops, kernels, conditions (descriptions), implemented."""
        return [{"path": p.name, "ops": list(p.ops), "kernels": list(p.kernels),
                 "conditions": [c.description for c in p.conditions], "implemented": p.impl is not None,
                 "description": p.description} for p in self.paths.values()]


REPO_KERNELS = {  # fast path -> (module under m3lab.kernels, function) taking the reference's kwargs
    "gemm.decode_tile_table": ("m3lab.kernels.gemm.launcher", "linear"),
    "gemm.prefill_tile_table": ("m3lab.kernels.gemm.launcher", "linear"),
}


def attach_repo_kernels(registry: FastPathRegistry) -> dict[str, str]:
    """Attach the kernels of this repo that implement declared paths; -> {path: "ok" | error text}."""
    import importlib
    status = {}
    for path, (module, fn) in REPO_KERNELS.items():
        try:
            registry.register_impl(path, getattr(importlib.import_module(module), fn))
            status[path] = "ok"
        except (ImportError, AttributeError) as err:  # a kernel module missing or broken stays unattached
            status[path] = f"{type(err).__name__}: {err}"
    return status


def m3_registry(with_kernels: bool = False) -> FastPathRegistry:
    """A fresh registry with the M3 fast paths declared; ``with_kernels`` attaches this repo's kernels."""
    reg = FastPathRegistry(_m3_fast_paths())
    if with_kernels:
        attach_repo_kernels(reg)
    return reg
