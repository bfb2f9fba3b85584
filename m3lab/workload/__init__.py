"""Workloads and the engine-step generator (vLLM 0.33.0's V1 scheduling rules).

- :class:`EngineStep` (``m3lab.workload.step``): one batch, per-request new tokens and context lengths.
- :class:`Workload`, :class:`SchedulerConfig`, :class:`Scheduler` (``m3lab.workload.scheduler``): the step
  generator's public face; its rules live in ``m3lab.workload.engine_core``.
- Request contents, the fake model's draft acceptance, step records and arrival rules shared with vLLM's own
  scheduler (``m3lab.workload.requests``; the judge is ``m3lab.vllm.scheduler_judge``).
"""
from m3lab.workload.requests import FakeOutputs, StepRecord
from m3lab.workload.scheduler import Scheduler, SchedulerConfig, SchedulerState, StepRun, Workload
from m3lab.workload.step import EngineStep

__all__ = ["EngineStep", "FakeOutputs", "Scheduler", "SchedulerConfig", "SchedulerState", "StepRecord", "StepRun",
           "Workload"]
