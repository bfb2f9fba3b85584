"""DESIGN.md's import rules: the core runs on a bare GPU box (no plotly, papermill or jupyter),
kernels are leaves, and importing m3lab does nothing visible."""
import subprocess
import sys
import textwrap

# Packages that must import without the notebook stack. m3lab.plots / pipeline / cli / nb sit on top.
CORE = ["m3lab.spec", "m3lab.optable", "m3lab.workload", "m3lab.model", "m3lab.dispatch", "m3lab.weights",
        "m3lab.kernels", "m3lab.bench", "m3lab.tune", "m3lab.gates", "m3lab.traces", "m3lab.cost",
        "m3lab.serving", "m3lab.analysis"]
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
