"""A GPU session's log: every line timestamped from the session's start, printed and appended to a file."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable


def session_log(path: str | Path, t0: float | None = None) -> Callable[[str], None]:
    """``log(msg)`` printing ``[  12.3s] msg`` (seconds since ``t0``, default now) and appending it to ``path``."""
    start = time.time() if t0 is None else t0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        line = f"[{time.time() - start:6.1f}s] {msg}"
        print(line, flush=True)
        with path.open("a") as f:
            f.write(line + "\n")
    return log
