"""The wheel carries every module and data file (kernels/ as m3lab.kernels), built offline."""
import subprocess
import sys
import zipfile

import pytest

DATA = (".yaml", ".yml", ".json", ".csv", ".toml")


@pytest.mark.slow
def test_wheel_holds_all_modules_and_data_and_builds_without_warnings(repo_dir, tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                          "-w", str(tmp_path), str(repo_dir)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    # the first set-up must not print pages of packaging warnings (license table, data folders "ignored")
    warnings = [line for line in (res.stdout + res.stderr).splitlines() if "BuildBackendWarning" in line
                or "SetuptoolsDeprecationWarning" in line]
    assert not warnings, warnings[:5]
    wheel = next(tmp_path.glob("m3lab-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for top, prefix in (("m3lab", "m3lab/"), ("kernels", "m3lab/kernels/")):
        for f in (repo_dir / top).rglob("*"):
            if "__pycache__" in f.parts or not f.is_file():
                continue
            if f.suffix == ".py" or f.suffix in DATA:
                expected.add(prefix + f.relative_to(repo_dir / top).as_posix())
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel: {missing[:20]}"


def test_kernels_import_from_a_bare_source_tree(repo_dir, tmp_path):
    """With only PYTHONPATH=<tree> (no install, no site-packages), m3lab.kernels is the tree's kernels/."""
    res = subprocess.run([sys.executable, "-S", "-c",
                          "import m3lab.kernels as k, os; print(os.path.dirname(k.__file__))"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(repo_dir)}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(repo_dir / "kernels")
