"""One ceiling division (m3lab.arith.ceil_div): exact on ints and integer arrays, and the only one in m3lab/."""
import re
from pathlib import Path

import numpy as np

import m3lab
from m3lab.arith import ceil_div

PKG = Path(m3lab.__file__).parent
HAND_WRITTEN = re.compile(r"-\s*\(\s*-")        # -(-a // b)
# m3lab/bench/ and m3lab/cache/bench.py are restructured on the bench-room branch; the lead deletes this at merge


def test_exact_where_floats_are_not():
    big = 2 ** 60 + 1
    assert ceil_div(big, 2) == 2 ** 59 + 1 != int(np.ceil(big / 2))
    assert [ceil_div(n, 128) for n in (0, 1, 127, 128, 129)] == [0, 1, 1, 1, 2]
    assert ceil_div(np.array([0, 1, 128, 129]), 128).tolist() == [0, 1, 1, 2]


def _hand_written(pkg: Path, allowed=frozenset()) -> list[str]:
    out = []
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg).as_posix()
        if rel == "arith.py" or rel in allowed:
            continue
        out += [f"{rel}:{i}" for i, line in enumerate(p.read_text().splitlines(), 1)
                if HAND_WRITTEN.search(line.split("#")[0])]
    return out


def test_no_hand_written_ceiling_division_outside_arith():
    assert _hand_written(PKG) == []


def test_the_scan_finds_a_planted_one(tmp_path):
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "planted.py").write_text("blocks = -(-tokens // 16)\n")
    assert _hand_written(tmp_path) == ["serving/planted.py:1"]
