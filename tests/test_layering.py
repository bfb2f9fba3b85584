"""DESIGN.md's import rules: the core runs on a bare GPU box (no plotly, papermill or jupyter),
kernels are leaves, and importing m3lab does nothing visible."""
import subprocess
import sys
import textwrap

# Packages that must import without the notebook stack. m3lab.plots / pipeline / cli / nb sit on top.
CORE = ["m3lab.vllm_src", "m3lab.spec", "m3lab.optable", "m3lab.workload", "m3lab.model", "m3lab.dispatch",
        "m3lab.weights", "m3lab.kernels", "m3lab.bench", "m3lab.tune", "m3lab.gates", "m3lab.traces", "m3lab.cost",
        "m3lab.serving", "m3lab.analysis", "m3lab.ladder", "m3lab.capture", "m3lab.bench_analysis", "m3lab.sessions"]
NOTEBOOK_STACK = ["plotly", "papermill", "nbformat", "nbconvert", "jupyterlab", "jupyter_client", "ipykernel",
                  "IPython"]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)


def test_core_imports_without_the_notebook_stack():
    res = _run(f"""
        import importlib, importlib.util, pkgutil, sys
        BLOCK = {NOTEBOOK_STACK!r}
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in BLOCK:
                    raise ImportError(f'blocked: {{name}} (not on the GPU box)')
        sys.meta_path.insert(0, Blocker())
        for pkg in {CORE!r}:
            if importlib.util.find_spec(pkg) is None:
                continue
            mod = importlib.import_module(pkg)
            for info in pkgutil.walk_packages(mod.__path__, pkg + '.'):
                if '.tests' in info.name or info.name.endswith('__main__'):
                    continue
                importlib.import_module(info.name)
        print('ok')
    """)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_kernels_import_only_torch_and_triton():
    res = _run("""
        import importlib, pkgutil, sys
        import m3lab.kernels as k
        before = set(sys.modules)
        for info in pkgutil.walk_packages(k.__path__, 'm3lab.kernels.'):
            importlib.import_module(info.name)
        bad = sorted(m for m in set(sys.modules) - before
                     if m.startswith('m3lab.') and not m.startswith('m3lab.kernels'))
        print(bad)
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[]", f"kernels imported the rest of m3lab: {res.stdout}"


def test_import_has_no_side_effects():
    res = _run("import m3lab, m3lab.cli.main")
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "", (res.stdout, res.stderr)


# ---------------------------------------------------------------- the import graph, read from the source
# Floors, lowest first: every key is a folder (m3lab.<folder>) or a top module (m3lab.<module>), never a file
# inside a folder. A module may import its own floor and the floors below; importing a higher one is an upward
# import. m3lab.kernels is the repo's kernels/.
LAYERS = {
    "m3lab.errors": 0, "m3lab.atomic": 0, "m3lab.provenance": 0, "m3lab.arith": 0, "m3lab.kernels": 0,
    "m3lab.vllm_src": 0,
    "m3lab.spec": 1, "m3lab.traces": 1, "m3lab.artifacts": 1, "m3lab.published": 1,
    "m3lab.cache": 2, "m3lab.dispatch": 2, "m3lab.weights": 2,
    "m3lab.workload": 3, "m3lab.model": 3,
    "m3lab.optable": 4,
    "m3lab.analysis": 5, "m3lab.cost": 5, "m3lab.pd": 5,
    "m3lab.vllm": 6,
    "m3lab.serving": 7,
    "m3lab.capture": 8, "m3lab.gates": 8,
    "m3lab.bench": 9,
    "m3lab.tune": 10, "m3lab.bench_analysis": 10,
    "m3lab.ladder": 11, "m3lab.sessions": 11,
    "m3lab.plots": 12, "m3lab.pipeline": 12,
    "m3lab.cli": 13, "m3lab.nb": 13, "m3lab.__main__": 13, "m3lab": 13,
}

def _modules(roots: dict) -> dict:
    """{module name: path} for every .py under each root folder ({folder: package name})."""
    from pathlib import Path
    mods = {}
    for folder, pkg in roots.items():
        for p in sorted(Path(folder).rglob("*.py")):
            parts = list(p.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = p
    return mods


def import_graph(roots: dict) -> dict:
    """{module: {imported module: (line, inside a function)}} over the modules under ``roots``, module-level
    and function-level imports alike (``from pkg import sub`` names the submodule when it is one)."""
    import ast
    mods = _modules(roots)
    top = {m.split(".")[0] for m in mods}
    graph = {}
    for name, path in mods.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = {}

        def add(target, node, in_fn):
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in mods and target != name and target not in edges:
                edges[target] = (node.lineno, in_fn)

        def visit(node, in_fn):
            for child in ast.iter_child_nodes(node):
                inner = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    for a in child.names:
                        if a.name.split(".")[0] in top:
                            add(a.name, child, in_fn)
                elif isinstance(child, ast.ImportFrom):
                    mod = child.module or ""
                    if child.level:
                        mod = ".".join(base[:len(base) - child.level + 1] + ([mod] if mod else []))
                    if mod.split(".")[0] in top:
                        for a in child.names:
                            add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod, child, in_fn)
                visit(child, inner)
        visit(ast.parse(path.read_text()), False)
        graph[name] = edges
    return graph


def import_cycles(graph: dict) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan): each is an import cycle."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _rank(module: str, layers: dict):
    keys = [k for k in layers if module == k or module.startswith(k + ".")]
    return layers[max(keys, key=len)] if keys else None


def upward_edges(graph: dict, layers: dict) -> dict:
    """{(importer, imported): readable line} for every import of a higher layer, and {(module, None): line} for
    every module in no layer."""
    bad = {}
    for mod, edges in sorted(graph.items()):
        r = _rank(mod, layers)
        if r is None:
            bad[(mod, None)] = f"{mod} is in no layer (add it to LAYERS)"
            continue
        for target, (line, in_fn) in sorted(edges.items()):
            t = _rank(target, layers)
            if t is not None and t > r:
                where = "inside a function" if in_fn else "at module level"
                bad[(mod, target)] = f"{mod}:{line} imports {target} {where} (layer {r} -> {t})"
    return bad


def upward_imports(graph: dict, layers: dict) -> list[str]:
    """Every import of a higher layer, and every module in no layer, as readable lines."""
    return list(upward_edges(graph, layers).values())


def layer_keys_below_folders(layers: dict) -> list[str]:
    """Keys of the layer map deeper than ``pkg.<folder>``: a per-file exception, which the map must not have."""
    return sorted(k for k in layers if k.count(".") > 1)


def layering_violations(graph: dict, layers: dict) -> list[str]:
    """What the repository's layering test reports: per-file keys in the map, then every upward import (and
    every module in no layer)."""
    out = [f"{k} is deeper than a folder: the layer map takes folders only" for k in layer_keys_below_folders(layers)]
    return out + list(upward_edges(graph, layers).values())


def _repo_graph():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    return import_graph({root / "m3lab": "m3lab", root / "kernels": "m3lab.kernels"})


def test_no_import_cycles_even_through_function_level_imports():
    cycles = import_cycles(_repo_graph())
    assert not cycles, f"import cycles (a function-level import does not remove one): {cycles}"


def test_no_upward_imports():
    bad = layering_violations(_repo_graph(), LAYERS)
    assert not bad, "\n".join(bad)


def test_a_planted_upward_import_or_per_file_key_fails_the_repository_map():
    graph = _repo_graph()
    assert layering_violations(graph, LAYERS) == []
    planted = {**graph, "m3lab.spec.model": {**graph["m3lab.spec.model"], "m3lab.serving.estimate": (9, True)}}
    assert layering_violations(planted, LAYERS) == [
        "m3lab.spec.model:9 imports m3lab.serving.estimate inside a function (layer 1 -> 7)"]
    gates_up = {**graph, "m3lab.gates.moe": {**graph["m3lab.gates.moe"], "m3lab.bench.moe": (3, False)}}
    assert layering_violations(gates_up, LAYERS) == [
        "m3lab.gates.moe:3 imports m3lab.bench.moe at module level (layer 8 -> 9)"]
    analysis_up = {**graph, "m3lab.bench_analysis.gemm": {**graph["m3lab.bench_analysis.gemm"],
                                                          "m3lab.sessions.gemm": (4, True)}}
    assert layering_violations(analysis_up, LAYERS) == [
        "m3lab.bench_analysis.gemm:4 imports m3lab.sessions.gemm inside a function (layer 10 -> 11)"]
    per_file = {**LAYERS, "m3lab.dispatch.capture": 8}
    assert layering_violations(graph, per_file) == [
        "m3lab.dispatch.capture is deeper than a folder: the layer map takes folders only"]


def _plant(tmp_path, files: dict) -> dict:
    pkg = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(textwrap.dedent(text))
    return import_graph({pkg: "pkg"})


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    graph = _plant(tmp_path, {
        "events.py": "from pkg.kineto import read\n",
        "kineto.py": "def read(path):\n    from pkg import events  # deferred: hides the cycle\n    return events\n",
        "clean.py": "import pkg.kineto\n"})
    assert import_cycles(graph) == [["pkg.events", "pkg.kineto"]]
    assert graph["pkg.kineto"]["pkg.events"] == (2, True)
    del graph["pkg.kineto"]["pkg.events"]
    assert import_cycles(graph) == []


def test_an_upward_import_is_found(tmp_path):
    graph = _plant(tmp_path, {"low/__init__.py": "", "low/core.py": "def f():\n    from ..high.view import g\n",
                              "high/__init__.py": "", "high/view.py": "from pkg.low import core\n"})
    layers = {"pkg": 2, "pkg.low": 0, "pkg.high": 1}
    assert upward_imports(graph, layers) == [
        "pkg.low.core:2 imports pkg.high.view inside a function (layer 0 -> 1)"]
    assert upward_imports(graph, {**layers, "pkg.high": 0}) == []
    assert upward_imports(graph, {"pkg.low": 0}) == [f"{m} is in no layer (add it to LAYERS)"
                                                      for m in ("pkg", "pkg.high", "pkg.high.view")]
