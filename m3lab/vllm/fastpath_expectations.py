"""Step 4 on the real paths: fast-path expectations generated from the resolver for a deployment.

:func:`expectations_for` resolves a deployment at a decode step and a prefill step and turns every decision
that the reference model can take (a path declared in ``m3lab.dispatch.registry``) into an expectation of
``m3lab.traces.expectations``: the op and layers, the registry path that must have run, the kernels a
profiler trace must show inside that op, and the structure the plan implies (129 experts and no separate
shared MLP when vLLM fuses the shared expert). Nothing is hand-written: the kernel regexes are the resolver's
kernel names. :func:`load_expectations` (``m3lab trace verify --expect preset:<name>``) generates them on the fly; the shipped YAML files in
``m3lab/traces/expectations`` are this module's output (:func:`write_shipped`, checked by a test).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from m3lab.errors import M3LabError
from m3lab.spec.serving import Deployment, load_preset
from m3lab.traces.expectations import Expectations
from m3lab.traces.predicates import AllOf, AnyOf, Cmp, Dim, Has
from m3lab.vllm.fastpaths import Decision, resolve_cached
from m3lab.vllm.serve_command import launch_line

PHASE_TOKENS = {"decode": 32, "prefill": 4096}
GEMM_OPS = "qkv_proj|o_proj|gate_up_proj|down_proj|shared_gate_up|shared_down"
SHIPPED = {"minimax_m3_tp4": "mxfp8-tp4-optimised", "minimax_m3_h200_tp4": "h200-bf16-tp4"}
# how the dispatcher's records tell the phases apart (shapes of the reference model's ops)
ATTN_WHERE = {phase: AllOf((Has("blocks"), Cmp(Dim("q", 0), op, Dim("seq_lens", 0))))
              for phase, op in (("decode", "=="), ("prefill", "!="))}
INDEXER_WHERE = {phase: Cmp(Dim("iq", 0), op, Dim("cu_seqlens_q", 0), offset=-1)
                 for phase, op in (("decode", "=="), ("prefill", "!="))}
GEMM_WHERE = {"decode": Cmp(Dim("x", 0), "<=", 64), "prefill": Cmp(Dim("x", 0), ">", 64)}
TOPK_WHERE = {"decode": Cmp(Dim("positions", 0), "<=", 64),  # the top-k op sees rows only
              "prefill": Cmp(Dim("positions", 0), ">", 64)}
_KERNEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _kernel_regexes(d: Decision) -> list[str]:
    """The launchable kernel names of a decision as regexes (library entries with spaces are left out)."""
    out = []
    for k in d.kernels:
        name = k.split(" ")[0]
        if name == "pa_decode_gluon":
            out.append("pa_decode_gluon|paged_attention_decode.*gluon")
        elif name in ("_gemma_rmsnorm_kernel", "_gemma_fused_add_rmsnorm_kernel"):
            out.append("_gemma_(fused_add_)?rmsnorm_kernel")  # the reference model adds the residual apart
        elif name.startswith("_") and _KERNEL_NAME.match(name):  # vLLM's Triton kernels; library calls are left out
            out.append(re.escape(name))
    return list(dict.fromkeys(out))


def _layers(dep: Deployment, kind: str) -> Any:
    m = dep.model
    if kind == "dense":
        return [i for i in range(m.layers) if i not in m.sparse_layers]
    src = m.topk_source()
    if kind == "sparse":
        return [i for i in m.sparse_layers if src[i] == i]
    return [i for i in m.sparse_layers if src[i] != i]


def _registry_path(d: Decision, phase: str) -> str | None:
    """The reference model's registry path for a resolver decision, or None when it has none."""
    table = {("attention", "triton_sparse"): f"attention.triton_sparse_{phase}",
             ("attention", "aiter_sparse_pa"): "attention.aiter_sparse_pa",
             ("indexer", "msa_fp8"): "indexer.msa_fp8",
             ("experts", "aiter_mxfp8_flydsl"): "moe.aiter_mxfp8_flydsl",
             ("experts", "triton_mxfp8_native"): "moe.triton_mxfp8_native",
             ("experts", "triton_fused_moe"): "moe.triton_fused_moe",
             ("norm", "triton_gemma_rmsnorm"): "norm.triton_gemma_rmsnorm",
             ("activation", "triton_swiglu_oai"): "activation.triton_swiglu_oai"}
    if d.op == "indexer" and d.path.startswith("triton_common"):
        return f"indexer.triton_{phase}"
    if d.op == "indexer" and d.path.startswith("triton_amd"):
        return f"indexer.triton_amd_{phase}"
    if d.path.startswith("mxfp8_dot_scaled"):
        return f"gemm.mxfp8_dot_scaled_{'decode' if phase == 'decode' else 'prefill'}"
    if d.path == "cublas":
        return "gemm.unquantized"
    return table.get((d.op, d.path))


def _cite(d: Decision) -> str:
    return f"{d.decision} {d.path}: {d.decided_by}"


def expectations_for(dep: Deployment, name: str | None = None) -> dict[str, Any]:
    """The expectations (a YAML-ready dict) of a deployment, from the resolver at a decode and a prefill step."""
    items: list[dict[str, Any]] = []
    for phase, tokens in PHASE_TOKENS.items():
        res = resolve_cached(dep, tokens=tokens, phase=phase)
        if not res.ok:
            raise M3LabError(f"vLLM refuses {dep.name or 'this deployment'}: {res.refused[0].note}", field="--preset")
        seen: set[str] = set()
        for d in res.decisions:
            path = _registry_path(d, phase)
            if path is None or d.status != "runs" or d.layer_kind == "sparse_reuse":
                continue
            key = f"{d.op}:{path}"
            if key in seen:
                continue
            seen.add(key)
            kernels = _kernel_regexes(d)
            item: dict[str, Any] = {"id": f"{d.op}_{phase}",
                                    "description": f"{phase}: {d.op} runs {d.path} ({_cite(d)})"}
            if d.op == "attention":
                item.update(op="attention", layers=_range(list(dep.model.sparse_layers)), where=ATTN_WHERE[phase])
            elif d.op == "indexer":
                item.update(op="indexer", layers=_range(_layers(dep, "sparse")), where=INDEXER_WHERE[phase])
                top, kernels = _indexer_topk(dep, d, phase, kernels)
                items.append(top)
            elif d.op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "shared_gate_up", "shared_down"):
                if any(i.get("path") == path and i["op"] == GEMM_OPS for i in items):
                    continue
                item.update(id=f"gemm_{phase}", op=GEMM_OPS, where=GEMM_WHERE[phase])
            elif d.op == "lm_head":
                item.update(op="lm_head")
            elif d.op == "experts":
                item.update(op=MOE_OPS)
            elif d.op == "norm":
                item.update(op="input_norm|post_attn_norm|final_norm")
            elif d.op == "activation":
                if any(i["op"] == "act|shared_act" for i in items):
                    continue
                item.update(op="act|shared_act")
            else:
                continue
            item["path"] = path
            if kernels:
                item["kernels"] = kernels
            if "where" in item:  # a trace may hold one phase only
                item["optional"] = True
            else:  # the same call in both phases: one expectation
                item["id"] = d.op
                if any(i["id"] == item["id"] and i["path"] == path for i in items):
                    continue
                item["description"] = item["description"].split(": ", 1)[1]
            items.append(item)
    items.extend(_moe_structure(dep))
    _unique_ids(items)
    return {"name": name or f"preset:{dep.name}", "description": f"generated by m3lab.vllm.fastpath_expectations from "
            f"the resolver for {dep.name or 'a deployment'}: {dep.description}".strip(),
            "vllm_command": launch_line(dep), "expectations": items}


def _indexer_topk(dep: Deployment, d, phase: str, kernels: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(the top-k expectation of the indexer's path, the indexer call's own kernels): vLLM's decode call selects
    inside the indexer launch; at prefill the top-k is its own launch."""
    fused = phase == "decode"
    topk_kernels = [k for k in kernels if "topk" in k and not fused]
    top: dict[str, Any] = {"id": f"topk_{phase}", "description": f"{phase}: the top-k of the indexer's path"
                           f"{' (selected inside the indexer call)' if fused else ''} ({_cite(d)})",
                           "op": "topk", "layers": _range(_layers(dep, "sparse")),
                           "where": TOPK_WHERE[phase], "path": f"topk.triton_{phase}", "optional": True}
    if topk_kernels:
        top["kernels"] = topk_kernels
    return top, [k for k in kernels if fused or "topk" not in k]


def _unique_ids(items: list[dict[str, Any]]) -> None:
    """Numbers repeated ids in place (``gemm_decode``, ``gemm_decode_2``): two ops of one phase may share a family."""
    seen_ids: dict[str, int] = {}
    for it in items:
        n = seen_ids.get(it["id"], 0)
        seen_ids[it["id"]] = n + 1
        if n:
            it["id"] = f"{it['id']}_{n + 1}"


def _range(layers: list[int]) -> Any:
    layers = sorted(layers)
    if layers and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return layers


# The reference model's MoE experts op (w13, w2, ids); traces that record the two grouped GEMMs apart name them
# moe_gate_up / moe_down (weight w).
MOE_OPS = "moe_experts|moe_gate_up|moe_down"


def _moe_structure(dep: Deployment) -> list[dict[str, Any]]:
    """What the plan's shared-expert fusion (as vLLM resolves it) means for the reference model's MoE calls."""
    res = resolve_cached(dep, tokens=PHASE_TOKENS["decode"])
    e = res.decision("experts", "sparse")
    experts, topk = e.shape.experts, e.shape.topk
    fused = topk == dep.model.topk + 1
    item: dict[str, Any] = {"id": "moe_expert_table", "op": MOE_OPS,
                            "description": f"{e.shape} per rank ({'shared expert fused' if fused else 'separate shared MLP'}"
                                           f"; {res.decision('routing', 'sparse').decided_by})",
                            "require": AllOf((Cmp(Dim("ids", 1), "==", topk),
                                              AnyOf((AllOf((Has("w13"), Cmp(Dim("w13", 0), "==", experts))),
                                                     AllOf((Has("w"), Cmp(Dim("w", 0), "==", experts)))))))}
    if fused:
        item["absent_ops"] = ["shared_gate_up", "shared_down"]
        return [item]
    return [item, {"id": "shared_expert_mlp", "op": "shared_gate_up|shared_down",
                   "description": "the shared expert runs as its own MLP (fusion off)"}]


GENERATED_PREFIX = "preset:"


def load_expectations(name_or_path: str) -> Expectations:
    """``preset:<serving preset>``: the expectations generated for it; anything else: ``Expectations.load``."""
    text = str(name_or_path)
    if text.startswith(GENERATED_PREFIX):
        return Expectations.from_dict(expectations_for_preset(text[len(GENERATED_PREFIX):]), text)
    return Expectations.load(name_or_path)


def expectations_for_preset(name: str) -> dict[str, Any]:
    return expectations_for(load_preset(name), name=f"preset:{name}")


def render_yaml(doc: dict[str, Any]) -> str:
    """The expectations as YAML; typed predicates written as their text (read back as expressions)."""
    import yaml
    items = [{k: (v.text if k in ("where", "require") else v) for k, v in it.items()} for it in doc["expectations"]]
    doc = {**doc, "expectations": items}
    head = ("# GENERATED by m3lab.vllm.fastpath_expectations.write_shipped() from the fast-path resolver; do not edit.\n"
            "# Regenerate: python -c 'from m3lab.vllm.fastpath_expectations import write_shipped; write_shipped()'\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=110)


def write_shipped(directory: str | Path | None = None) -> list[Path]:
    """(Re)write the shipped expectation files generated from presets (:data:`SHIPPED`)."""
    from m3lab.traces.expectations import _shipped_dir
    out = Path(directory) if directory else _shipped_dir()
    paths = []
    for file, preset in SHIPPED.items():
        doc = expectations_for_preset(preset)
        doc["name"] = file
        path = out / f"{file}.yaml"
        path.write_text(render_yaml(doc), encoding="utf-8")
        paths.append(path)
    return paths


class _TileRegime:
    """``gemm_regime`` of :class:`~m3lab.dispatch.registry.VllmAnswers`: vLLM's ``_select_cfg`` on the target,
    asked in its worker process once per (m, n, k)."""

    def __init__(self, hardware):
        self.hardware, self.seen = hardware, {}

    def __call__(self, m: int, n: int, k: int) -> str:
        if (m, n, k) not in self.seen:
            from m3lab.vllm import decide_linear, workers
            from m3lab.vllm.emulate import Target
            self.seen[(m, n, k)] = workers.call(Target.of(self.hardware), decide_linear.tile_regime,
                                                self.hardware, m, n, k)
        return self.seen[(m, n, k)]


def registry_answers(dep: Deployment):
    """The resolver's answers for ``dep`` as the reference model's registry reads them
    (``m3_registry(answers=registry_answers(dep))``): per op family and phase, the path vLLM takes."""
    from m3lab.dispatch.registry import VllmAnswers
    paths: dict[str, str] = {}
    source = dep.name or dep.hardware.name
    for phase, tokens in PHASE_TOKENS.items():
        res = resolve_cached(dep, tokens=tokens, phase=phase)
        if not res.ok:
            first = res.refused[0]
            return VllmAnswers(source=source, refused=f"{first.note} ({first.decided_by})")
        for d in res.decisions:
            path = _registry_path(d, phase)
            if path is None or d.status != "runs" or d.layer_kind == "sparse_reuse" or path.startswith("gemm."):
                continue
            family = path.split(".")[0]
            key = f"{family}:{phase if family in ('attention', 'indexer', 'topk') else 'any'}"
            paths.setdefault(key, path)
    return VllmAnswers(paths=paths, gemm_regime=_TileRegime(dep.hardware), source=source)
