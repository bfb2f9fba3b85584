"""The record's bounds (absurd lengths, a context beyond the model's, absurd concurrency: one line naming the field
and the limit, exit 2, before any work), one set of defaults for every command, the accuracy band under every
``m3lab estimate``, ``estimate`` at 80 columns, ``vllm collect``'s headline, ``cache-sim`` on broken gzip traces
and the KV link's one name. Each CLI test checks the command, its exit status and its first line."""
import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3lab.cli.deploy_options import build as REAL_BUILD
from m3lab.cli.main import app
from m3lab.published import HEADLINE_MXFP8_TP4_C32
from m3lab.serving import accuracy
from m3lab.spec.serving import default_deployment, make_deployment
from test_cli_80_columns import names_whole, tokens_whole

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "m3lab" / "serving" / "data" / "inferencex_atom_mtp_tp4_conc64_isl8192_osl1024.json"
BAND = {"runs": 4, "output_tokens_per_s_per_gpu": [0.99, 2.33], "ttft_s": [0.42, 1.46], "tpot_ms": [0.44, 1.02]}
cli = CliRunner()


def _run(*args, columns=200, **env):
    res = cli.invoke(app, list(args), env={"COLUMNS": str(columns), **env})
    return res, (res.output.splitlines() or [""])[0]


@pytest.fixture
def no_work(monkeypatch):
    """Any estimate, shapes schedule or hand-off plan that starts fails the test: bounds come first."""
    def forbidden(*a, **k):
        raise AssertionError("work started before the bad input was refused")
    import m3lab.pd.geometry
    import m3lab.serving.estimate
    monkeypatch.setattr(m3lab.serving.estimate, "estimate", forbidden)
    monkeypatch.setattr(m3lab.pd.geometry, "pd_plan", forbidden)


@pytest.mark.parametrize("args, first", [
    (["estimate", "--isl", "100000000"], "Error: isl=100,000,000 is beyond m3lab's limit of 10,000,000"),
    (["estimate", "--isl", "1048000"], "Error: isl + osl = 1,049,024 tokens is longer than minimax-m3's context of "
                                       "1,048,576 tokens (max_position_embeddings)"),
    (["estimate", "--model", "llama-3.1-8b", "--tp", "1", "--isl", "131072"],
     "Error: isl + osl = 132,096 tokens is longer than llama-3.1-8b's context of 131,072 tokens"),
    (["estimate", "--isl", "8192", "--set", "max_model_len=4096"],
     "Error: isl + osl = 9,216 tokens is longer than minimax-m3's context of 4,096 tokens (--max-model-len)"),
    (["estimate", "--concurrency", "100000000"], "Error: concurrency=100,000,000 is beyond m3lab's limit of 100,000"),
    (["shapes", "--concurrency", "100000000"], "Error: concurrency=100,000,000 is beyond m3lab's limit of 100,000"),
    (["estimate", "--num-requests", "100000000"], "Error: num_prompts=100,000,000 is beyond m3lab's limit"),
    (["pd-plan", "--model", "minimax-m3", "--prefill-tp", "4", "--decode-tp", "8", "--isl", "100000000"],
     "Error: isl = 100,000,000 tokens is longer than minimax-m3's context of 1,048,576 tokens"),
])
def test_absurd_lengths_and_concurrency_are_one_line_naming_the_limit(no_work, args, first):
    res, line = _run(*args)
    assert res.exit_code == 2, res.output
    assert line.startswith(first), line
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_the_bounds_hold_for_every_entry_point_not_only_the_cli():
    from m3lab.errors import M3LabError
    with pytest.raises(M3LabError, match="context of 1,048,576") as err:
        make_deployment(None, isl=1_048_576)
    assert err.value.field == "isl"
    assert make_deployment(None, isl=1_047_552).workload.isl == 1_047_552        # exactly the context: fits
    assert make_deployment(None, workload="agentx").workload.kind == "agentx"     # sessions set their own lengths


class Built(Exception):
    """Raised right after a command has built its Deployment."""


def _built_by(monkeypatch, *args) -> object:
    """The Deployment a command builds from its options (the command stops right after building it)."""
    import m3lab.cli.deploy_options as opt
    built = []

    def record(*a, **k):
        built.append(REAL_BUILD(*a, **k))
        raise Built
    monkeypatch.setattr(opt, "build", record)
    res = cli.invoke(app, list(args))
    assert isinstance(res.exception, Built), res.output
    return built[0]


def test_one_set_of_defaults_for_every_command_and_the_pipeline(monkeypatch):
    """estimate, shapes, model, fastpaths and vllm plan with no options, and the checklist pipeline's notebooks
    with their defaults, describe one deployment: MiniMax M3, MXFP8, TP4, 8K/1K, c=32 (the Deployment record's)."""
    from m3lab.pipeline.params import notebook_parameters
    from m3lab.pipeline.spec import load_pipeline
    from m3lab.pipeline.validate import step_deployment

    want = default_deployment()
    assert (want.model.name, want.quant.name, want.plan.tp, want.workload.isl, want.workload.osl,
            want.workload.concurrency) == ("minimax-m3", "mxfp8", 4, 8192, 1024, 32)
    for command in (["estimate"], ["shapes"], ["model"], ["fastpaths"], ["vllm", "plan"]):
        assert _built_by(monkeypatch, *command).key() == want.key(), command
    step = next(s for s in load_pipeline("checklist").steps if s.name == "serving_estimates")
    values = {k: p.default for k, p in notebook_parameters(step.notebook).items()}
    assert step_deployment({**values, **step.parameters}).key() == want.key()
    assert _built_by(monkeypatch, "shapes", "--tp", "8").key() != want.key()    # the comparison can fail


def test_every_estimate_prints_its_accuracy_band_in_one_line(monkeypatch):
    monkeypatch.setattr(accuracy, "shipped_band", lambda progress=None: BAND)
    res, first = _run("estimate", "--num-requests", "64")
    assert res.exit_code == 0, res.output
    assert first.startswith("default: minimax-m3 mxfp8 (KV bf16) TP4 EP1 on mi355x: 8192 in / 1024 out")
    band = [ln for ln in res.stdout.splitlines() if ln.startswith("accuracy ")]
    assert band == ["accuracy over 4 shipped runs, estimate/measured: tok/s/GPU 0.99–2.33×, TTFT 0.42–1.46×, "
                    "TPOT 0.44–1.02×"]
    out = json.loads(cli.invoke(app, ["estimate", "--num-requests", "64", "--json"]).stdout)
    assert out["accuracy"] == BAND
    for args in (["--pd", "2:1", "--isl", "2048", "--osl", "32", "--concurrency", "8", "--num-requests", "16"],
                 ["--workload", "agentx", "--concurrency", "2", "--set", "sessions=2"]):
        res, _ = _run("estimate", *args)
        assert res.exit_code == 0 and "accuracy over 4 shipped runs" in res.stdout, res.output


def test_the_accuracy_table_is_every_shipped_run_beside_its_own_estimate():
    """M3 before (vLLM's defaults) and after (the optimised preset) beside the published figures of exactly that
    case, Qwen3.5 and GLM-5.2 beside their InferenceX runs; the ratio is the estimate over the measurement."""
    from m3lab.serving.estimate import estimate
    table = accuracy.accuracy_table()
    assert table["run"].nunique() == 4 and len(table) == 12
    after = table[table.run.str.contains("after")].set_index("metric")
    assert after["measured"].tolist() == [m[3] for m in HEADLINE_MXFP8_TP4_C32["metrics"]]        # 342.4, 0.67, 22.1
    before = table[table.run.str.contains("before")].set_index("metric")
    assert before["measured"].tolist() == [m[2] for m in HEADLINE_MXFP8_TP4_C32["metrics"]]       # 109.1, 1.46, 69.1
    est = estimate(make_deployment("mxfp8-tp4-optimised"))
    assert after.loc["output tokens/s/GPU", "estimate"] == pytest.approx(est.results["calibrated"][
        "output_tokens_per_s_per_gpu"])
    assert (table["estimate_over_measured"] == table["estimate"] / table["measured"]).all()
    assert {"Qwen/Qwen3.5-397B-A17B-FP8 TP4 c=64 + MTP", "amd/GLM-5.2-MXFP4 TP4 c=4 + MTP"} < set(table["run"])
    b = accuracy.band(table)
    assert b["runs"] == 4 and b["output_tokens_per_s_per_gpu"] == [
        table[table.metric == "output tokens/s/GPU"]["estimate_over_measured"].min(),
        table[table.metric == "output tokens/s/GPU"]["estimate_over_measured"].max()]


def test_the_band_is_computed_once_per_code_version(monkeypatch, tmp_path):
    monkeypatch.setenv("M3LAB_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(accuracy, "accuracy_table", lambda progress=None: calls.append(1) or _table())
    first = accuracy.shipped_band()
    assert accuracy.shipped_band() == first and len(calls) == 1                  # the second read the disk
    monkeypatch.setattr(accuracy, "fingerprint", lambda: "another-version")
    accuracy.shipped_band()
    assert len(calls) == 2                                                        # new code: computed again


def _table():
    import pandas as pd
    return pd.DataFrame({"run": ["a", "b"], "metric": ["output tokens/s/GPU"] * 2, "estimate_over_measured": [0.5, 2]})


def test_estimate_at_80_columns_keeps_every_word_whole(monkeypatch):
    monkeypatch.setattr(accuracy, "shipped_band", lambda progress=None: BAND)
    args = ["estimate", "--num-requests", "64"]
    s = json.loads(cli.invoke(app, args + ["--json"]).stdout)
    res, first = _run(*args, columns=80)
    assert res.exit_code == 0 and first.startswith("default: minimax-m3 mxfp8"), res.output
    lines = res.stdout.splitlines()
    keys = ["output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu", "ttft_p99_s", "tpot_ms"]
    assert names_whole(lines[:-12], keys) == []                  # the sensitivity table is the cost model's own
    texts = [s["label"], *s["notes"], f"{s['num_requests']} requests", s["deployment"],
             accuracy.band_line(BAND)]
    assert tokens_whole(lines, texts) == []
    assert not any(ln.startswith(" ") and ln.strip().startswith(s["deployment"]) for ln in lines)  # title left


def test_vllm_collect_prints_the_measured_headline_first(tmp_path):
    res, first = _run("vllm", "collect", str(tmp_path / "run"), "--bench", str(BENCH), "--gpus", "4")
    assert res.exit_code == 0, res.output
    assert first == ("measured (vllm bench serve): 466.4 output tok/s/GPU, median TTFT 0.399 s, mean TPOT 32.21 ms; "
                     "Qwen/Qwen3.5-397B-A17B-FP8 on 4 GPU(s), device not stated (--preset names it)")


@pytest.mark.parametrize("content, words", [
    (gzip.compress(b""), "holds no requests"),
    (b"\x1f\x8b\x08\x00" + bytes(range(40)), "is not a complete gzip file"),
    (b"plain text", "is not a complete gzip file (BadGzipFile"),
    (gzip.compress(b"x" * 1000)[:20], "is not a complete gzip file (EOFError"),
])
def test_cache_sim_on_an_empty_or_corrupt_gzip_trace_is_one_line(tmp_path, content, words):
    trace = tmp_path / "trace.jsonl.gz"
    trace.write_bytes(content)
    res, first = _run("cache-sim", "--trace", str(trace))
    assert res.exit_code == 2, res.output
    assert first.startswith(f"Error: trace file {trace} ") and words in first, first
    assert len(res.output.strip().splitlines()) == 1


def test_cache_sim_results_start_on_the_first_line():
    res, first = _run("cache-sim", "--trace", str(REPO / "m3lab/cache/data/mooncake_synthetic_trace.jsonl.gz"))
    assert res.exit_code == 0 and first.startswith("requests "), res.output


def test_the_kv_link_has_one_name_and_unit_everywhere():
    """pd-plan's flag and JSON key are estimate's (--kv-link-gbps, kv_link_gbps, GB/s); no other spelling of
    the KV link is left in the CLI, the notebooks' parameters or the README."""
    res, _ = _run("pd-plan", "--model", "minimax-m3", "--prefill-tp", "4", "--decode-tp", "8", "--isl", "8192",
                  "--kv-link-gbps", "25", "--json")
    out = json.loads(res.stdout)
    assert out["kv_link_gbps"] == 25 and out["transfer_s"] == out["max_bytes_sent_per_prefill_rank"] / 25e9
    assert "bandwidth_bytes_per_s" not in out
    assert cli.invoke(app, ["pd-plan", "--model", "minimax-m3", "--prefill-tp", "4", "--decode-tp", "8",
                            "--isl", "8192", "--bandwidth", "25"]).exit_code == 2
    text = "\n".join(p.read_text() for p in [*(REPO / "notebooks").glob("*.ipynb"), REPO / "README.md",
                                             *(REPO / "m3lab" / "cli").glob("*.py")])
    for other in ("kv_link_bw", "--bandwidth", "kv_link_bytes", "kv_bw", "link_gbs"):
        assert other not in text, other
