"""m3lab.provenance owns the repository root, the commit, the device and the CSV appender: each rule tested,
and a scan of m3lab/ that fails on a second derivation of the root or a second ``git rev-parse``."""
import ast
import csv
import shutil
import subprocess
from pathlib import Path

import pytest

from m3lab import provenance
from m3lab.errors import M3LabError

PKG = Path(provenance.__file__).parent
OWNER = PKG / "provenance.py"


def test_roots_are_the_checkout():
    assert (provenance.REPO_ROOT / "m3lab" / "provenance.py").is_file()
    assert provenance.TRACES_BENCH == provenance.REPO_ROOT / "traces" / "bench" and provenance.TRACES_DIR.is_dir()
    assert (provenance.KERNELS_DIR / "moe" / "tables.py").is_file() and provenance.NOTEBOOKS_DIR.is_dir()


def test_commit_takes_git_commit_first(monkeypatch):
    monkeypatch.setenv("GIT_COMMIT", "abc1234")
    assert provenance.commit() == "abc1234"


def test_commit_from_git_when_unset(monkeypatch):
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=provenance.REPO_ROOT, capture_output=True,
                         text=True).stdout.strip()
    got = provenance.commit()
    assert sha and got.removesuffix("-dirty") == sha


def test_commit_without_git(monkeypatch, tmp_path):
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    assert provenance.commit(tmp_path) == "unknown"                 # a tree without .git (the GPU box)
    monkeypatch.setenv("PATH", str(tmp_path))                         # no git binary at all
    assert provenance.commit() == "unknown"
    monkeypatch.setenv("GIT_COMMIT", "")                              # empty means unset
    assert provenance.commit(tmp_path) == "unknown"


def test_device_name_without_accelerator(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert provenance.device_name() == provenance.cpu_name() and provenance.cpu_name().startswith("cpu: ")


def test_device_name_names_the_accelerator(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert provenance.device_name() == "NVIDIA H200"
    from m3lab.kernels.device import table_device_name
    assert table_device_name("cuda") == "NVIDIA_H200" and table_device_name("cpu") == "cpu"


def test_append_keeps_the_header_and_appends(tmp_path):
    path = tmp_path / "t" / "rows.csv"
    provenance.append_csv(path, [{"a": 1, "b": 0.1234567891}], ("a", "b", "c"))
    provenance.append_csv(path, [{"a": 2, "c": "x"}], ("a", "b", "c"))
    rows = list(csv.reader(path.open()))
    assert rows == [["a", "b", "c"], ["1", "0.123457", ""], ["2", "", "x"]]


def test_append_refuses_a_different_header_or_unknown_columns(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(M3LabError, match="header"):
        provenance.append_csv(path, [{"a": 1}], ("a", "b", "c"))
    with pytest.raises(M3LabError, match="columns"):
        provenance.append_csv(path, [{"a": 1, "z": 2}], ("a", "b"))
    assert path.read_text() == "a,b\n1,2\n"


# ------------------------------------------------------------------ nobody else derives these facts
def _outside_owner(pkg: Path) -> list[str]:
    """``file:line`` of every ``Path(__file__)...parents[k]`` / ``.parent`` chain that climbs out of the m3lab
    package (the repository root), and of every ``git rev-parse``, in modules other than provenance.py."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name == "provenance.py" and path.parent == pkg:
            continue
        depth = len(path.relative_to(pkg).parts)        # parents[depth - 1] is the package, parents[depth] above
        src = path.read_text()
        if "rev-parse" in src:
            bad += [f"{path}:{i}: git rev-parse" for i, line in enumerate(src.splitlines(), 1) if "rev-parse" in line]
        for node in ast.walk(ast.parse(src)):
            up = _climb(node)
            if up is not None and up >= depth:
                bad.append(f"{path}:{node.lineno}: climbs {up} folders above the file")
    return bad


def _climb(node) -> int | None:
    """How many folders above ``__file__``'s folder a ``Path(__file__)...`` expression reaches (None: not one)."""
    ups, cur = 0, node
    if isinstance(cur, ast.Subscript) and isinstance(cur.value, ast.Attribute) and cur.value.attr == "parents" \
            and isinstance(cur.slice, ast.Constant) and isinstance(cur.slice.value, int):
        ups, cur = cur.slice.value, cur.value.value
    elif isinstance(cur, ast.Attribute) and cur.attr == "parent":
        while isinstance(cur, ast.Attribute) and cur.attr == "parent":
            ups, cur = ups + 1, cur.value
        ups -= 1                                          # the first .parent is the file's own folder
    else:
        return None
    while isinstance(cur, ast.Call) and isinstance(cur.func, ast.Attribute) and cur.func.attr in ("resolve", "absolute"):
        cur = cur.func.value
    is_file = isinstance(cur, ast.Call) and any(isinstance(a, ast.Name) and a.id == "__file__" for a in cur.args)
    return ups if is_file else None


def test_only_provenance_derives_the_root_or_asks_git():
    assert _outside_owner(PKG) == []


@pytest.mark.parametrize("planted", ['ROOT = Path(__file__).resolve().parents[2] / "traces"\n',
                                     'ROOT = Path(__file__).parent.parent.parent\n',
                                     'SHA = subprocess.run(["git", "rev-parse", "HEAD"]).stdout\n'])
def test_the_scan_fails_on_a_planted_copy(tmp_path, planted):
    pkg = tmp_path / "m3lab"
    shutil.copytree(PKG / "traces", pkg / "traces")
    (pkg / "traces" / "planted.py").write_text("from pathlib import Path\nimport subprocess\n" + planted)
    assert len(_outside_owner(pkg)) == 1
    (pkg / "traces" / "planted.py").write_text('DATA = Path(__file__).resolve().parents[0] / "data"\n')
    assert _outside_owner(pkg) == []                      # a package-relative path is not the root
