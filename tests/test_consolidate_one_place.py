"""One fact, one place: each of these facts is defined in exactly one module of the library (m3lab/ and
kernels/), and everything else imports it. Definitions are found by spelling (FACTS) and, for M3's dimensions
and the H200 ceilings, by value: constants are evaluated and compared with the spec, the plan and the hardware
profile (tests/one_place_values.py), so ``H, I = 6144, 768`` or ``3 * 2048`` is found however it is named."""
import ast
import json
import re
import shutil
from pathlib import Path

import pytest

import one_place_values as opv

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "m3lab").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")])

# fact -> (regular expression of its definition, the one file allowed to hold it)
FACTS = {
    # our GEMM launcher's decode/prefill boundary, its crossover and the gemv bound (a vLLM kernel's own
    # boundary is another fact: name it VLLM_...)
    "decode/prefill boundary": (r"^\s*(?!VLLM_)\w*DECODE\w*(MAX|_M\b)\w*\s*(:\s*\w+\s*)?=\s*\d", "kernels/gemm/tables.py"),
    "split-K/tiled crossover": (r"^\s*\w*CROSSOVER\w*\s*=", "kernels/gemm/tables.py"),
    "gemv bound": (r"^\s*\w*GEMV_MAX\w*\s*=", "kernels/gemm/tables.py"),
    # bytes per element and block scales
    "payload bytes per dtype": (r"^\s*DTYPE_BYTES\b.*=|^def dtype_bytes\b|\"mxfp4\"\s*:\s*0\.5\b", "m3lab/spec/dtypes.py"),
    "scale bytes per dtype": (r"^def scale_bytes|^\s*\w*SCALE_BLOCK\w*\s*[:=]|\+\s*1\s*/\s*32\b", "m3lab/spec/dtypes.py"),
    "weight bytes": (r"^def weight_bytes\(|^\s*W_BYTES\s*=", "m3lab/spec/dtypes.py"),
    # a GEMM's FLOPs and bytes, and the dense-equivalent of a grouped GEMM
    "GEMM FLOPs": (r"2(\.0)?\s*\*\s*m\s*\*\s*n\s*\*\s*k\b", "m3lab/spec/gemm_cost.py"),
    "dense-equivalent grouped GEMM": (r"np\.sqrt\(\s*active", "m3lab/spec/gemm_cost.py"),
    # defaults: the benchmarked M3 TP4 shapes come from the OpTable, never a literal list
    "M3 TP4 GEMM shapes": (r"\(2304,\s*6144\)|\(6144,\s*3072\)", None),
    "OpTable columns": (r"^COLUMNS\s*=\s*\(\s*\"layer\"", "m3lab/optable/ops.py"),
}


def _definitions(pattern: str, sources=SOURCES, root: Path = ROOT) -> list[str]:
    """'file:line: text' of every source line matching ``pattern`` (comments skipped)."""
    rx = re.compile(pattern)
    hits = []
    for path in sources:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if rx.search(line) and not line.lstrip().startswith("#"):
                hits.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    return hits


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_defined_in_one_place(fact):
    pattern, home = FACTS[fact]
    hits = _definitions(pattern)
    if home is None:
        assert hits == [], f"{fact} written out again:\n" + "\n".join(hits)
    else:
        assert hits and all(h.startswith(home + ":") for h in hits), f"{fact} defined at:\n" + "\n".join(hits)


def test_the_patterns_find_a_second_definition(tmp_path):
    """The check can fail: a planted copy of the boundary and of the byte table is found."""
    planted = tmp_path / "copy.py"
    planted.write_text('DECODE_M_MAX = 64\nW_BYTES = {"bf16": 2.0, "mxfp8": 1.0 + 1 / 32}\n')
    found = {fact: _definitions(FACTS[fact][0], [planted], tmp_path)
             for fact in ("decode/prefill boundary", "weight bytes", "scale bytes per dtype")}
    assert found == {"decode/prefill boundary": ["copy.py:1: DECODE_M_MAX = 64"],
                     "weight bytes": ['copy.py:2: W_BYTES = {"bf16": 2.0, "mxfp8": 1.0 + 1 / 32}'],
                     "scale bytes per dtype": ['copy.py:2: W_BYTES = {"bf16": 2.0, "mxfp8": 1.0 + 1 / 32}']}


# ---------------------------------------------------------------- by value: M3 dimensions and H200 ceilings
# Numbers that equal an M3 value of their kind but are another model's: (path, module-level name) -> why
NOT_M3 = {("m3lab/spec/model.py", "MINI_M3_CONFIG"): "the reduced CPU test model's config (8 heads)"}


def _lines_of(path: str, name: str) -> range:
    """The source lines of the module-level assignment to ``name`` in ``path`` (repository-relative)."""
    tree = ast.parse((opv.ROOT / path).read_text())
    node = next(n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                and name in [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                             if isinstance(t, ast.Name)])
    return range(node.lineno, node.end_lineno + 1)


def _not_m3(finding: str) -> bool:
    path, line = finding.split(":")[:2]
    return any(path == p and int(line) in _lines_of(p, name) for p, name in NOT_M3)


def test_m3_dims_and_ceilings_only_in_their_owners():
    left = [f for f in opv.scan() if not _not_m3(f)]
    assert left == [], "numbers outside their owner:\n" + "\n".join(left)


def test_the_owner_values_are_the_spec():
    dims = opv.m3_dims()
    assert 6144 in dims["hidden"] and {768, 1536, 3072, 12288} <= dims["inter"] and {128, 129} <= dims["experts"]
    assert {4, 5} <= dims["topk"] and {64, 16, 4, 1} <= dims["heads"] and 128 in dims["head_dim"]


@pytest.mark.parametrize("planted, what", [
    ("H = 6144\n", "H = 6144 is M3's hidden"),
    ("HIDDEN, INTER = 3 * 2048, 1536 // 2\n", "INTER = "),               # derived, not spelled
    ("SHAPE = {'experts': 128 + 1, 'topk': 5}\n", "experts = 129"),
    ("import torch\nx = torch.empty(8, 6144)\n", "6144 in a shape"),
    ("def bench(t, i=768):\n    return t\n", "i = 768"),
    ("class C:\n    copy_tbps: float = 4.8\n", "ceiling copy_tbps"),
])
def test_a_planted_copy_in_a_benchmark_module_is_found(tmp_path, planted, what):
    (tmp_path / "m3lab" / "bench").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    shutil.copy(opv.ROOT / "m3lab" / "bench" / "gemm.py", tmp_path / "m3lab" / "bench" / "gemm.py")
    clean = opv.scan(tmp_path)
    (tmp_path / "m3lab" / "bench" / "planted.py").write_text(planted)
    new = [f for f in opv.scan(tmp_path) if f not in clean]
    assert new and all(f.startswith("m3lab/bench/planted.py:") for f in new) and any(what in f for f in new), new


def test_a_planted_copy_in_a_notebook_cell_is_found(tmp_path):
    (tmp_path / "m3lab").mkdir()
    (tmp_path / "notebooks").mkdir()
    nb = {"cells": [{"cell_type": "markdown", "source": ["hidden 6144"]},
                    {"cell_type": "code", "source": ["%matplotlib inline\n", "topk = 4\n"]}]}
    (tmp_path / "notebooks" / "99_x.ipynb").write_text(json.dumps(nb))
    assert opv.scan(tmp_path) == ["notebooks/99_x.ipynb[cell 1]:2: topk = 4 is M3's topk (take it from the spec / "
                                  "ParallelPlan)"]


@pytest.mark.parametrize("innocent", ["TOPK = 16\n", "index_topk_freq = 4\n", "kv_heads = 1\n", "x = np.zeros(8192)\n",
                                      "BLOCK = 128\n", "bandwidth = 5e10\n"])
def test_numbers_that_are_not_m3_facts_pass(tmp_path, innocent):
    (tmp_path / "m3lab").mkdir()
    (tmp_path / "m3lab" / "x.py").write_text(innocent)
    assert opv.scan(tmp_path) == []


def test_an_exemption_covers_only_its_own_assignment():
    """The reduced model's config is exempt by name, wherever it moves; the same number one line outside is not."""
    lines = _lines_of("m3lab/spec/model.py", "MINI_M3_CONFIG")
    assert _not_m3(f"m3lab/spec/model.py:{lines.start}: num_attention_heads = 8 is M3's heads")
    assert not _not_m3(f"m3lab/spec/model.py:{lines.start - 1}: num_attention_heads = 8 is M3's heads")
