"""Package layout: the top-level ``kernels/`` folder is installed as ``m3lab.kernels``.

Everything else is declared in pyproject.toml; this file only computes the package list, which pyproject's
static ``package-dir`` cannot express for a growing tree of kernel folders. Folders that hold only data
(``m3lab/pipelines``, ``m3lab/spec/configs`` ...) are listed as (namespace) packages so that setuptools
installs their files without warning that they would otherwise be ignored.
"""
from setuptools import find_namespace_packages, setup

SKIP = ["*.__pycache__", "*.__pycache__.*"]
kernel_pkgs = ["m3lab.kernels"] + [f"m3lab.kernels.{p}" for p in find_namespace_packages("kernels", exclude=SKIP)]
setup(
    packages=find_namespace_packages(include=["m3lab", "m3lab.*"], exclude=SKIP) + kernel_pkgs,
    package_dir={"m3lab.kernels": "kernels"},
)
