"""Notebook 04's teaching views of the resolver: the grid keeps only the rows where deployments differ, each cell in
one category against a reference; 'why did this path not run' names the condition that changed and vLLM's line."""
import pandas as pd
import pytest

from m3lab.analysis.paths import CATEGORIES, condition_diff, path_cells, why_not
from m3lab.spec.serving import load_preset
from m3lab.vllm.fastpath_views import compare
from m3lab.vllm.fastpaths import resolve


@pytest.fixture(scope="module")
def optimised():
    return resolve(load_preset("mxfp8-tp4-optimised"), tokens=32)


def test_grid_keeps_only_rows_that_differ_and_categorises_against_the_reference(optimised):
    dep = optimised.deployment
    table = compare({"optimised": dep, "AITER off": dep.with_settings({"aiter": "0"}), "same": dep}, tokens=32)
    cells = path_cells(table, reference="optimised")
    assert set(cells["category"]) <= set(CATEGORIES)
    assert (cells.loc[cells["config"] == "optimised", "category"].isin([CATEGORIES[0], CATEGORIES[4]])).all()
    assert cells[cells["config"] == "same"]["category"].tolist() == cells[cells["config"] == "optimised"][
        "category"].tolist()                                          # an identical deployment: identical cells
    attn = cells[(cells["row"] == "attention · sparse")].set_index("config")
    assert attn.loc["AITER off", "category"] == "runs: another path" and attn.loc["AITER off", "path"] == "triton_sparse"
    full = path_cells(table, reference="optimised", only_differing=False)
    same_everywhere = full.groupby("row")["category"].agg(lambda c: set(c) == {CATEGORIES[0]})
    assert same_everywhere.any() and not set(cells["row"]) & set(same_everywhere[same_everywhere].index)


def test_why_not_names_the_flipped_condition_and_the_deciding_line(optimised):
    off = resolve(optimised.deployment.with_settings({"aiter": "0"}), tokens=32)
    diff = condition_diff(optimised, off, "attention", "sparse")
    first = diff.iloc[0]
    assert first["condition"] == "VLLM_ROCM_USE_AITER" and first["changed"] and first["expected_holds"] \
        and not first["actual_holds"] and first["tested_at"].startswith("vllm/")
    # one cause, three rows that change with it: the switch, vLLM's page-16 sparse-PA flag that reads it, and the
    # attend implementation vLLM then binds (the shuffled KV layout stays as it was)
    assert set(diff.loc[diff["changed"], "condition"]) == {
        "VLLM_ROCM_USE_AITER", "AITER page-16 sparse PA (minimax_m3_use_aiter_sparse_pa)",
        "attend implementation (select_main_backend_and_impl_cls)"}
    assert not diff.set_index("condition").loc["VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", "changed"]
    text = why_not(optimised, off, "attention", "sparse")
    assert "triton_sparse" in text and "instead of aiter_sparse_pa" in text and "VLLM_ROCM_USE_AITER is 0" in text
    assert "vLLM decides at vllm/models/minimax_m3/" in text
    assert why_not(optimised, optimised, "attention", "sparse").endswith("both run aiter_sparse_pa (pa_decode_gluon)")


def test_a_missing_decision_is_a_clear_error(optimised):
    with pytest.raises(KeyError, match="no decision for 'nosuch'"):
        condition_diff(optimised, optimised, "nosuch")


def test_nb_table_has_units_and_three_significant_figures():
    from m3lab import nb
    t = nb.table({"output_tokens_per_s_per_gpu": 349.6461059234941, "ttft_s": 0.3670435695918286,
                  "weight_bytes_per_gpu": 110_672_228_352, "label": "projected"})
    assert t.loc["output_tokens_per_s_per_gpu"].tolist() == ["350", "tok/s/GPU"]
    assert t.loc["ttft_s"].tolist() == ["0.367", "s"] and t.loc["weight_bytes_per_gpu", "value"] == "111 GB"
    two = nb.table({"as run": {"ttft_p50_s": 0.888468}, "what-if": {"ttft_p50_s": 0.8425171629650438}})
    assert two.loc["ttft_p50_s"].tolist() == ["0.888", "0.843", "s"]
    html = nb._dict_html({"tpot_ms": 21.818357700165055})
    assert "21.8" in html and "21.818" not in html and nb._dict_html({"x": object()}) is None
    assert isinstance(nb.table({"a": 1}), pd.DataFrame)
