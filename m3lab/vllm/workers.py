"""One worker process per emulated target, so one Python session can ask about several GPUs.

vLLM fixes platform-dependent constants when a module is first imported (:mod:`m3lab.vllm.emulate`), so a
process can emulate one target only. :func:`call` runs a function in a worker process bound to the
deployment's target: a notebook that resolves an MI355X deployment and then an H200 one gets two workers,
each importing vLLM under its own platform. The caller's process never imports vLLM for this, so a GPU
session keeps its real platform.

A worker is ``python -m m3lab.vllm.workers`` (a fresh interpreter, whatever the caller's ``__main__`` is),
fed pickled ``(function, args, kwargs)`` requests on its stdin and answering on its stdout; its stderr
(vLLM's log) goes to a file that a failure quotes. Workers start on first use (the first call pays vLLM's
imports, 10-15 s on an idle 2-core CPU) and are kept for later calls; at most :data:`MAX_WORKERS` live at once
(the least recently used one is stopped). :func:`shutdown` stops them all.
"""
from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, BinaryIO

from m3lab.errors import M3LabError
from m3lab.provenance import REPO_ROOT
from m3lab.vllm.emulate import bind

MAX_WORKERS = 2
# the caller's settings a worker must not take: the Triton interpreter would run the kernels the recorder
# only logs; the caller's GPU stays hidden (the emulation answers for the target)
NOT_INHERITED = ("TRITON_INTERPRET", "ROCR_VISIBLE_DEVICES")
_HEADER = struct.Struct("<Q")


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(head)
    return pickle.loads(stream.read(size))


class Worker:
    """A worker process (see the module docstring)."""

    def __init__(self, key: tuple[str, str]):
        self.key = key
        self.log = Path(tempfile.mkstemp(prefix=f"m3lab-vllm-{key[1]}-", suffix=".log")[1])
        root = str(REPO_ROOT)  # the directory holding the m3lab package
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        env.update(PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
                   CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")  # a real GPU stays out of the emulation
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "m3lab.vllm.workers"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=env)

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[str, Any, Any]:
        try:
            _send(self.proc.stdin, (fn, args, kwargs))
            return _receive(self.proc.stdout)
        except (EOFError, BrokenPipeError, OSError):
            self.stop(keep_log=True)
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise M3LabError(f"the vLLM worker for {self.key[1]} stopped: {' | '.join(tail) or 'no output'}",
                             field="hardware", hint=f"full log: {self.log}") from None

    def stop(self, keep_log: bool = False) -> None:
        """End the process (it exits when its stdin closes); its log is removed unless ``keep_log``."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep_log:
            self.log.unlink(missing_ok=True)


_WORKERS: OrderedDict[tuple[str, str], Worker] = OrderedDict()


def _worker(target) -> Worker:
    key = (target.kind, target.arch)
    if key in _WORKERS and _WORKERS[key].proc.poll() is None:
        _WORKERS.move_to_end(key)
        return _WORKERS[key]
    while len(_WORKERS) >= MAX_WORKERS:
        _, old = _WORKERS.popitem(last=False)
        old.stop()
    atexit.unregister(shutdown)
    atexit.register(shutdown)  # once: a script that never calls shutdown() leaves no worker or log behind
    worker = Worker(key)
    worker.call(bind, (target,), {})  # vLLM imported under the target before anything else runs there
    _WORKERS[key] = worker
    return worker


def call(target, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in the worker of ``target`` (an :class:`~m3lab.vllm.emulate.Target`).

    ``fn`` must be importable by name (a module-level function). An M3LabError raised there is raised here.
    """
    status, value, field = _worker(target).call(fn, args, kwargs)
    if status == "error":
        raise M3LabError(value, field=field)
    if status == "exception":
        raise RuntimeError(f"in the vLLM worker for {target.arch}: {value}")
    return value


def running() -> list[tuple[str, str]]:
    """The targets with a live worker, least recently used first."""
    return [k for k, w in _WORKERS.items() if w.proc.poll() is None]


def shutdown() -> None:
    """Stop every worker."""
    while _WORKERS:
        _, worker = _WORKERS.popitem()
        worker.stop()


def _serve() -> None:
    """The worker's loop: answer requests until stdin closes. fd 1 is the protocol; prints go to stderr."""
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            fn, args, kwargs = _receive(requests)
        except EOFError:  # the caller is done: exit without tearing vLLM's modules down (seconds of CPU)
            sys.stderr.flush()
            os._exit(0)
        try:
            reply = ("ok", fn(*args, **kwargs), None)
        except M3LabError as err:
            reply = ("error", str(err), err.field)
        except Exception as err:  # a bug or an emulation gap: the caller gets the message and the log
            import traceback
            traceback.print_exc()
            reply = ("exception", f"{type(err).__name__}: {err}", None)
        _send(proto, reply)


if __name__ == "__main__":
    _serve()
