"""A progress bar that appears only when the work has already taken a few seconds (short runs stay quiet)."""
from __future__ import annotations

import sys
import time

#: Seconds of work before the bar appears (the project's rule: long work, past about 3 s, shows progress).
SHOW_AFTER_S = 3.0


class LateProgress:
    """``update(done)`` as work advances (``total`` units); a rich bar on stderr once ``SHOW_AFTER_S`` passed."""

    def __init__(self, label: str, total: int, enabled: bool = True, after_s: float = SHOW_AFTER_S):
        self.label, self.total, self.enabled, self.after_s = label, max(int(total), 1), enabled, after_s
        self.t0 = time.perf_counter()
        self._bar = self._task = None
        self._next_check = 0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            if done < self._next_check:            # look at the clock now and then, not on every unit
                return
            self._next_check = done + max(self.total // 200, 1)
            if time.perf_counter() - self.t0 < self.after_s:
                return
            from rich.console import Console       # only for long interactive runs
            from rich.progress import Progress
            self._bar = Progress(console=Console(file=sys.stderr), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> LateProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def late_progress(label: str, total: int, enabled: bool = True) -> LateProgress:
    """A :class:`LateProgress` (use as a context manager)."""
    return LateProgress(label, total, enabled)
