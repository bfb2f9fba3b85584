"""vLLM's dispatch rules have one copy: vLLM's own code, run by the fast-path resolver. The reference model's
registry reads the resolver's answers; a second list of vLLM's rules reappearing anywhere fails here.

Two checks, each shown to fail on a planted copy:
- every condition the registry declares is an implementation requirement (device, weight format, layer
  kind, the call's phase, the kernels' shape contract) or the resolver's answer, never one of vLLM's
  dispatch conditions;
- no m3lab module outside the resolver states one of vLLM's dispatch rules in m3lab's words (the phrases
  below), and m3lab's GEMM launcher bound is never named as vLLM's;
- the parallel plan decides no vLLM rule: whether vLLM fuses the shared expert that was asked for (expert
  parallelism, weight formats, the GPU's model) is the resolver's answer, carried by the effective plan.
"""
import re
from pathlib import Path

import m3lab
from m3lab.spec import load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.dispatch import registry
from m3lab.dispatch.fastpath import CallContext, Condition
from m3lab.dispatch.registry import VllmAnswers, m3_registry

# The kinds of condition a registry path may declare (what one reference call must satisfy to run a kernel).
IMPLEMENTATION = re.compile(
    r"^(runs on .+|(expert )?weights .+|sparse-attention layer|KV block size 128|head_dim 128|index head_dim 128|"
    r"KV cache bf16/fp16/fp8|fp8 index cache|2-D rows|decode \(one row per request\)|prefill or mixed step|"
    r"M [<>]=? \d+ \(m3lab's (GEMM )?launcher( decode bound)?\)|scores from vLLM's indexer call of this layer|"
    r"decode: vLLM's indexer call already selected|prefill: scores only, top-k to select|vLLM takes .+ here \(.+\))$")
# Rules of vLLM the resolver restated before it ran vLLM's code, as they were phrased (and variants).
RESTATED = re.compile(r"one KV head per rank|no expert parallelism|vLLM's MXFP8 _select_cfg decode bound|"
                      r"= vLLM's MXFP8|M <= 64\b.*vLLM|aiter_supported and|gfx950 and t <= 32|"
                      r"wvSplitKrc: gfx950, 10 <= tokens|AITER tgemm: VLLM_ROCM_USE_AITER|"
                      r"vLLM fuses only with enable_expert_parallel off|have different weight formats")
RESOLVER = ("m3lab/vllm/",)  # where vLLM's code is run (and its rules are named, to cite them)
# synthetic traces and their expectation docs describe a scenario (their own stated assumptions), decide nothing
SCENARIOS = ("m3lab/traces/examples.py", "m3lab/traces/expectations.py")


def bad_conditions(reg) -> list[str]:
    return [f"{p.name}: {c.description}" for p in reg.paths.values() for c in p.conditions
            if not IMPLEMENTATION.match(c.description)]


def restated_rules(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith(RESOLVER) or rel in SCENARIOS:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RESTATED.search(line):
                out.append(f"{rel}:{n}: {line.strip()}")
    return out


def test_the_registry_declares_no_vllm_rule():
    assert not bad_conditions(m3_registry())
    answers = VllmAnswers(paths={"moe:any": "moe.triton_mxfp8_native"}, gemm_regime=lambda m, n, k: "decode",
                          source="test")
    assert not bad_conditions(m3_registry(answers=answers))


def test_a_planted_vllm_rule_in_the_registry_is_caught():
    reg = m3_registry()
    path = reg.paths["moe.aiter_mxfp8_flydsl"]
    path.conditions = (*path.conditions, Condition("no expert parallelism", lambda c: c.plan.get("ep", 1) == 1))
    assert bad_conditions(reg) == ["moe.aiter_mxfp8_flydsl: no expert parallelism"]


def test_no_module_restates_vllms_rules(tmp_path):
    root = Path(m3lab.__file__).parent
    assert not restated_rules(root)
    planted = tmp_path / "m3lab" / "cost"
    planted.mkdir(parents=True)
    (planted / "moe_rule.py").write_text('COND = "no expert parallelism"  # FlyDSL MXFP8 experts\n')
    assert restated_rules(tmp_path / "m3lab") == ['m3lab/cost/moe_rule.py:1: COND = "no expert parallelism"'
                                                  '  # FlyDSL MXFP8 experts']


def test_the_registry_takes_the_path_the_resolver_answers():
    """With answers, a path vLLM does not take is rejected with vLLM's choice; the GEMM split is vLLM's tile."""
    answers = VllmAnswers(paths={"moe:any": "moe.triton_mxfp8_native"},
                          gemm_regime=lambda m, n, k: "decode" if m <= 128 else "prefill", source="a deployment")
    reg = m3_registry(answers=answers)
    ctx = CallContext(op="moe_experts", layer=3, kind="moe", shapes={}, dtypes={}, device="hip", plan={"tp": 4},
                      attrs={"w_format": "mxfp8"})
    assert reg.paths["moe.aiter_mxfp8_flydsl"].conditions[0].failure(ctx) == (
        "vLLM takes moe.aiter_mxfp8_flydsl here (a deployment) (got vLLM takes moe.triton_mxfp8_native)")
    assert reg.paths["moe.triton_mxfp8_native"].conditions[0].failure(ctx) is None
    gemm = CallContext(op="o_proj", layer=3, kind="gemm", shapes={}, dtypes={}, device="hip", plan={"tp": 4},
                       attrs={"w_format": "mxfp8", "m": 96, "n": 6144, "k": 2048})
    decode = reg.paths["gemm.mxfp8_dot_scaled_decode"]
    assert decode.conditions[0].failure(gemm) is None   # vLLM's tile for M=96, not m3lab's launcher bound
    assert not any(isinstance(c, registry.LauncherRows) for c in decode.conditions)


def plan_fusion_rules(plan_cls=ParallelPlan) -> list[str]:
    """The launch-line inputs besides the request itself that change the plan's own fusion answer (each would be
    a copy of one of vLLM's conditions in ``MiniMaxM3MoE.__init__``)."""
    m3 = load_model("minimax-m3")
    asked = plan_cls(tp=1, dp=2, fused_shared_expert=True)   # layouts where the shared expert is a routed expert's size
    varied = {"expert parallelism": plan_cls(tp=1, dp=2, ep=2, fused_shared_expert=True),
              "tensor parallelism": plan_cls(tp=4, dp=2, fused_shared_expert=True),
              "indexer context parallelism": plan_cls(tp=1, dp=2, fused_shared_expert=True, indexer_cp=True)}
    return [what for what, plan in varied.items() if plan.fuses_shared(m3) != asked.fuses_shared(m3)]


def test_the_plan_restates_no_fusion_rule(monkeypatch):
    assert plan_fusion_rules() == []
    rule = ParallelPlan.shared_fusion_reason   # planted: vLLM's EP condition copied into the plan

    def with_ep_rule(self, model):
        return "off under EP" if self.ep > 1 else rule(self, model)
    monkeypatch.setattr(ParallelPlan, "shared_fusion_reason", with_ep_rule)
    assert plan_fusion_rules() == ["expert parallelism"]
