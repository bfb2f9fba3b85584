"""Find M3 dimensions and H200 ceilings written as numbers outside their owners, by value, not by spelling.

Owners: the model spec (``m3lab/spec/configs``, :func:`m3lab.spec.model.load_model`) and ``ParallelPlan``
(``m3lab/spec/plan.py``) own every M3 dimension, full and per TP rank; the hardware profile
(``m3lab/spec/profiles/h200.yaml``, ``measured:``) owns the measured H200 ceilings.

The scan reads every module's syntax tree (and the notebooks' code cells) and evaluates what it can without
running the module: constant expressions (``6144``, ``3 * 2048``, ``(6144, 768)``, ``128 + 1``) bound to
module- or class-level names, to dictionary keys, and to parameter defaults. A finding is
- a name that says it is a model dimension (``H``, ``hidden``, ``I``, ``inter``, ``experts``, ``topk``,
  ``heads``, ``head_dim``, ``vocab`` ...) whose evaluated value is an M3 dimension of that kind;
- an integer literal equal to a distinctive M3 width (hidden, intermediate, vocabulary, their TP4 slices,
  the 129-row expert table) inside a shape-building call (``torch.empty/zeros/ones/randn/rand/randint/full``,
  ``np.zeros/...``, ``.view/.reshape/.expand/.new_*``);
- a numeric literal named as a ceiling (``*_tbps``, ``*_tflops``, ``*_bw``, ``*flops``, ``peak*``,
  ``ceiling*``) anywhere but the profile.
"""
from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP = (1, 4, 8)

# name token -> kind of dimension it claims to be
KINDS = {
    "h": "hidden", "hidden": "hidden", "d_model": "hidden", "hidden_size": "hidden",
    "i": "inter", "inter": "inter", "intermediate": "inter", "ffn": "inter", "expert_inter": "inter",
    "dense_inter": "inter", "shared_inter": "inter",
    "e": "experts", "experts": "experts", "routed": "experts", "num_experts": "experts",
    "topk": "topk", "top_k": "topk",
    "heads": "heads", "q_heads": "heads", "kv_heads": "heads", "heads_q": "heads", "heads_kv": "heads",
    "head_dim": "head_dim", "hd": "head_dim",
    "vocab": "vocab",
}
CEILING_NAME = re.compile(r"(tbps|tflops)$|^(hbm|copy|mm|gemm|matmul)_\w*(bw|flops)$", re.I)
SHAPE_CALLS = {"empty", "zeros", "ones", "randn", "rand", "randint", "full", "view", "reshape", "expand",
               "new_empty", "new_zeros", "new_ones", "new_full", "empty_strided"}


@lru_cache(maxsize=1)
def m3_dims() -> dict[str, frozenset[int]]:
    """{kind: values} of MiniMax M3, whole and per rank at TP 1, 4, 8 (from the spec and ParallelPlan)."""
    from m3lab.spec.model import load_model
    from m3lab.spec.plan import ParallelPlan
    m = load_model("minimax-m3")
    out: dict[str, set[int]] = {k: set() for k in set(KINDS.values())}
    out["hidden"] |= {m.hidden}
    out["inter"] |= {m.expert_inter, m.dense_inter, m.shared_inter}
    out["experts"] |= {m.experts, m.experts + m.n_shared}
    out["topk"] |= {m.topk, m.topk + m.n_shared}
    out["heads"] |= {m.heads_q, m.heads_kv, m.sparse.index_heads}
    out["head_dim"] |= {m.head_dim, m.sparse.index_dim, m.rotary_dim}
    out["vocab"] |= {m.vocab}
    for tp in TP:
        p = ParallelPlan(tp=tp)
        inter = {p.expert_inter_local(m), p.shared_inter_local(m), p.dense_inter_local(m)}
        out["inter"] |= inter | {2 * i for i in inter}
        out["heads"] |= {p.heads_q_local(m), p.heads_kv_local(m), p.index_heads_local(m)}
        out["vocab"] |= {p.vocab_local(m)}
        out["hidden"] |= {p.heads_q_local(m) * m.head_dim}          # the attention output width per rank
    return {k: frozenset(v) for k, v in out.items()}


@lru_cache(maxsize=1)
def distinctive() -> frozenset[int]:
    """M3 widths no generic size shares (hidden, intermediate, vocabulary and their slices, the expert table
    with the shared expert; powers of two such as 1024 or 8192 left out): in a shape, such a literal is M3's."""
    d = m3_dims()
    return frozenset(v for v in d["hidden"] | d["inter"] | d["vocab"] | {max(d["experts"])}
                     if v > 128 and v & (v - 1))


def kind_of(name: str) -> str | None:
    """The dimension a name claims: the whole name, else its last ``_`` token (``EXPERT_INTER`` -> inter;
    ``index_topk_freq`` claims none)."""
    low = name.lower()
    tokens = [t for t in low.split("_") if t]
    return KINDS.get(low) or (KINDS.get(tokens[-1]) if tokens else None)


def fold(node: ast.AST):
    """The value of a constant expression (numbers, + - * // / **, tuples/lists of them); None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        vals = [fold(e) for e in node.elts]
        return None if any(v is None for v in vals) else tuple(vals)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = fold(node.operand)
        return None if v is None or isinstance(v, tuple) else -v
    if isinstance(node, ast.BinOp):
        a, b = fold(node.left), fold(node.right)
        if a is None or b is None or isinstance(a, tuple) or isinstance(b, tuple):
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else None, ast.Div: lambda: a / b if b else None,
               ast.Pow: lambda: a ** b if abs(b) < 64 else None}
        f = ops.get(type(node.op))
        return f() if f else None
    return None


def _bindings(tree: ast.AST):
    """(name, value node, line, constant) of module- and class-level assignments and dict entries with string
    keys (constant: True), and of parameter defaults and call keywords (False), anywhere in the tree."""
    def targets(t, v):
        if isinstance(t, ast.Name):
            yield t.id, v
        elif isinstance(t, (ast.Tuple, ast.List)) and isinstance(v, (ast.Tuple, ast.List)) \
                and len(t.elts) == len(v.elts):
            for tt, vv in zip(t.elts, v.elts):
                yield from targets(tt, vv)
        elif isinstance(t, ast.Attribute):
            yield t.attr, v

    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for scope in scopes:
        for stmt in scope.body:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    for name, v in targets(t, stmt.value):
                        yield name, v, stmt.lineno, True
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                for name, v in targets(stmt.target, stmt.value):
                    yield name, v, stmt.lineno, True
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    yield k.value, v, node.lineno, True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            pos = args.posonlyargs + args.args
            for a, d in zip(pos[len(pos) - len(args.defaults):], args.defaults):
                yield a.arg, d, d.lineno, False
            for a, d in zip(args.kwonlyargs, args.kw_defaults):
                if d is not None:
                    yield a.arg, d, d.lineno, False
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg:
                    yield kw.arg, kw.value, kw.value.lineno, False


def _shape_literals(tree: ast.AST):
    """(value, line) of distinctive integer literals inside shape-building calls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name not in SHAPE_CALLS:
                continue
            for arg in [*node.args, *(k.value for k in node.keywords if k.arg in ("size", "shape"))]:
                for sub in ast.walk(arg):
                    v = fold(sub) if isinstance(sub, (ast.Constant, ast.BinOp)) else None
                    if isinstance(v, int) and v in distinctive():
                        yield v, sub.lineno


def scan_source(text: str, label: str) -> list[str]:
    """Findings (``label:line: what``) in one source text."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    dims, out = m3_dims(), []
    for name, node, line, constant in _bindings(tree):
        value = fold(node)
        if value is None:
            continue
        if CEILING_NAME.search(name) and isinstance(value, (int, float)) and value:
            out.append(f"{label}:{line}: ceiling {name} = {value} (the hardware profile's `measured` owns it)")
            continue
        kind = kind_of(name)
        values = value if isinstance(value, tuple) else (value,)
        # a defined constant claims any M3 value of its kind (but 1); a default or keyword a distinctive one only
        hits = [v for v in values if kind and isinstance(v, int) and v > 1 and v in dims[kind]
                and (constant or v in distinctive())]
        if hits:
            out.append(f"{label}:{line}: {name} = {value} is M3's {kind} (take it from the spec / ParallelPlan)")
    seen = set()
    for value, line in _shape_literals(tree):
        if (value, line) not in seen:
            seen.add((value, line))
            out.append(f"{label}:{line}: {value} in a shape is an M3 width (take it from the spec / ParallelPlan)")
    return out


def notebook_code(path: Path) -> list[tuple[str, str]]:
    """(label, source) of every code cell (IPython magics blanked)."""
    nb = json.loads(path.read_text())
    cells = []
    for i, c in enumerate(nb.get("cells", [])):
        if c.get("cell_type") == "code":
            src = "".join(c.get("source", []))
            src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())
            cells.append((f"{path.relative_to(path.parents[1])}[cell {i}]", src))
    return cells


def scan(root: Path = ROOT) -> list[str]:
    """Every finding under ``root``'s m3lab/ (its modules) and notebooks/ (code cells)."""
    out = []
    for p in sorted((root / "m3lab").rglob("*.py")):
        out += scan_source(p.read_text(), p.relative_to(root).as_posix())
    for p in sorted((root / "notebooks").glob("*.ipynb")):
        for label, src in notebook_code(p):
            out += scan_source(src, label)
    return out
