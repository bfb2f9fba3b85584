"""Host (CPU) time of one vLLM engine step, from the step's composition: what the device waits for when it waits.

Per step, in µs (:func:`host_time`):

- ``schedule_us`` / ``update_us`` — vLLM's ``Scheduler.schedule()`` and ``update_from_output()``: a fixed part
  plus a part per scheduled request, plus ``add_request`` (prompt block hashing) and admission work per new
  request. **Measured** on this project's CPU box with vLLM 0.33.0's own ``AsyncScheduler``
  (``python -m m3lab.vllm.scheduler_timing``; ``data/host_time_vllm_scheduler.csv``).
- ``prepare_us`` — the worker's input preparation (``_update_states`` per new request, ``_prepare_inputs`` per
  token, batch dispatch + slot mappings + attention metadata per step);
- ``launch_us`` — graph replay: one piece for a uniform decode batch (full CUDA/HIP graph), and for a mixed
  step one piece per layer plus the eager attention call between pieces (piecewise graphs);
- ``output_us`` — logits gather and ``compute_logits``.
  These three are **measured** in a PyTorch-profiler trace of vLLM's V1 GPU model runner executing one mixed
  step (GPT-OSS-20B, 24 layers, 1× MI300X, piecewise graphs, 8192 tokens: 9 prefill chunks + 37 decodes;
  ``data/host_time_kineto_phases.csv`` from AMD-AGI/TraceLens, see ``data/SOURCE.md``). That trace recorded
  Python stacks (17,038 Python-function events), which inflates Python-heavy phases: treat them as upper
  bounds; scale with :meth:`HostConstants.scaled` to see the sensitivity. Sampling (on the GPU in the V2
  model runner) and the API server's detokenisation and streaming are not in either source: **assumed** 0.

When each part runs (:mod:`m3lab.serving.timeline`, the one place the overlap is modelled): ``ready_us`` (schedule +
prepare) before the device can start the step; ``issue_us`` (launch + output: graph pieces, eager attention and
the logits are launched onto the device stream, which runs them as they come) while the device runs the step,
so it delays the step only when launching outlasts the device work; ``after_us`` (update) once the step ended.
The trace shows the overlap: its mixed step spent 26.2 ms of CPU in ``execute_model`` (profiler included) against
156.1 ms of GPU kernels, so its launches ran ahead of the device.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from m3lab.errors import M3LabError
from m3lab.traces.files import read_json   # the traces package's one-line errors for bad files

DATA = Path(__file__).with_name("data")
SCHEDULER_CSV = DATA / "host_time_vllm_scheduler.csv"
KINETO_CSV = DATA / "host_time_kineto_phases.csv"
KINETO_STEP = DATA / "host_time_kineto_step.json"

#: Kineto phases: name -> how its Python-function (or runtime) event is recognised in a vLLM worker trace.
PHASES = {"execute_model": r"gpu_model_runner\.py\(\d+\): execute_model$",
          "update_states": r"gpu_model_runner\.py\(\d+\): _update_states$",
          "add_request": r"gpu_input_batch\.py\(\d+\): add_request$",
          "prepare_inputs": r"gpu_model_runner\.py\(\d+\): _prepare_inputs$",
          "batch_dispatch": r"gpu_model_runner\.py\(\d+\): _determine_batch_execution_and_padding$",
          "slot_mappings": r"gpu_model_runner\.py\(\d+\): _get_slot_mappings$",
          "attention_metadata": r"gpu_model_runner\.py\(\d+\): _build_attention_metadata$",
          "model_forward": r"gpu_model_runner\.py\(\d+\): _model_forward$",
          "eager_attention": r"^<built-in method unified_attention_with_output",
          "graph_launch": r"^(hip|cuda)GraphLaunch$",
          "compute_logits": r"\): compute_logits$",
          "logits_gather": r"^aten::index$"}


def kineto_host_phases(path: str | Path) -> pd.DataFrame:
    """CPU time of a vLLM worker step's phases in a PyTorch-profiler trace: ``[phase, calls, total_us]``.

    Outermost events only (a phase nested in itself, e.g. the logits gather inside the forward, counts once,
    and only at the step's top level for ``logits_gather``)."""
    doc = read_json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise M3LabError(f"{path}: not a Chrome trace (no traceEvents list)", field="TRACE")
    host = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and e.get("cat") in ("python_function", "cuda_runtime", "cpu_op")]
    steps = [e for e in host if re.search(PHASES["execute_model"], str(e.get("name", "")))]
    if len(steps) != 1:
        raise M3LabError(f"{path}: {len(steps)} execute_model calls, expected one engine step", field="TRACE",
                         hint="profile exactly one step of vLLM's GPU model runner")
    t0, t1 = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
    forward = [e for e in host if re.search(PHASES["model_forward"], e["name"])]
    f0, f1 = (forward[0]["ts"], forward[0]["ts"] + forward[0]["dur"]) if forward else (t1, t1)
    rows = []
    for phase, pattern in PHASES.items():
        found = [e for e in host if t0 <= e["ts"] <= t1 and re.search(pattern, e["name"])]
        if phase == "logits_gather":
            found = [e for e in found if not f0 <= e["ts"] <= f1]
        found.sort(key=lambda e: e["ts"])
        outer, end = [], -1.0
        for e in found:
            if e["ts"] >= end:
                outer.append(e)
                end = e["ts"] + e["dur"]
        rows.append({"phase": phase, "calls": len(outer), "total_us": round(sum(e["dur"] for e in outer), 3)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class HostConstants:
    """The per-step host-time constants (µs); :func:`constants` derives them from the shipped data."""

    schedule_step_us: float            # measured: vLLM scheduler on this CPU
    schedule_per_request_us: float
    update_step_us: float
    update_per_request_us: float
    add_request_us: float              # EngineCore add_request (block hashing of a 2048-token prompt)
    admission_us: float                # extra schedule() time of a step that admits one request
    new_request_us: float              # worker _update_states per new request (Kineto trace)
    prepare_per_token_us: float        # worker _prepare_inputs per scheduled token (Kineto trace)
    prepare_step_us: float             # batch dispatch + slot mappings + attention metadata (Kineto trace)
    piece_us: float                    # one graph piece: launch + Python wrapper (Kineto trace)
    eager_attention_us: float          # one eager attention call between pieces (Kineto trace)
    output_step_us: float              # compute_logits + logits gather (Kineto trace)

    def scaled(self, factor: float) -> HostConstants:
        """Every constant times ``factor`` (sensitivity: faster or slower host CPUs, profiler overhead)."""
        return replace(self, **{f.name: getattr(self, f.name) * factor for f in fields(self)})


@lru_cache(maxsize=1)
def sources() -> dict:
    """Where each constant comes from (file, what it was derived from)."""
    step = json.loads(KINETO_STEP.read_text())
    trace = f"{KINETO_CSV.name} ({step['model']}, {step['gpu']}, {step['runner']})"
    sched = f"{SCHEDULER_CSV.name} (vLLM 0.33.0 AsyncScheduler on {_machine()})"
    out = {n: f"measured: {sched}" for n in ("schedule_step_us", "schedule_per_request_us", "update_step_us",
                                             "update_per_request_us", "add_request_us", "admission_us")}
    out.update({n: f"measured: {trace}; upper bound (Python-stack profiling)" for n in
                ("new_request_us", "prepare_per_token_us", "prepare_step_us", "piece_us", "eager_attention_us",
                 "output_step_us")})
    out["sampling"] = "assumed 0 (on the GPU in vLLM's V2 model runner)"
    out["api_server"] = "assumed 0 (detokenisation and streaming are not measured)"
    return out


def _machine() -> str:
    return str(pd.read_csv(SCHEDULER_CSV)["machine"].iloc[0])


def fit(rows: pd.DataFrame) -> dict:
    """From the scheduler-timing rows: µs per step and per running request of ``schedule()`` and
    ``update_from_output()`` (least squares of relative error over the decode rows), µs per ``add_request`` and
    per admission."""
    d = rows[rows["what"] == "decode_step"]
    out = {}
    for col in ("schedule_us", "update_us"):                  # relative least squares: 1 to 256 running
        y = d[col].to_numpy(float)
        slope, intercept = np.polyfit(d["running"].to_numpy(float), y, 1, w=1.0 / y)
        out[col.replace("_us", "_step_us")] = float(intercept)
        out[col.replace("_us", "_per_request_us")] = float(slope)
    out["add_request_us"] = float(rows.loc[rows["what"] == "add_request", "schedule_us"].iloc[0])
    out["admission_us"] = float(rows.loc[rows["what"] == "admission_step", "schedule_us"].iloc[0])
    return out


@lru_cache(maxsize=1)
def constants() -> HostConstants:
    """The constants, derived from ``data/host_time_vllm_scheduler.csv`` and ``data/host_time_kineto_*``."""
    f = fit(pd.read_csv(SCHEDULER_CSV))
    ph = pd.read_csv(KINETO_CSV).set_index("phase")
    step = json.loads(KINETO_STEP.read_text())
    tot = ph["total_us"].astype(float).to_dict()
    pieces = int(ph.loc["graph_launch", "calls"])
    eager = int(ph.loc["eager_attention", "calls"])
    return HostConstants(
        schedule_step_us=max(f["schedule_step_us"], 0.0), schedule_per_request_us=f["schedule_per_request_us"],
        update_step_us=max(f["update_step_us"], 0.0), update_per_request_us=f["update_per_request_us"],
        add_request_us=f["add_request_us"], admission_us=f["admission_us"],
        new_request_us=tot["update_states"] / int(ph.loc["add_request", "calls"]),
        prepare_per_token_us=tot["prepare_inputs"] / step["tokens"],
        prepare_step_us=tot["batch_dispatch"] + tot["slot_mappings"] + tot["attention_metadata"],
        piece_us=(tot["model_forward"] - tot["eager_attention"]) / pieces,
        eager_attention_us=tot["eager_attention"] / eager,
        output_step_us=tot["compute_logits"] + tot["logits_gather"])


@dataclass(frozen=True)
class HostTime:
    """Host µs of one step by part (see the module docstring)."""

    schedule_us: float
    prepare_us: float
    launch_us: float
    update_us: float
    output_us: float

    @property
    def ready_us(self) -> float:
        """Before the device can start the step: schedule + prepare."""
        return self.schedule_us + self.prepare_us

    @property
    def issue_us(self) -> float:
        """While the device runs the step: launches of the pieces, attention and logits."""
        return self.launch_us + self.output_us

    @property
    def before_us(self) -> float:
        """All host work before the step's outputs can be read."""
        return self.ready_us + self.issue_us

    @property
    def after_us(self) -> float:
        """After the step ended: ``update_from_output``."""
        return self.update_us

    @property
    def total_us(self) -> float:
        return self.before_us + self.after_us


def host_time(num_reqs: int, num_tokens: int, *, layers: int, num_new: int = 0, full_graph: bool = True,
              c: HostConstants | None = None) -> HostTime:
    """Host time of a step of ``num_reqs`` requests and ``num_tokens`` tokens, ``num_new`` of them admitted in it,
    on a model of ``layers`` attention layers; ``full_graph``: a uniform decode batch replayed as one graph (else
    piecewise: a piece and an eager attention call per layer)."""
    if layers < 1 or num_reqs < 0 or num_tokens < num_reqs or num_new < 0:
        raise M3LabError(f"host_time needs layers >= 1 and tokens >= requests >= 0 (got layers={layers}, "
                         f"requests={num_reqs}, tokens={num_tokens}, new={num_new})", field="num_tokens")
    c = c or constants()
    launch = c.piece_us if full_graph else (layers + 1) * c.piece_us + layers * c.eager_attention_us
    return HostTime(
        schedule_us=c.schedule_step_us + c.schedule_per_request_us * num_reqs
        + (c.add_request_us + c.admission_us) * num_new,
        prepare_us=c.prepare_step_us + c.prepare_per_token_us * num_tokens + c.new_request_us * num_new,
        launch_us=launch,
        update_us=c.update_step_us + c.update_per_request_us * num_reqs,
        output_us=c.output_step_us)


def step_host_us(layers: int, c: HostConstants | None = None):
    """A ``host_us(step) -> (ready_us, issue_us, after_us)`` callable for
    :func:`m3lab.serving.bench_load.bench_load` and :mod:`m3lab.serving.timed_engine`: new requests are rows whose
    context is their chunk (first chunk, no prefix hit); a step of decodes only is a full graph."""
    @lru_cache(maxsize=4096)
    def parts(num_reqs: int, num_tokens: int, new: int, full_graph: bool) -> tuple[float, float, float]:
        h = host_time(num_reqs, num_tokens, layers=layers, num_new=new, full_graph=full_graph, c=c)
        return h.ready_us, h.issue_us, h.after_us

    def host_us(step) -> tuple[float, float, float]:
        new = int(np.count_nonzero(step.context_lens == step.new_tokens))
        return parts(step.num_reqs, step.num_tokens, new, bool(step.is_decode.all()))
    return host_us
