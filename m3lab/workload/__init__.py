"""Workloads and the engine-step generator (vLLM v1 continuous batching), plus shape histograms.

- :class:`EngineStep` (``m3lab.workload.step``): one batch, per-request new tokens and context lengths.
- :class:`Workload`, :class:`SchedulerConfig`, :class:`Scheduler` (``m3lab.workload.scheduler``).
- Shape histograms and the distinct-shape table (``m3lab.workload.shapes``).
"""
from m3lab.workload.scheduler import Scheduler, SchedulerConfig, SchedulerState, StepRun, Workload
from m3lab.workload.step import EngineStep

__all__ = ["EngineStep", "Scheduler", "SchedulerConfig", "SchedulerState", "StepRun", "Workload"]
