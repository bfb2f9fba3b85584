"""Package layout: the top-level ``kernels/`` folder is installed as ``m3lab.kernels``.

Everything else is declared in pyproject.toml; this file only computes the package list,
which pyproject's static ``package-dir`` cannot express for a growing tree of kernel folders.
"""
from setuptools import find_packages, setup

kernel_pkgs = ["m3lab.kernels"] + [f"m3lab.kernels.{p}" for p in find_packages("kernels")]
setup(
    packages=find_packages(include=["m3lab", "m3lab.*"]) + kernel_pkgs,
    package_dir={"m3lab.kernels": "kernels"},
)
