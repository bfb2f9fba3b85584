"""What the GPU's clocks and power did while a benchmark point was timed (NVML, sampled in a thread).

``with ClockWatch(device) as watch: ...`` samples the SM clock, the power draw and the clock-limit reasons
every ``period_s`` while the block runs; ``watch.note()`` gives one line, e.g.
``"sm 1755-1980 MHz, 698/700 W, power-cap"``, where ``power-cap`` (or ``thermal``) says the driver lowered
the clocks for that reason during the point. Nothing is changed on the card: NVML is only read. Without a
GPU or NVML the note is empty.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

POWER_CAP = 0x4 | 0x80            # NVML clock-limit reasons: SW power cap, HW power brake
THERMAL = 0x20 | 0x40 | 0x8       # SW thermal, HW thermal, HW slowdown


def _nvml():
    """The NVML bindings (nvidia-ml-py's ``pynvml``, else vLLM's copy of it), or None."""
    try:
        import pynvml  # optional: nvidia-ml-py, present on the GPU images
        return pynvml
    except ImportError:
        try:
            from vllm.third_party import pynvml  # optional: vLLM's copy
            return pynvml
        except ImportError:
            return None


@dataclass
class ClockWatch:
    """Context manager: NVML samples of one device while the block runs (see the module docstring)."""
    index: int = 0
    period_s: float = 0.02
    sm_mhz: list = field(default_factory=list)
    watts: list = field(default_factory=list)
    reasons: int = 0
    limit_w: float = float("nan")

    def __enter__(self) -> "ClockWatch":
        self._nv, self._stop = _nvml(), threading.Event()
        self._thread = None
        if self._nv is None:
            return self
        try:
            self._nv.nvmlInit()
            self._h = self._nv.nvmlDeviceGetHandleByIndex(self.index)
            self.limit_w = self._nv.nvmlDeviceGetEnforcedPowerLimit(self._h) / 1000.0
        except Exception:   # no driver, no device: an empty note
            self._nv = None
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nv = self._nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        while not self._stop.is_set():
            try:
                self.sm_mhz.append(nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_SM))
                self.watts.append(nv.nvmlDeviceGetPowerUsage(self._h) / 1000.0)
            except Exception:
                return
            try:
                self.reasons |= int(reasons(self._h)) if reasons else 0
            except Exception:
                reasons = None
            self._stop.wait(self.period_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def note(self) -> str:
        """``"sm LO-HI MHz, PEAK/LIMIT W[, power-cap][, thermal]"``; empty without samples."""
        if not self.sm_mhz:
            return ""
        flags = [name for bit, name in ((POWER_CAP, "power-cap"), (THERMAL, "thermal")) if self.reasons & bit]
        return ", ".join([f"sm {min(self.sm_mhz)}-{max(self.sm_mhz)} MHz",
                          f"{max(self.watts):.0f}/{self.limit_w:.0f} W", *flags])


def power_limited(note: str) -> bool:
    """True when a row's clock note says the clocks were lowered for power or heat."""
    return "power-cap" in str(note) or "thermal" in str(note)
