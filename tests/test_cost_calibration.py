"""GEMM calibration: readers, fit, residuals, and the out-of-sample acceptance."""
import numpy as np
import pandas as pd
import pytest

from m3lab.cost import calibration as cal
from m3lab.cost import validate
from m3lab.errors import M3LabError
from m3lab.spec.gemm_cost import dense_equivalent
from m3lab.spec.hardware import load_hardware


@pytest.fixture(scope="module")
def mi355x():
    return load_hardware("mi355x")


def test_out_of_sample_acceptance(mi355x):
    """Fit on every other M and predict the rest (≤15%); leave each (N, K) out entirely (≤25%)."""
    points = validate.out_of_sample(validate.shipped_table(), mi355x)
    summary = validate.summarize(points)
    print("\n" + summary.to_string(index=False))
    fp8 = summary[summary["w_dtype"] == "fp8"].set_index("protocol")["median_abs_error"]
    assert fp8["every_other_m"] <= 0.15
    assert fp8["leave_shape_out"] <= 0.25
    assert summary["passes"].all()
    # every held-out fp8 shape on its own, too
    per_shape = (points[(points["protocol"] == "leave_shape_out") & (points["w_dtype"] == "fp8")]
                 .assign(e=lambda d: d["rel_error"].abs()).groupby("held_out")["e"].median())
    assert (per_shape <= 0.25).all(), per_shape


def test_shipped_calibration_residuals_and_label(mi355x):
    c = cal.default_calibration(mi355x)
    assert c is not None and c.name == "aiter-mi355x" and "mi355x" in c.label
    res = c.residuals()
    assert set(res["family"]) == {"fp8", "bf16", "fp8_grouped"}
    assert res["rel_error"].abs().median() < 0.05  # in-sample
    assert cal.default_calibration(load_hardware("h200")) is None


def test_efficiency_bounded_and_clamped(mi355x):
    c = cal.load_calibration("aiter-mi355x")
    rng = np.random.default_rng()
    m = rng.integers(1, 10**6, 50)
    n = rng.integers(16, 10**6, 50)
    k = rng.integers(16, 10**5, 50)
    eff = c.fits["fp8"].efficiency(m, n, k)
    assert np.all((eff > 0) & (eff <= 1))
    # a decode GEMM is far from the compute roofline: well under 1
    assert c.fits["fp8"].efficiency([1], [6144], [6144])[0] < 0.6
    assert set(c.fits) == {"fp8", "bf16", "fp8_grouped"}  # no dtype borrows another's table


def test_long_format_reader_takes_best_provider(tmp_path, mi355x):
    rng = np.random.default_rng()
    us = rng.uniform(10, 20, 4)
    df = pd.DataFrame({"op": ["gemm"] * 4, "provider": ["torch", "triton", "torch", "triton"],
                       "shape": ["M=1,N=2560,K=6144", "M=1,N=2560,K=6144", "m64_n6144_k2048", "64x6144x2048"],
                       "dtype": ["bf16"] * 4, "us_p50": us, "device": ["h200"] * 4})
    path = tmp_path / "bench.csv"
    df.to_csv(path, index=False)
    table = cal.read_measured_table(path)
    assert len(table) == 2
    got = table.set_index("m")["us"]
    assert got[1] == pytest.approx(us[:2].min()) and got[64] == pytest.approx(us[2:].min())
    fitted = cal.calibrate([path], load_hardware("h200"))
    assert fitted.hardware == "h200" and "bf16" in fitted.fits


def test_bad_tables_are_clear_errors(tmp_path, mi355x):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(M3LabError, match="unknown measured-table columns"):
        cal.read_measured_table(bad)
    with pytest.raises(M3LabError, match="does not exist"):
        cal.read_measured_table(tmp_path / "missing.csv")
    with pytest.raises(M3LabError, match="measured on mi355x"):
        cal.load_calibration("aiter-mi355x", "h200")


def test_fused_moe_table_calibrates_grouped_gemms(mi355x):
    """The AITER fused-MoE table (MiniMax-M2.5 shapes, MI355X) fits grouped GEMMs by regime; out of sample it
    predicts held-out token counts and held-out (inter, experts) shapes."""
    summary = validate.summarize(validate.moe_out_of_sample(validate.shipped_table(), mi355x))
    print("\n" + summary.to_string(index=False))
    assert (summary["median_abs_error"] <= 0.25).all()
    c = cal.load_calibration("aiter-mi355x")
    tokens = np.random.default_rng().integers(16, 256)
    active = 128 * (1 - (1 - 4 / 128) ** tokens) + 1
    m_eq, side = dense_equivalent(tokens * 5, active, 3 * 768, 6144)
    eff = c.fits["fp8_grouped"].efficiency(m_eq, side, side)
    assert 0.3 < eff[0] <= 1.0
