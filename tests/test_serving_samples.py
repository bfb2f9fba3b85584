"""The shipped InferenceX samples against m3lab's estimate of the same model and deployment (issue 4)."""
import pytest

from m3lab.serving.samples import SPEC_TOKENS, estimate_sample, sample_deployment
from m3lab.serving.vllm_bench import SHIPPED_BENCH


@pytest.mark.parametrize("name", sorted(SHIPPED_BENCH))
def test_sample_estimate_runs_and_ceiling_holds(name):
    d = sample_deployment(name)
    assert d["model"] in ("qwen3.5-397b-a17b", "glm-5.2") and d["hardware"] == "mi355x" and d["tp"] == 4
    assert 1 < d["accept_len"] <= SPEC_TOKENS + 1                            # ITL / TPOT of the MTP run
    est = estimate_sample(name, num_requests=2 * d["concurrency"])
    measured = d["measured"].per_gpu(d["gpus"])["output_tokens_per_s_per_gpu"]
    ceiling = est.results["ceiling"]["output_tokens_per_s_per_gpu"]
    assert est.kind == "calibrated"
    assert ceiling >= measured                      # a ceiling below a measurement would be a model bug
    assert est.results["calibrated"]["output_tokens_per_s_per_gpu"] < ceiling
    assert est.config["model"] == d["model"] and est.config["concurrency"] == d["concurrency"]
