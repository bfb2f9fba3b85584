"""``m3lab shapes`` (local GEMM/attention shapes over a workload) and ``m3lab model`` (parameter and memory facts)."""
from __future__ import annotations

import json
from typing import Optional

import typer

from m3lab.analysis.shapes import shape_histograms
from m3lab.cli import deploy_options as opt
from m3lab.cli.columns import Column, render, wrap
from m3lab.nb import format_bytes, is_bytes_column
from m3lab.spec.hardware import list_hardware, load_hardware
from m3lab.spec.memory import memory_facts
from m3lab.vllm.fastpaths import effective_plan


def _records(df) -> list[dict]:
    """DataFrame rows as plain JSON-able dicts (numpy scalars converted)."""
    out = []
    for rec in df.to_dict(orient="records"):
        out.append({k: (v.item() if hasattr(v, "item") else v) for k, v in rec.items()})
    return out


def shapes(
    preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None,
    ep: opt.Ep = None, quant: opt.Quant = None, isl: opt.Isl = None, osl: opt.Osl = None,
    concurrency: opt.Concurrency = None, num_prompts: opt.NumPrompts = None, set_: opt.Settings = [],
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", metavar="N", help="vLLM max_num_seqs."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", metavar="N",
                                                         help="vLLM token budget per step."),
    fused_shared: Optional[bool] = typer.Option(None, "--fused-shared/--separate-shared",
                                                help="Ask for shared-expert fusion "
                                                     "(VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1): the shared "
                                                     "expert as an extra row of the routed grouped GEMM, where "
                                                     "vLLM fuses it (the JSON says whether and why not)."),
    index_topk_freq: Optional[int] = typer.Option(None, "--index-topk-freq", metavar="N",
                                                  help="vLLM index sharing: top-k computed every N sparse layers."),
    indexer_cp: Optional[bool] = typer.Option(None, "--indexer-cp/--no-indexer-cp",
                                              help="Ask for vLLM's indexer context parallelism (--attention-config "
                                                   "minimax_m3_indexer_cp): every rank projects all index q heads "
                                                   "where vLLM runs the fp8 MSA indexer context-parallel."),
    routing: str = typer.Option("balanced", "--routing", metavar="MODEL", help="Routing model: balanced or zipf:S."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Local shapes each kernel sees over a workload (projected): distinct GEMMs with their M values."""
    # heavy dependency: the resolver runs vLLM (in a worker) when the deployment asks for what vLLM decides

    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, isl=isl, osl=osl,
                  concurrency=concurrency, num_prompts=num_prompts, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=max_num_batched_tokens, fused_shared_expert=fused_shared,
                  index_topk_freq=index_topk_freq, indexer_cp=indexer_cp)
    plan = effective_plan(d)   # index q and the shared expert as vLLM runs them
    rep = shape_histograms(d, routing=routing, plan=plan)
    wl = d.workload
    result = {"deployment": d.name, "model": d.model.name, "plan": plan.describe(), "quant": rep.meta["quant"],
              "shared_expert_fusion": rep.meta["shared_expert_fusion"],
              "workload": {"isl": wl.isl, "osl": wl.osl, "concurrency": wl.concurrency,
                           "num_requests": rep.meta["num_requests"]},
              "num_steps": rep.num_steps, "kind": rep.meta["kind"],
              "distinct_gemms": _records(rep.distinct_gemms), "grouped_gemms": _records(rep.distinct_grouped)}
    if as_json:
        typer.echo(json.dumps(result))
        return
    _print_shapes(result)


def _plan_text(plan: dict) -> str:
    """``{'tp': 4, 'ep': 1, 'dp': 1, 'role': 'both', ...}`` -> ``TP4 EP1`` (+ DP, role and switches that are on)."""
    text = f"TP{plan.get('tp')} EP{plan.get('ep')}" + (f" DP{plan['dp']}" if plan.get("dp", 1) != 1 else "")
    if plan.get("role", "both") != "both":
        text += f" ({plan['role']})"
    return text + "".join(f", {k}" for k, v in plan.items() if v is True)


def _print_shapes(result: dict) -> None:
    """The shapes at the terminal's width: no op name cut, no line folded inside a word."""
    import shutil


    width = shutil.get_terminal_size((100, 24)).columns
    wl = result.get("workload", {})
    name = result["model"] + (f" ({result['deployment']})" if result.get("deployment") else "")
    head = (f"{name}, {_plan_text(result['plan'])}, {result['quant']} weights; {wl.get('isl')} in / {wl.get('osl')} "
            f"out tokens, concurrency {wl.get('concurrency')}: {result['num_steps']:,} engine steps, {result['kind']}")
    fusion = result["shared_expert_fusion"]
    lines = wrap(head, width) + wrap("shared expert: " + ("fused into the routed grouped GEMM" if fusion["fused"]
                                                          else f"separate MLP ({fusion['reason']})"), width)
    dense = [{**g, "distinct_m": len(g["m_values"]), "m_range": f"{g['m_values'][0]}..{g['m_values'][-1]}"}
             for g in result["distinct_gemms"]]
    lines += [""] + render(dense, [Column("op"), Column("kind"), Column("n", "N", "d"), Column("k", "K", "d"),
                                   Column("dtype"), Column("layers", fmt="d"), Column("distinct_m", "distinct M", "d"),
                                   Column("m_range", "M range", "")], width, title="Dense GEMMs (local shapes)")
    if result["grouped_gemms"]:
        grouped = [{**g, **{k: int(g[k]) for k in ("experts", "topk", "hidden", "inter")}}
                   for g in result["grouped_gemms"]]
        lines += [""] + render(grouped, [Column("op"), Column("experts", fmt="d"), Column("topk", "top-k", "d"),
                                         Column("hidden", fmt="d"), Column("inter", fmt="d"), Column("dtype"),
                                         Column("num_tokens", "distinct T", "d")], width, title="Grouped GEMMs (MoE)")
    typer.echo("\n".join(lines))


def model_facts(
    preset: opt.Preset = None, model: opt.Model = None, hardware: opt.HardwareName = None, tp: opt.Tp = None,
    ep: opt.Ep = None, quant: opt.Quant = None, kv_dtype: opt.KvDtype = None, index_dtype: opt.IndexDtype = None,
    set_: opt.Settings = [],
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Parameter counts, weight bytes per GPU and KV-cache bytes per token (whole model and per rank)."""
    d = opt.build(preset, set_, model=model, hardware=hardware, tp=tp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                  index_dtype=index_dtype)
    spec, q = d.model, d.quant
    facts = memory_facts(d, effective_plan(d))   # index q as vLLM holds it
    facts["weight_bytes_per_gpu"] = int(facts["weight_bytes_per_gpu"])
    profiles = [load_hardware(name) for name in list_hardware()]
    facts["weights_fit_on"] = [h.name for h in profiles if facts["weight_bytes_per_gpu"] < h.hbm_bytes]
    if as_json:
        typer.echo(json.dumps(facts))
        return
    from rich.console import Console
    from rich.table import Table


    t = Table("fact", "value", title=f"{spec.name} at TP{d.plan.tp} EP{d.plan.ep}, {q.name} weights, KV {q.kv_dtype}, "
                                     f"index {q.index_dtype}")
    for k, v in facts.items():
        if k == "weights_fit_on":
            v = ", ".join(v) if v else f"no profile ({', '.join(h.name for h in profiles)}): raise --tp or --ep"
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            v = f"{v:,.0f} B ({format_bytes(v)})" if is_bytes_column(k) and v >= 1e3 else f"{v:,.0f}"
        t.add_row(k, str(v))
    Console().print(t)


def register(app: typer.Typer) -> None:
    app.command("shapes")(shapes)
    app.command("model")(model_facts)
