"""Run independent pieces of work on a Ray cluster: sweep points as tasks, tuning candidates on one actor per GPU.

:func:`run_tasks` submits one Ray task per item and collects them as they finish (``ray.wait``), printing
progress; an item that raises is reported as failed with its error while the others run to the end.

:func:`run_on_devices` spreads tuning candidates over the devices of a cluster the way vLLM's fused-MoE tuner
does (``benchmarks/kernels/benchmark_moe.py`` in vLLM's repository: one ``BenchmarkWorker`` actor per GPU,
candidates handed out round-robin by ``_distribute``): one actor per unit of ``resource``, so each device
benchmarks one candidate at a time. ``resource="GPU"`` on a GPU cluster (Ray then sets each actor's visible
device); a custom resource (e.g. ``gpu_slot``) stands in for GPUs on a CPU machine.

Ray workers must see the same m3lab checkout and file paths as the driver (a shared file system or the same
image, as on a Ray cluster launched from one container); paths handed to them should be absolute.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from m3lab.errors import M3LabError


@dataclass(frozen=True)
class Outcome:
    """The result of one item: ``value`` when ``ok``, else ``error`` (the exception's last line)."""

    index: int
    ok: bool
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def require_ray():
    """The ray module, or M3LabError with the install command."""
    try:
        import ray
    except ImportError:
        raise M3LabError("the Ray executor needs the ray package", field="executor",
                         hint="pip install 'ray[default]' (or use --executor local)") from None
    return ray


CONNECT_TIMEOUT_S = 5.0   # a cluster's address must answer a TCP connection within this long


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise M3LabError unless something listens at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``): ray.init
    itself retries an address that does not answer for minutes. None and 'auto' are left to ray.init."""
    if not address or address == "auto":
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise M3LabError(f"--address {address!r} is not HOST:PORT", field="address",
                         hint="e.g. --address 10.0.0.5:6379, or --address auto for a cluster started here")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        why = f"no answer within {timeout_s:g} s" if isinstance(err, TimeoutError) else \
            (err.strerror or type(err).__name__).lower()
        raise M3LabError(f"cannot join the Ray cluster at {address}: {why}", field="address",
                         hint="check the address and that the cluster is up ('ray status' on its head node)") from None


def connect(address: str | None = None) -> Any:
    """Join the Ray cluster at ``address`` (None: the one ``ray.init()`` finds, or a new local one); an already
    initialised Ray is used as it is. An address where nothing answers fails within CONNECT_TIMEOUT_S."""
    ray = require_ray()
    if not ray.is_initialized():
        check_reachable(address)
        if address and address != "auto":   # something answers: one connection attempt, not ray's 20 retries
            os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "10")
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise M3LabError(f"cannot join the Ray cluster at {address or 'the default address'}: "
                             f"{str(err).splitlines()[0] if str(err) else type(err).__name__}", field="address",
                             hint="start it with 'ray start --head', or pass --address HOST:6379") from None
    return ray


def _error_line(err: BaseException) -> str:
    cause = getattr(err, "cause", None) or err  # RayTaskError carries the task's own exception
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}".rstrip(": ")


def run_tasks(fn: Callable[..., Any], items: Sequence[Sequence[Any]], *, address: str | None = None,
              options: Mapping[str, Any] | None = None, labels: Sequence[str] | None = None,
              echo: Callable[[str], None] = print,
              on_done: Callable[[Outcome], str | None] | None = None) -> list[Outcome]:
    """``fn(*item)`` for every item, one Ray task each (``options``: ``num_cpus``, ``num_gpus``, ``resources``...).

    Returns one :class:`Outcome` per item, in the items' order. Progress is printed as tasks finish;
    ``on_done(outcome)``, called as each finishes, may return the text of its progress line (e.g. a task that
    returned a failed run: ``failed: <why>``) in place of ``done``.
    """
    ray = connect(address)
    remote = ray.remote(fn).options(**dict(options or {"num_cpus": 1}))
    labels = list(labels or [str(i) for i in range(len(items))])
    start = time.monotonic()
    pending = {remote.remote(*item): i for i, item in enumerate(items)}
    echo(f"ray: {len(items)} tasks submitted ({_resources_line(ray)})")
    out: dict[int, Outcome] = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        ref = done[0]
        i = pending.pop(ref)
        took = time.monotonic() - start
        try:
            out[i] = Outcome(i, True, ray.get(ref), seconds=took)
            text = "done"
        except Exception as err:  # a failing item is reported; the others go on
            out[i] = Outcome(i, False, error=_error_line(err), seconds=took)
            text = f"FAILED {out[i].error}"
        text = (on_done(out[i]) if on_done is not None else None) or text
        echo(f"  [{len(out)}/{len(items)}] {labels[i]}: {text} ({took:.0f} s)")
    return [out[i] for i in range(len(items))]


def _resources_line(ray) -> str:
    res = ray.cluster_resources()
    return ", ".join(f"{k} {v:g}" for k, v in sorted(res.items()) if not k.startswith(("node:", "memory",
                                                                                         "object_store")))


class _DeviceWorker:
    """One per device: runs ``benchmark(candidate)`` for the candidates it is handed, one at a time."""

    def run(self, benchmark: Callable[[Any], Any], candidate: Any) -> Any:
        return benchmark(candidate)


def run_on_devices(benchmark: Callable[[Any], Any], candidates: Sequence[Any], *, resource: str = "GPU",
                   address: str | None = None, echo: Callable[[str], None] = print) -> list[Outcome]:
    """``benchmark(candidate)`` for every candidate, spread over one actor per unit of ``resource`` in the cluster.

    Candidates go round-robin to the actors (as vLLM's MoE tuner distributes its search space); calls on one
    actor run in order, so a device never runs two candidates at once. A candidate that raises is reported
    failed; the others finish. Returns one :class:`Outcome` per candidate, in order.
    """
    ray = connect(address)
    units = int(ray.cluster_resources().get(resource, 0))
    if units < 1:
        raise M3LabError(f"the Ray cluster has no {resource!r} resource", field="resource",
                         hint="on a CPU machine start Ray with a custom resource, e.g. resources={'gpu_slot': 2}")
    opts = {"num_gpus": 1} if resource == "GPU" else {"num_cpus": 0, "resources": {resource: 1}}
    actor = ray.remote(_DeviceWorker).options(**opts)
    workers = [actor.remote() for _ in range(min(units, max(len(candidates), 1)))]
    echo(f"ray: {len(candidates)} candidates over {len(workers)} {resource} workers")
    refs = [workers[i % len(workers)].run.remote(benchmark, c) for i, c in enumerate(candidates)]
    start = time.monotonic()
    out = []
    for i, ref in enumerate(refs):
        try:
            out.append(Outcome(i, True, ray.get(ref), seconds=time.monotonic() - start))
        except Exception as err:  # noqa: BLE001 - one bad candidate must not lose the others
            out.append(Outcome(i, False, error=_error_line(err), seconds=time.monotonic() - start))
    for w in workers:
        ray.kill(w)
    return out
