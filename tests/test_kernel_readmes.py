"""Each op folder's README has a "Where everything is" table that gives a repository path for every piece of the op
(math, reference, kernels, launcher, tables, tuner, benchmark runner, analysis, gate module, notebook, fast-path
declaration, cost-model rows), and every path in it exists: a move that forgets a README fails here."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = ("gemm", "moe", "sparse_attn", "indexer", "mx")
PIECES = ("math", "reference", "kernels", "launcher", "tables", "tuner", "benchmark runner", "analysis", "gate module",
          "notebook", "fast-path declaration", "cost-model rows")
HEADING = "## Where everything is"
# a repository path: a known top folder, then path characters only (no spaces, wildcards or ellipses)
PATH = re.compile(r"^(?:m3lab|kernels|traces|tests|notebooks)/[\w./=,-]*$")


def where_table(text: str) -> dict[str, str]:
    """{piece: its "where" cell} of the README's "Where everything is" table ({} when there is none)."""
    if HEADING not in text:
        return {}
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and cells[0] not in ("piece", "") and not set(cells[0]) <= set("-"):
            rows[cells[0]] = cells[1]
    return rows


def paths_in(cell: str) -> list[str]:
    """The repository paths quoted in a cell (backticked)."""
    return [t for t in re.findall(r"`([^`]+)`", cell) if PATH.match(t)]


def problems(text: str, root: Path = ROOT) -> list[str]:
    """Every missing piece, piece without a path, and path that does not exist, as readable lines."""
    table = where_table(text)
    out = [f"no row for {p!r}" for p in PIECES if p not in table]
    for piece, cell in table.items():
        found = paths_in(cell)
        if not found:
            out.append(f"{piece}: no repository path")
        out += [f"{piece}: {p} does not exist" for p in found if not (root / p).exists()]
    return out


@pytest.mark.parametrize("op", READMES)
def test_every_piece_has_a_path_that_exists(op):
    text = (ROOT / "kernels" / op / "README.md").read_text()
    assert not problems(text), f"kernels/{op}/README.md: " + "; ".join(problems(text))


def test_a_moved_file_or_a_dropped_row_is_found():
    text = (ROOT / "kernels" / "moe" / "README.md").read_text()
    assert not problems(text)
    moved = text.replace("`m3lab/bench/moe.py`", "`m3lab/bench/moe_runner.py`")
    assert problems(moved) == ["benchmark runner: m3lab/bench/moe_runner.py does not exist"]
    dropped = "\n".join(line for line in text.splitlines() if not line.startswith("| tuner |"))
    assert problems(dropped) == ["no row for 'tuner'"]
    assert problems(text.replace(HEADING, "## Elsewhere"))[:1] == ["no row for 'math'"]


def test_no_readme_names_a_fast_path_the_registry_lacks():
    """Fast-path names quoted in the READMEs' declaration rows are paths of m3lab/dispatch/registry.py."""
    registry = (ROOT / "m3lab" / "dispatch" / "registry.py").read_text()
    for op in READMES:
        cell = where_table((ROOT / "kernels" / op / "README.md").read_text())["fast-path declaration"]
        for name in re.findall(r"`((?:gemm|moe|attention|indexer|topk)\.[a-z0-9_]+)`", cell):
            assert f'"{name}"' in registry, f"kernels/{op}/README.md names {name}, which the registry lacks"
