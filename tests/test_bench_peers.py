"""The peers run's pieces that run without a GPU: vLLM's MoE configurations as the run enumerates them, which
configurations later rounds repeat, the clock note, the peers table's columns, and the targets read from it."""
import pandas as pd
import pytest

from m3lab.bench import peers
from m3lab.bench_analysis import peers as analysis
from m3lab.bench.ceilings import Ceilings
from m3lab.bench.clocks import ClockWatch, power_limited
from m3lab.bench.table import append_rows, read_table, rows_frame
from m3lab.bench.timing import Timing


def _row(op, provider, config, shape, us, rnd, dtype="bf16", clock="sm 1980-1980 MHz, 500/700 W", mnk=(None,) * 3):
    t = peers.Timed(provider, config, Timing(us, us, us), clock)
    return peers.make_row(op, shape, dtype, t, rnd, 1e9, 1e6, Ceilings(), "NVIDIA_H200", mnk)


def _gemm(provider, config, m, us, rnd, dtype="bf16"):
    return _row("gemm", provider, config, f"M={m},N=2560,K=6144", us, rnd, dtype, mnk=(m, 2560, 6144))


def _table(rounds=3):
    rows = []
    for r in range(1, rounds + 1):
        slow = 1.0 + 0.01 * r
        rows += [_row("moe", "m3lab", "table=m3lab", "T=2048,routing=balanced", 100.0 * slow, r,
                      clock="sm 1600-1980 MHz, 700/700 W, power-cap"),
                 _row("moe", "vllm-triton", "default", "T=2048,routing=balanced", 130.0, r),
                 _row("moe", "vllm-triton", "table=E=128,N=768", "T=2048,routing=balanced", 95.0, r),
                 _row("sparse_attn", "ours", "pdl", "B=1,ctx=8192,q=1", 5.0, r),
                 _row("sparse_attn", "vllm", "pdl", "B=1,ctx=8192,q=1", 6.0, r),
                 _row("sparse_indexer", "ours", "pdl", "B=1,ctx=8192,q=1", 7.0, r),
                 _row("sparse_indexer", "vllm", "pdl", "B=1,ctx=8192,q=1", 9.0, r)]
        for m, ours, cublas in ((1, 9.0, 10.0), (128, 20.0, 14.0), (2048, 100.0, 90.0)):
            rows += [_gemm("triton", "table", m, ours, r), _gemm("cublas", "", m, cublas, r),
                     _gemm("triton", "per-channel", m, ours * 1.2, r, "fp8"),
                     _gemm("scaled-mm", "per-token x, per-channel W", m, cublas / 2, r, "fp8")]
        for m in (1, 8, 32):
            rows += [_gemm("triton", "table", m, 30.0, r, "mxfp4"), _gemm("triton-mx-layout", "table", m, 12.0, r, "mxfp4"),
                     _gemm("ogs", "warps=4,split_k=2", m, 11.0, r, "mxfp4"),
                     _gemm("ogs", "warps=8,split_k=auto", m, 14.0, r, "mxfp4"),
                     _gemm("cublas", "", m, 10.0, r)]
    return rows


def test_targets_take_each_peer_at_its_best_configuration_with_the_spread():
    t = analysis.peer_targets(rows_frame(_table())).set_index("target")
    moe = t.loc["MoE bf16 vs vLLM fused_moe at its best config (every T)"]
    assert moe["measured"] == pytest.approx(95.0 / 102.0)            # the shipped table, not the default
    assert "E=128,N=768" in moe["where"] and not moe["passed"] and moe["power_limited"] == 1
    assert moe["spread"].startswith(f"{95.0 / 103.0:.3f}-{95.0 / 101.0:.3f}") and "3 rounds" in moe["spread"]
    attn = t.loc["sparse attention vs vLLM decode (PDL), every B x ctx"]
    assert attn["measured"] == pytest.approx(6.0 / 5.0) and attn["status"] == "incomplete" and attn["passed"] is None
    assert "B=128,ctx=65536,q=1" in attn["missing"]                 # one point of six: over its threshold, not passed
    assert t.loc["MoE bf16 vs vLLM fused_moe at its best config (every T)", "missing"] == \
        "T = 1, 32, 128, 512, 8192 not measured"
    mx = t.filter(like="MXFP4", axis=0).iloc[0]
    assert "triton-mx-layout" in mx.name and mx["measured"] == pytest.approx(11.0 / 12.0) and not mx["passed"]
    dec = t.loc["bf16 decode vs cuBLAS, worst point"]
    assert dec["measured"] == pytest.approx(14.0 / 20.0) and "M=128" in dec["where"]
    assert t.loc["bf16 prefill vs cuBLAS, worst point", "measured"] == pytest.approx(0.9)
    assert t.loc["fp8 (W8A16) prefill vs bf16 cuBLAS, worst point", "measured"] == pytest.approx(90 / 120)
    assert t.filter(like="_scaled_mm", axis=0)["passed"].iloc[0] is None
    assert t.filter(like="_scaled_mm", axis=0)["status"].iloc[0] == "info"


def test_a_peer_target_passes_or_fails_only_on_every_point_it_names():
    rows = []
    for b, ctx in peers.SPARSE_POINTS:
        shape = f"B={b},ctx={ctx},q=1"
        rows += [_row("sparse_attn", "ours", "pdl", shape, 5.0, 1), _row("sparse_attn", "vllm", "pdl", shape, 6.0, 1)]
    t = analysis.peer_targets(rows_frame(rows)).set_index("target")
    attn = t.loc["sparse attention vs vLLM decode (PDL), every B x ctx"]
    assert attn["status"] == "pass" and attn["passed"] is True and attn["missing"] == ""
    slow = [r for r in rows if not (r.provider == "vllm" and r.shape == "B=32,ctx=65536,q=1")]
    slow.append(_row("sparse_attn", "vllm", "pdl", "B=32,ctx=65536,q=1", 4.0, 1))
    assert analysis.peer_targets(rows_frame(slow)).set_index("target").loc[attn.name, "status"] == "fail"
    gone = [r for r in rows if r.shape != "B=128,ctx=8192,q=1"]
    cut = analysis.peer_targets(rows_frame(gone)).set_index("target").loc[attn.name]
    assert cut["status"] == "incomplete" and cut["missing"] == "points = B=128,ctx=8192,q=1 not measured"
    assert (t.drop(index=attn.name)["status"].isin(["incomplete", "info"])).all()   # nothing else was measured


def test_targets_command_reads_the_peers_table_only(tmp_path, capsys):
    path = tmp_path / "peers.csv"
    append_rows(path, _table(rounds=2))
    df = read_table(path)
    assert set(df["round"].dropna().astype(int)) == {1, 2} and (df["config"] != "").any()
    assert df["clock"].str.contains("MHz").all()
    analysis.print_targets(path=str(path))
    out = capsys.readouterr().out
    assert "2 rounds" in out and "MoE bf16 vs vLLM" in out


def test_later_rounds_repeat_ours_and_the_peers_two_fastest():
    res = [peers.Timed("m3lab", "table=m3lab", Timing(1, 1, 1), "")] + [
        peers.Timed("vllm-triton", f"c{i}", Timing(u, u, u), "") for i, u in enumerate((5.0, 2.0, 3.0, 9.0))]
    assert peers.keep_best(res, {"m3lab"}) == [("m3lab", "table=m3lab"), ("vllm-triton", "c1"), ("vllm-triton", "c2")]


def test_vllm_moe_configs_cover_default_shipped_and_ours():
    cfgs = peers.vllm_moe_configs(2048, 129, 768, 6144, 5)
    labels = "|".join(cfgs)
    assert "default" in labels and "table=E=128,N=768" in labels and "table=m3lab" in labels
    assert sum(len(k.split("|")) for k in cfgs) >= 8                   # default, six shipped E=128 tables, ours
    shipped = next(v for k, v in cfgs.items() if "table=E=128,N=768" in k.split("|"))
    assert shipped["BLOCK_SIZE_M"] == 128 and shipped["BLOCK_SIZE_N"] == 256     # vLLM's H200 entry at M 2048
    assert len({tuple(sorted(v.items())) for v in cfgs.values()}) == len(cfgs)  # identical configs merged


def test_clock_note_without_a_gpu_is_empty_and_flags_parse():
    with ClockWatch() as w:
        pass
    assert w.note() == "" or "MHz" in w.note()
    assert power_limited("sm 1500-1980 MHz, 700/700 W, power-cap") and not power_limited("sm 1980-1980 MHz, 400/700 W")
    assert not power_limited(float("nan")) and not power_limited("")


def test_baseline_takes_the_median_round_of_our_table_rows():
    from m3lab.sessions.peers import baseline_rows
    rows = [_gemm("triton", "table", 1, us, r) for r, us in ((1, 9.0), (2, 11.0), (3, 10.0))]
    rows += [_gemm("cublas", "", 1, 5.0, 1), _gemm("triton", "table", 8, 3.0, 1)]
    base = baseline_rows(rows)
    assert len(base) == 1 and base[0].us_p50 == 10.0 and base[0].round is None and base[0].provider == "triton"
    assert pd.isna(rows_frame(base)["round"]).all()
