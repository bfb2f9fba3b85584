"""The KV hand-off executed between processes (gloo on CPU): prefill ranks send by the descriptors, decode ranks
receive into their own layout; the received KV matches byte for byte and decoding from it gives the
single-process logits; a deliberately wrong offset is caught and located."""

from m3lab.pd.geometry import CacheSide
from m3lab.pd.transfer import byte_index, verify_handoff
from m3lab.spec.plan import ParallelPlan

def test_tp4_to_tp4_triton():
    res = verify_handoff(CacheSide(ParallelPlan(tp=4)), CacheSide(ParallelPlan(tp=4)))
    assert res.mismatches == [] and res.logits_equal, res
    assert res.bytes > 0


def test_tp2_to_tp4_mixed_layouts_and_a_wrong_offset_is_caught():
    res = verify_handoff(CacheSide(ParallelPlan(tp=2)), CacheSide(ParallelPlan(tp=4), layout="aiter"),
                         prompt_len=41, corrupt=7)
    assert res.mismatches == [] and res.logits_equal, res
    layer, region, rank, block = res.corrupted
    assert res.corrupted_mismatches and all((m[0], m[1], m[2]) == (layer, region, rank)
                                            for m in res.corrupted_mismatches)
    assert res.corrupted_mismatches[0][3] == [block]


def test_byte_index():
    import numpy as np
    assert byte_index(np.array([10, 3]), np.array([2, 3])).tolist() == [10, 11, 3, 4, 5]
