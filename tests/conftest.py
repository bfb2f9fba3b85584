"""Shared test fixtures."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    env = os.environ.get("M3LAB_SHARED")
    return Path(env) if env else REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_dir() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout (or $M3LAB_SHARED); tests that need it skip without it."""
    d = _shared_dir()
    if not (d / "data").is_dir():
        pytest.skip(f"shared data not found at {d} (set M3LAB_SHARED)")
    return d
