"""``m3lab vllm collect`` (bench results and profiler traces into a run folder's artifacts, fast paths verified)
and the fused-MoE table comparison."""
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3lab.errors import M3LabError
from m3lab.vllm_src import install

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "m3lab" / "serving" / "data" / "inferencex_atom_mtp_tp4_conc64_isl8192_osl1024.json"
# the reference model's H200 profiler trace with vLLM's kernels as its fast paths (committed; newest by name last)
H200_TRACE = sorted((REPO / "traces" / "profiler").glob("m3_tp4_L0-4_h200_*.kineto.json.gz"))[-1]
needs_vllm = pytest.mark.skipif(not install.available(), reason="vLLM 0.33.0 is installed by the set-up and CI")


def _bench_with_gpus(tmp_path: Path, gpus: str, deployment=None) -> Path:
    """A bench result carrying the ``--metadata gpus=N`` that ``m3lab vllm plan``'s bench command writes, made a
    benchmark of ``deployment`` (its model and, when the record carries a workload, its concurrency and lengths)."""
    raw = json.loads(BENCH.read_text())
    raw["gpus"] = gpus  # vLLM writes --metadata values as strings
    if deployment is not None:
        raw["model_id"] = "MiniMaxAI/MiniMax-M3"
        wl = getattr(deployment, "workload", None)
        if wl is not None:
            raw.update(max_concurrency=wl.concurrency, total_input_tokens=wl.isl * raw["completed"],
                       total_output_tokens=wl.osl * raw["completed"])
    out = tmp_path / "bench" / "plan-c64.json"
    out.parent.mkdir()
    out.write_text(json.dumps(raw))
    return out


@needs_vllm
def test_collect_bench_and_profile_into_artifacts_with_fast_path_verdict(tmp_path):
    from m3lab.spec.serving import load_preset
    from m3lab.serving.collect import collect, measured

    run = tmp_path / "run"
    profile = tmp_path / "profile"
    profile.mkdir()
    shutil.copy(H200_TRACE, profile / "rank0.pt.trace.json.gz")  # vLLM writes one trace per rank into the folder
    dep = load_preset("h200-bf16-tp4")
    summary = collect(run, [_bench_with_gpus(tmp_path, "8", dep)], [profile], deployment=dep)
    got = measured(run)

    bench = got["bench"]
    raw = json.loads(BENCH.read_text())
    assert len(bench) == 1 and bench.loc[0, "gpus"] == 8  # the file's metadata wins over the preset's 4 GPUs
    assert bench.loc[0, "output_tokens_per_s_per_gpu"] == pytest.approx(raw["output_throughput"] / 8)
    assert bench.loc[0, "median_tpot_ms"] == pytest.approx(raw["median_tpot_ms"])
    assert bench.loc[0, "label"] == "measured" and bench.loc[0, "source"] == "vllm/bench/plan-c64.json"
    head = got["measured"]
    assert head["label"].startswith("measured") and head["gpus"] == 8
    assert (head["ttft_s"], head["tpot_ms"]) == (pytest.approx(raw["median_ttft_ms"] / 1e3),
                                                 pytest.approx(raw["mean_tpot_ms"]))
    assert (run / "vllm" / "bench" / "plan-c64.json").is_file()
    assert (run / "vllm" / "profile" / "rank0.pt.trace.json.gz").is_file()

    kernels = got["kernels"]
    assert set(kernels["file"]) == {"rank0.pt.trace.json.gz"}
    assert kernels["share"].sum() == pytest.approx(1.0)
    assert kernels["calls"].min() >= 1 and (kernels["total_us"] > 0).all()

    fast = got["fastpaths"]
    verdict = got["verdict"]
    assert verdict["expectations"] == "preset:h200-bf16-tp4"
    checked = fast[fast["source"] == "kineto"]
    assert set(checked["id"]) >= {"attention_decode", "indexer_decode"}  # the resolver's kernels, checked in the trace
    assert verdict["ok"] == bool(not fast["status"].isin(["fail", "missing"]).any() and len(checked))
    assert verdict["ok"], fast[fast["status"] != "pass"][["id", "status", "why"]].to_string()  # the real H200 paths
    assert summary["fastpaths"] == verdict


def test_collect_refuses_a_benchmark_of_another_model_under_a_preset(tmp_path):
    """The review's command: a Qwen3.5 result collected as the MiniMax M3 preset h200-bf16-tp4."""
    from m3lab.cli.main import app
    from m3lab.spec.serving import load_preset
    from m3lab.serving.collect import bench_mismatches
    from m3lab.serving.vllm_bench import read_bench_result

    res = CliRunner().invoke(app, ["vllm", "collect", str(tmp_path / "run"), "--bench", str(BENCH),
                                   "--preset", "h200-bf16-tp4"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("Error: --bench") and "model Qwen/Qwen3.5-397B-A17B-FP8 vs" in res.output
    assert not (tmp_path / "run").exists()
    assert bench_mismatches(load_preset("h200-bf16-tp4"), read_bench_result(_bench_with_gpus(
        tmp_path, "4", load_preset("h200-bf16-tp4")))) == []          # the same deployment's benchmark passes


def test_collect_refuses_another_concurrency_or_lengths_of_the_deployments_workload(tmp_path):
    from types import SimpleNamespace

    from m3lab.serving.vllm_bench import read_bench_result
    from m3lab.spec.serving import load_preset
    from m3lab.serving.collect import bench_mismatches

    preset = load_preset("h200-bf16-tp4")
    dep = SimpleNamespace(model=preset.model, name=preset.name,
                          workload=SimpleNamespace(concurrency=32, isl=8192, osl=1024))
    raw = json.loads(BENCH.read_text())
    raw.update(model_id="MiniMaxAI/MiniMax-M3")                        # c=64, mean lengths 7,389 / 919
    path = tmp_path / "c64.json"
    path.write_text(json.dumps(raw))
    off = bench_mismatches(dep, read_bench_result(path))
    assert [o.split()[0] for o in off] == ["concurrency", "osl"], off  # 919 is 10.2% under 1,024; 7,389 is 9.8%


def test_collect_bad_input_names_the_field(tmp_path):
    from m3lab.cli.main import app
    from m3lab.serving.collect import collect

    with pytest.raises(M3LabError, match="no GPU count") as err:
        collect(tmp_path / "run", [BENCH])
    assert err.value.field == "--gpus"
    assert not (tmp_path / "run").exists()  # nothing written before every input was read
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(M3LabError, match="holds no trace file"):
        collect(tmp_path / "run", [BENCH], [empty], gpus=4)
    res = CliRunner().invoke(app, ["vllm", "collect", str(tmp_path / "run"), "--bench", str(tmp_path / "nope.json"),
                                   "--gpus", "4"])
    assert res.exit_code == 2 and res.output.startswith("Error: ") and "does not exist" in res.output


def test_collect_a_real_vllm_trace(shared_dir, tmp_path):
    """A profiler trace vLLM wrote (mixed prefill + decode with piecewise CUDA graphs, MI300X-class)."""
    from m3lab.cli.main import app

    trace = shared_dir / "data" / "kineto" / "tracelens_vllm_prefilldecode_piecewise_graph_execution.json.gz"
    benches = sorted((shared_dir / "data" / "vllm_bench").glob("*.json"))
    args = ["vllm", "collect", str(tmp_path / "run"), "--profile", str(trace), "--gpus", "4", "--json",
            "--bench", str(shared_dir / "data" / "vllm_bench")]  # a --result-dir stands for its files
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["bench"]) == len(benches) and doc["kernels"] > 10 and "fastpaths" not in doc
    import pandas as pd
    table = pd.read_parquet(tmp_path / "run" / "artifacts" / "vllm" / "vllm_bench.parquet")
    assert len(table) == len(benches) and (table["gpus"] == 4).all()


def _table(folder: Path, name: str, entries: dict) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps(entries))


def test_moe_tables_compare_by_shape_and_device(tmp_path):
    from m3lab.vllm.moe_tables import compare_tables, parse_name

    assert parse_name("E=128,N=384,device_name=AMD_Instinct_MI300X,dtype=fp8_w8a8,block_shape=[128,128].json") == {
        "E": 128, "N": 384, "device": "AMD_Instinct_MI300X", "dtype": "fp8_w8a8", "block_shape": "[128,128]",
        "backend": ""}
    assert parse_name("E=129,N=768,device_name=NVIDIA_H200.m3lab.json") is None  # m3lab's own extra table
    assert parse_name("README") is None
    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 3}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _table(ours, "E=8,N=64,device_name=GPU_X.json", {"1": tile, "60": {**tile, "BLOCK_SIZE_M": 64},
                                                     "triton_version": "3.6.0"})
    _table(ours, "E=8,N=32,device_name=GPU_X.json", {"1": tile})
    _table(theirs, "E=8,N=64,device_name=GPU_X.json", {"1": tile, "64": {**tile, "BLOCK_SIZE_M": 32}})
    _table(theirs, "E=8,N=32,device_name=GPU_Y.json", {"1": tile})
    t = compare_tables(ours, theirs).set_index("N")
    assert t.loc[64, "theirs"] == "E=8,N=64,device_name=GPU_X.json" and t.loc[64, "m_ours"] == [1, 60]
    assert (t.loc[64, "compared"], t.loc[64, "same_tile"]) == (2, 1)  # M=60 -> vLLM's nearest M=64 differs
    assert "M=60" in t.loc[64, "differs"] and "(M=64)" in t.loc[64, "differs"]
    import pandas as pd
    assert pd.isna(t.loc[32, "theirs"]) and t.loc[32, "theirs_other_devices"] == ["GPU_Y"]
    assert len(compare_tables(ours, theirs, every_table=True)) == 3


def test_moe_tables_vllm_shipped_against_the_shared_samples(shared_dir):
    from m3lab.vllm.moe_tables import compare_tables, read_folder, shipped_dir

    if not shipped_dir().is_dir():
        pytest.skip("vLLM is not installed")
    shipped = read_folder(shipped_dir())
    assert len(shipped) > 100  # vLLM 0.33.0 ships ~340 tables
    t = compare_tables(shared_dir / "data" / "vllm_moe_configs").set_index("device")
    h200 = t.loc["NVIDIA_H200"]
    assert h200["theirs"] == "E=128,N=384,device_name=NVIDIA_H200.json"  # the sample is vLLM's own table
    assert h200["same_tile"] == h200["compared"] == len(h200["m_ours"]) > 0
    assert "NVIDIA_H100_80GB_HBM3" in h200["theirs_other_devices"]


def test_measured_beside_the_estimate(tmp_path):
    """A collected measurement stands beside an estimate of the same deployment only (never another model,
    GPU count, concurrency or length)."""
    from m3lab.serving.estimate import estimate
    from m3lab.serving.collect import beside_estimate, collect

    from m3lab.spec.serving import make_deployment

    est = estimate(make_deployment(None, model="minimax-m3-mxfp8", hardware="mi355x", tp=4, quant="mxfp8", isl=1024,
                                   osl=64, concurrency=8, num_prompts=16))
    with pytest.raises(M3LabError, match="no vLLM measurement"):
        beside_estimate(est, tmp_path / "run")
    collect(tmp_path / "other", [BENCH], gpus=4)          # Qwen3.5 at c=64, 8K/1K: another deployment
    with pytest.raises(M3LabError, match="not of the estimated deployment: model .*concurrency 64 vs 8"):
        beside_estimate(est, tmp_path / "other")
    raw = json.loads(BENCH.read_text())
    raw.update(model_id="MiniMaxAI/MiniMax-M3-MXFP8", max_concurrency=8, total_input_tokens=1024 * raw["completed"],
               total_output_tokens=64 * raw["completed"])
    same = tmp_path / "m3_c8.json"
    same.write_text(json.dumps(raw))
    collect(tmp_path / "run", [same], gpus=4)
    table = beside_estimate(est, tmp_path / "run").set_index("metric")
    assert table.loc["output tokens/s/GPU", "measured"] == pytest.approx(raw["output_throughput"] / 4)
    assert table.loc["mean TPOT", "measured"] == pytest.approx(raw["mean_tpot_ms"])


def test_our_moe_tables_against_vllms():
    """m3lab's tuned tables (kernels/moe/configs) beside vLLM's: vLLM 0.33.0 ships none for M3's 129 experts
    (128 routed + the fused shared expert), so at run time it would fall back to its default config there."""
    from m3lab.vllm.moe_tables import compare_tables, our_tables_dir, shipped_dir

    if not shipped_dir().is_dir() or not any(our_tables_dir().glob("E=*.json")):
        pytest.skip("needs vLLM and kernels/moe/configs")
    t = compare_tables(our_tables_dir())
    m3 = t[t["E"] == 129]
    assert len(m3) >= 1 and m3["theirs"].isna().all() and (m3["compared"] == 0).all()
    assert all(len(m) > 0 for m in m3["m_ours"])
