"""At COLUMNS=80, ``trace summarize`` (dispatch and Kineto traces), ``shapes``, ``gate`` and ``vllm moe-tables``
print no line wider than the terminal and every name whole on one line: each op, path, kernel, rejected path,
gate and case name of the command's own --json (or --save) output is found intact in some line."""
import csv
import os
import glob
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from m3lab.cli.main import app

os.environ.setdefault("TRITON_INTERPRET", "1")   # gates run in this process: the interpreter before triton loads

REPO = Path(__file__).resolve().parents[1]
DISPATCH = sorted(glob.glob(str(REPO / "traces" / "dispatch" / "*.dispatch.jsonl.gz")))[-1]
KINETO = sorted(glob.glob(str(REPO / "traces" / "profiler" / "*.kineto.json.gz")))[-1]
cli = CliRunner()


def _narrow(*args, columns=80):
    res = cli.invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def names_whole(lines: list[str], names, width: int = 80) -> list[str]:
    """The names that no line holds whole (a space or the line's start before; a space, ', ' or the line's end
    after), and the lines wider than ``width``: what a reader at that width would see folded or cut."""
    bad = [f"line of {len(ln)} characters: {ln!r}" for ln in lines if len(ln) > width]
    for name in set(names):
        whole = re.compile(rf"(^|\s){re.escape(name)}($|\s|,\s|,$)")
        if not any(whole.search(ln) for ln in lines):
            bad.append(name)
    return bad


def test_the_check_itself_fails_on_a_name_folded_across_lines():
    folded = ["gemm.bf16   M=1,N=80,K=96,sp", "lit_k  rel_rms  0.0002"]
    assert names_whole(folded, ["M=1,N=80,K=96,split_k"]) == ["M=1,N=80,K=96,split_k"]
    assert names_whole(["x" * 81], []) != []
    assert names_whole(["  M=1,N=80,K=96,split_k  rel_rms"], ["M=1,N=80,K=96,split_k"]) == []


def test_trace_summarize_of_a_dispatch_trace_at_80_columns():
    rows = json.loads(cli.invoke(app, ["trace", "summarize", DISPATCH, "--json", "--top", "40"]).stdout)["rows"]
    names = [r["op"] for r in rows] + [r["path"] for r in rows]
    names += [k for r in rows for k in r["kernels"].split(", ") if k]
    names += [k for r in rows for k in r["rejected_paths"].split(", ") if k]
    lines = _narrow("trace", "summarize", DISPATCH, "--top", "40")
    assert names_whole(lines, names) == []
    assert lines[2].split() == ["op", "path", "calls", "layers", "share"]     # no column of width 0


def test_trace_summarize_of_a_kineto_trace_at_80_columns():
    rows = json.loads(cli.invoke(app, ["trace", "summarize", KINETO, "--json"]).stdout)["rows"]
    lines = _narrow("trace", "summarize", KINETO)
    names = [r["short_name"] for r in rows]
    assert len(set(names)) == len(names)                                      # no two rows look alike
    assert names_whole([ln.replace(" #", "#") for ln in lines], [n.replace(" #", "#") for n in names]) == []


def test_shapes_at_80_columns():
    doc = json.loads(cli.invoke(app, ["shapes", "--json"]).stdout)
    names = [g["op"] for g in doc["distinct_gemms"] + doc["grouped_gemms"]]
    lines = _narrow("shapes")
    assert names_whole(lines, names + ["gate_up_proj", "shared_gate_up"]) == []
    assert "{" not in lines[0] and "TP4 EP1" in lines[0]                       # the plan, not a dict's repr


@pytest.mark.slow
def test_gate_at_80_columns_keeps_every_case_name_whole(tmp_path):
    save = tmp_path / "gates.csv"
    res = cli.invoke(app, ["gate", "--device", "cpu", "--only", "mx.*", "--only", "vllm.gemma_fused*",
                           "--save", str(save)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(save.open()))
    assert len(rows) == 20
    lines = res.stdout.splitlines()
    assert names_whole(lines, [r["gate"] for r in rows] + [r["case"] for r in rows]) == []
    assert lines[-1] == "PASSED: 20/20 passed"


def test_moe_tables_at_80_columns_end_with_one_finding():
    lines = _narrow("vllm", "moe-tables")
    assert max(map(len, lines)) <= 80 and "E=129,N=768" in lines[3]
    assert " ".join(lines).endswith("vLLM would use its default config there.")


PUNCT = " ,:;()'\"✓✗"


def tokens_whole(lines: list[str], texts) -> list[str]:
    """The words of ``texts`` (split at spaces, trimmed of punctuation) that no line holds as a word: a word
    folded across two lines shows up here as the two halves' whole."""
    seen = {w.strip(PUNCT) for ln in lines for w in ln.split()}
    return sorted({w.strip(PUNCT) for t in texts for w in str(t).split()} - seen - {""})


def test_the_word_check_fails_on_a_word_folded_across_lines():
    assert tokens_whole(["decided by vllm/model_exec", "utor/layers.py:12 f"], ["vllm/model_executor/layers.py:12 f"]) \
        == ["vllm/model_executor/layers.py:12"]
    assert tokens_whole(["✓ a (b): c,", "  d"], ["a (b)", "c, d"]) == []


@pytest.mark.parametrize("preset", ["mxfp8-tp4-optimised", "mxfp4-tp2"])
def test_fastpaths_at_80_columns_is_one_block_per_op(preset):
    """Every op, path, kernel and (where it fits in a line) the deciding vLLM line of the command's --json whole on
    one line; every word of every condition, value, note and source whole; one block per op, headed by its op."""
    doc = json.loads(cli.invoke(app, ["fastpaths", "--preset", preset, "--json"]).stdout)
    rows = doc["decisions"]
    lines = _narrow("fastpaths", "--preset", preset)
    names = [r["op"] for r in rows] + [r["path"] for r in rows] + [k for r in rows for k in r["kernels"]]
    names += [r["decided_by"] for r in rows if len(r["decided_by"]) <= 80 - 6]
    assert names_whole(lines, names) == []
    texts = [r[k] for r in rows for k in ("decided_by", "note", "vllm", "how", "shape")]
    texts += [c[k] for r in rows for c in r["checks"] for k in ("name", "value")]
    assert tokens_whole(lines, texts) == []
    heads = [ln for ln in lines if ln and not ln.startswith((" ", "#")) and ", " in ln and " layers: " in ln]
    assert [h.split(",")[0] for h in heads] == [r["op"] for r in rows]          # one block per op, in order
    marks = [ln.split()[0] for ln in lines if ln.startswith("    ") and ln.split()[0] in ("✓", "✗")]
    assert marks == ["✓" if c["holds"] else "✗" for r in rows for c in r["checks"]]  # each condition its own line
