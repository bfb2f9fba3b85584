"""``m3lab bench OP`` and ``m3lab tune OP``: every op is listed, and bad input is one line naming the option, exit 2,
before any work starts (on this CPU-only box a valid command stops at the GPU check, also exit 2)."""
import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app

BENCH_OPS = ("gemm", "moe", "sparse", "collectives", "cache", "probe", "shapes", "estimate", "targets")
TUNE_OPS = ("gemm", "moe")


@pytest.mark.parametrize("group, ops", [("bench", BENCH_OPS), ("tune", TUNE_OPS)])
def test_help_lists_every_op(group, ops):
    res = CliRunner().invoke(app, [group, "--help"])
    assert res.exit_code == 0
    listed = {line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line.strip()}
    assert set(ops) <= listed, (set(ops) - listed, res.output)


@pytest.mark.parametrize("args, field", [
    (["bench", "gemm", "--ms", "1,x"], "ms"),
    (["bench", "gemm", "--formats", "bf16,int3"], "formats"),
    (["bench", "moe", "--routings", "uniformish"], "routings"),
    (["bench", "moe", "--providers", "m3lab,cublas"], "providers"),
    (["bench", "sparse", "--contexts", "8192,1000"], "contexts"),
    (["bench", "sparse", "--batches", "0"], "batches"),
    (["bench", "collectives", "--world", "1"], "world"),
    (["bench", "collectives", "--hardware", "h900"], "hardware"),
    (["bench", "cache", "--requests", "0"], "requests"),
    (["bench", "targets", "--path", "no/such/peers.csv"], "path"),
    (["bench", "probe", "--rounds", "0"], "rounds"),
    (["bench", "probe"], "device"),
    (["bench", "shapes", "--concurrency", "0"], "concurrency"),
    (["bench", "estimate", "--only", "fixed,agentx"], "only"),
    (["tune", "gemm", "--ms", "8,-1"], "ms"),
    (["tune", "moe", "--ts", "1,,8"], "ts"),
    (["tune", "moe", "--budget-s", "0"], "budget-s"),
    (["bench", "gemm", "--ms", "1"], "device"),          # valid options: the GPU check is what stops it here
    (["tune", "moe"], "device"),
])
def test_bad_input_is_one_line_naming_the_option(args, field):
    res = CliRunner().invoke(app, args)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and field in lines[0], res.output
    assert "Traceback" not in res.output
