"""ParallelPlan: validation errors and local sizes (head replication, index heads, EP rows)."""
import pytest

from m3lab.errors import M3LabError
from m3lab.spec import ParallelPlan, load_model


@pytest.fixture(scope="module")
def m3():
    return load_model("minimax-m3")


@pytest.mark.parametrize("tp, q, kv, rep, iq, vocab", [
    (1, 64, 4, 1, 4, 200064), (2, 32, 2, 1, 2, 100032), (4, 16, 1, 1, 1, 50016), (8, 8, 1, 2, 1, 25008)])
def test_local_heads(m3, tp, q, kv, rep, iq, vocab):
    p = ParallelPlan(tp=tp).validate(m3)
    assert (p.heads_q_local(m3), p.heads_kv_local(m3), p.kv_replication(m3), p.index_heads_local(m3),
            p.vocab_local(m3)) == (q, kv, rep, iq, vocab)


def test_expert_rows(m3):
    tp4 = ParallelPlan(tp=4)   # vLLM's default: shared-expert fusion not asked for
    assert (tp4.expert_rows_local(m3), tp4.expert_inter_local(m3)) == (128, 768)
    assert "not asked for" in tp4.shared_fusion_reason(m3)
    assert ParallelPlan(tp=8).expert_inter_local(m3) == 384
    fused = ParallelPlan(tp=4, fused_shared_expert=True)   # the inputs alone: as asked
    assert fused.expert_rows_local(m3) == 129 and fused.fuses_shared(m3)
    ep8 = ParallelPlan(tp=8, ep=8).validate(m3)
    assert (ep8.experts_local(m3), ep8.expert_rows_local(m3), ep8.expert_inter_local(m3)) == (16, 16, 3072)
    assert ep8.shared_inter_local(m3) == 3072 // 8   # the shared expert stays TP-sharded under EP


def test_the_effective_plan_carries_vllms_fusion_answer(m3):
    """Whether vLLM fuses what was asked is vLLM's answer (the resolver's), carried by the EffectivePlan; the
    plan itself restates none of vLLM's conditions (EP, weight formats, GPU)."""
    asked = ParallelPlan(tp=1, dp=2, ep=2, fused_shared_expert=True)   # whole experts, a whole shared expert
    assert asked.fuses_shared(m3)                      # no rule of vLLM's in the plan: the layout allows it
    off = asked.as_run(index_q_replicated=False, shared_expert_fused=False, fusion_off="vLLM's reason")
    assert not off.fuses_shared(m3) and off.shared_fusion_reason(m3) == "vLLM's reason"
    assert off.expert_rows_local(m3) == 64 and off.describe()["shared_expert_fused"] is False
    sharded = ParallelPlan(tp=8, ep=8, fused_shared_expert=True)    # a TP-sharded shared expert, whole experts
    assert "cannot be a row of the local expert table" in sharded.shared_fusion_reason(m3)
    on = ParallelPlan(tp=4, fused_shared_expert=True).as_run(index_q_replicated=False, shared_expert_fused=True)
    assert on.expert_rows_local(m3) == 129 and on.shared_fusion_reason(m3) is None
    assert "not asked for" in ParallelPlan(tp=4).as_run(index_q_replicated=False,
                                                        shared_expert_fused=False).shared_fusion_reason(m3)
    import dataclasses
    assert "index_q_replicated" not in {f.name for f in dataclasses.fields(ParallelPlan)}   # inputs only


def test_fused_projection_widths(m3):
    assert sum(ParallelPlan(tp=4).qkv_widths(m3, sparse=True)) == 2560
    assert sum(ParallelPlan(tp=1).qkv_widths(m3, sparse=True)) == 9856
    assert sum(ParallelPlan(tp=4).qkv_widths(m3, sparse=False)) == 2304
    # asking for indexer CP replicates nothing by itself (vLLM replicates index q only when its MSA-CP gate
    # passes); the resolver's answer sets index_q_replicated (tests/test_fastpaths_resolver.py checks it against vLLM)
    assert sum(ParallelPlan(tp=4, indexer_cp=True).qkv_widths(m3, sparse=True)) == 2560
    assert sum(ParallelPlan(tp=8, indexer_cp=True).qkv_widths(m3, sparse=True)) == 1536
    replicated = ParallelPlan(tp=4, indexer_cp=True).as_run(index_q_replicated=True, shared_expert_fused=False)
    assert sum(replicated.qkv_widths(m3, sparse=True)) == 2944


@pytest.mark.parametrize("plan, field", [
    (ParallelPlan(tp=3), "tp"), (ParallelPlan(tp=4, ep=3), "ep"), (ParallelPlan(tp=0), "tp"),
    (ParallelPlan(tp=4, role="serve"), "role"), (ParallelPlan(tp=2, ep=4), "ep")])
def test_bad_plans(m3, plan, field):
    with pytest.raises(M3LabError) as err:
        plan.validate(m3)
    assert err.value.field == field and field in str(err.value) and "\n" not in str(err.value)


def test_ep_on_dense_model_rejected():
    with pytest.raises(M3LabError, match="ep"):
        ParallelPlan(tp=2, ep=2).validate(load_model("llama-3.1-8b"))


def test_as_plan():
    from m3lab.spec.plan import as_plan

    assert as_plan(None) == ParallelPlan() and not as_plan(None).fused_shared_expert
    assert as_plan({"tp": 2, "fused_shared_expert": True}) == ParallelPlan(tp=2, fused_shared_expert=True)
    with pytest.raises(M3LabError, match="tpp"):
        as_plan({"tpp": 2})
