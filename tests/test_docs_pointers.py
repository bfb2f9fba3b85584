"""Docs and code point only inside the repository (or at the installed vLLM), every such pointer resolves, and
no work history sits in them (the git log keeps it)."""
import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("*.py", "*.md", "*.yaml", "*.yml", "*.ipynb", "*.toml", "*.txt")
# documents a clone does not have, and the words that point at them
OUTSIDE = re.compile(r"\.\./shared|shared/(reference|reviews|data)|reference §|minimax_m3\.md|vllm_install_notes|"
                     r"install notes|\b(DESIGN|MISSION|STYLE)\.md")
# work history: what changed, when, in which round or issue
HISTORY = re.compile(r"\(was \d|\bwas 0\.\d|\bthe issue'?s\b|\bissue's targets|\bsince then\b|\bin this round\b|"
                     r"\bround [23]\b|\bthe earlier (method|winners|version)\b|\bprevious table\b|\bour former\b|"
                     r"\bhelper [A-Z]\b")
PATH = re.compile(r"(?<![\w/.])((?:m3lab|kernels|notebooks|traces)/[\w./-]+\.(?:py|md|yaml|yml|csv|json|ipynb|txt|gz)"
                  r"|tests/[\w-]+\.py)")   # m3lab's tests are one flat folder (vLLM's tests/v1/... are not ours)
VLLM_PATH = re.compile(r"(?<![\w/.])(vllm/[\w/]+\.py)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _files(roots=("m3lab", "kernels", "notebooks")) -> list[Path]:
    """Text files of the library, its notebooks and the repository root (tests read ../shared samples when present
    and skip without them: they are not docs)."""
    out = [p for p in ROOT.iterdir() if p.is_file() and any(p.match(g) for g in TEXT)]
    for r in roots:
        out += [p for g in TEXT for p in (ROOT / r).rglob(g) if "__pycache__" not in p.parts]
    return sorted(set(out))


def _hits(rx: re.Pattern, files) -> list[str]:
    me = Path(__file__).resolve()
    return [f"{p.name}:{i}: {line.strip()[:120]}" for p in files if p.resolve() != me
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if rx.search(line)]


def test_no_pointer_outside_the_repository():
    assert _hits(OUTSIDE, _files()) == []


def test_no_work_history_in_docs_or_code():
    assert _hits(HISTORY, _files()) == []


UNTRACKED = ("node_modules", "runs", "build", "dist")   # folders a checkout makes, never docs


def _docs() -> list[tuple[str, str, Path]]:
    """(label, text, folder it is relative to) of every README and every docstring in m3lab/ and kernels/."""
    out = [(str(p.relative_to(ROOT)), p.read_text(), p.parent) for p in [*ROOT.glob("*.md"), *ROOT.rglob("README.md")]
           if not any(part.startswith(".") or part in UNTRACKED for part in p.relative_to(ROOT).parts)]
    for p in sorted([*(ROOT / "m3lab").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    out.append((f"{p.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", doc, p.parent))
    return out


def _unresolved(docs, vllm_root: Path | None) -> list[str]:
    bad = []
    for label, text, folder in docs:
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (folder / target).exists():
                bad.append(f"{label}: link {target}")
        for path in PATH.findall(text):
            if any(c in path for c in "*{<…") or path.endswith("/"):
                continue
            if not (ROOT / path).exists():
                bad.append(f"{label}: {path}")
        if vllm_root is not None:
            for path in VLLM_PATH.findall(text):
                if not (vllm_root.parent / path).exists():
                    bad.append(f"{label}: {path} (not in the installed vLLM)")
    return bad


def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def test_every_pointer_resolves():
    assert _unresolved(_docs(), _vllm_root()) == []


def test_the_checks_fail_on_planted_pointers(tmp_path):
    (tmp_path / "README.md").write_text("See [the design](../shared/DESIGN.md) and m3lab/nowhere.py.\n")
    docs = [("README.md", (tmp_path / "README.md").read_text(), tmp_path)]
    assert len(_unresolved(docs, None)) == 2
    assert _hits(OUTSIDE, [tmp_path / "README.md"]) and not _hits(HISTORY, [tmp_path / "README.md"])
    (tmp_path / "x.py").write_text('"""Decode tiles (was 0.84x) for the issue\'s targets."""\n')
    assert _hits(HISTORY, [tmp_path / "x.py"])
    vllm = _vllm_root()
    if vllm is not None:
        assert _unresolved([("x", "vllm/models/minimax_m3/amd/nowhere.py", tmp_path)], vllm)
        assert not _unresolved([("x", "vllm/models/minimax_m3/amd/model.py", tmp_path)], vllm)
