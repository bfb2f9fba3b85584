"""How the report and the notebooks show things: tables whole with bytes in GB/MB and text left-aligned,
titles that fit, artifacts shown without the machine's absolute path, steps numbered by their notebook."""
import pandas as pd

from m3lab import artifacts, nb
from m3lab.pipeline.report import align_numbers, wrap_title


def test_tables_show_bytes_in_gb_and_fold_long_lists_without_truncating():
    df = pd.DataFrame({"part": ["weights mxfp8", "sparse page adapter (128-token blocks on 16-token pages)"],
                       "bytes_per_gpu": [7.061e10, 1.195e8], "m_values": [list(range(1, 134)), [1, 2]],
                       "share": [0.9054, 0.0012]})
    html = nb.frame_html(df)
    assert "70.6 GB" in html and "120 MB" in html and "e+" not in html
    assert "sparse page adapter (128-token blocks on 16-token pages)" in html          # not cut at 50 characters
    assert "<summary>133 values: 1 … 133</summary>" in html and ", 133</details>" in html
    assert nb.format_bytes(512) == "512 B" and nb.format_bytes(2.5e12) == "2.5 TB"


def test_number_cells_right_text_cells_left():
    html = align_numbers("<table><tr><td>gemm.decode_tile_table</td><td>1,234</td><td>70.6 GB</td>"
                         "<td>0.5%</td><td>runs on a GPU (cuda/hip)</td></tr></table>")
    assert '<td class="num">1,234</td>' in html and '<td class="num">70.6 GB</td>' in html
    assert "<td>gemm.decode_tile_table</td>" in html and "<td>runs on a GPU (cuda/hip)</td>" in html


def test_long_titles_are_wrapped_not_clipped():
    title = ("Time per engine step by plane (ms) — projected, estimate: calibrated on mi355x by aiter-mi355x "
             "(fits: bf16, fp8, fp8_grouped; other kernels: default achievable fractions and floors)")
    fig = wrap_title({"data": [], "layout": {"title": {"text": title}}})
    lines = fig["layout"]["title"]["text"].split("<br>")
    assert len(lines) > 1 and all(len(line) <= 95 for line in lines)
    assert " ".join(lines).replace("  ", " ") == title and fig["layout"]["margin"]["t"] > 80
    short = {"layout": {"title": {"text": "short"}}}
    assert wrap_title(short) is short


def test_saved_artifact_shows_a_path_relative_to_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv(artifacts.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(artifacts.STEP_ENV, "byte_planes")
    saved = artifacts.save("kv_handoff", {"x": 1})
    assert repr(saved) == "saved artifacts/byte_planes/kv_handoff.json"
    assert str(tmp_path) not in repr(saved) and open(saved).read().strip().startswith("{")


def test_report_numbers_steps_by_their_notebook():
    from m3lab.pipeline.report import _number
    assert _number("10_serving_estimates.ipynb", 6) == "10" and _number("custom.ipynb", 3) == "03"
