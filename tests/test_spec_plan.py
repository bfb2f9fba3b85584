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
    tp4 = ParallelPlan(tp=4)
    assert (tp4.expert_rows_local(m3), tp4.expert_inter_local(m3)) == (129, 768)
    assert ParallelPlan(tp=8).expert_inter_local(m3) == 384
    ep8 = ParallelPlan(tp=8, ep=8).validate(m3)
    assert (ep8.experts_local(m3), ep8.expert_rows_local(m3), ep8.expert_inter_local(m3)) == (16, 17, 3072)
    sep = ParallelPlan(tp=4, fused_shared_expert=False)
    assert sep.expert_rows_local(m3) == 128 and not sep.fuses_shared(m3)


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
