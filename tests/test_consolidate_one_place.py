"""One fact, one place: each of these facts is defined in exactly one module of the library (m3lab/ and
kernels/), and everything else imports it. Found by reading the source, as grep would."""
import re
from pathlib import Path

import pytest

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
