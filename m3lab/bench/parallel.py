"""Compile kernels ahead of timing them, in parallel worker processes (GPU only).

Triton caches every binary it compiles on disk; a worker process that runs a kernel once with the
specialisation the timed call will have fills that cache, and the timing process then loads the binary
instead of compiling it while a run's minutes count. :func:`run_in_workers` hands ``jobs`` to ``workers``
spawned processes, ``fn(chunk) -> [error or '']`` per chunk, and counts the failures.
"""
from __future__ import annotations

import time


def run_in_workers(fn, jobs: list, workers: int = 12, log=print, label: str = "precompile") -> int:
    """``fn`` (a module-level function: spawned workers import it) over ``jobs`` split into ``workers`` chunks."""
    import concurrent.futures as cf
    import multiprocessing as mp
    jobs = list(dict.fromkeys(jobs))
    chunks = [jobs[i::workers] for i in range(workers)]
    t0, failed = time.time(), 0
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for fut in cf.as_completed([pool.submit(fn, ch) for ch in chunks if ch]):
            errors = fut.result()
            failed += sum(bool(e) for e in errors)
            for e in (e for e in errors if e):
                log(f"{label}: {e}")
    log(f"{label}: {len(jobs)} jobs in {time.time() - t0:.0f}s, {failed} failed")
    return failed
