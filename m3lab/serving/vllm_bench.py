"""Read ``vllm bench serve --save-result`` JSON files (current and older benchmark_serving formats).

Two formats are accepted (vLLM's benchmarks/serve.py and the older benchmark_serving.py):

- current ``vllm bench serve`` (vllm/benchmarks/serve.py): ``endpoint_type``, ``request_goodput``,
  ``max_output_tokens_per_s``, ``rtfx``, percentile keys ``p99_<metric>_ms``;
- the older ``benchmark_serving.py`` and its forks (e.g. InferenceX): ``best_of``, the typo key
  ``"request_goodput:"``, ``benchmark_start_time_unix``, percentile keys p90/p99/p99.9.

Per-GPU figures are not in the file: :meth:`BenchResult.per_gpu` and :func:`bench_table` need the
GPU count of the deployment. A file that is not JSON, not an object, or lacks a required result
key raises :class:`~m3lab.errors.M3LabError`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from m3lab.errors import M3LabError
from m3lab.provenance import REPO_ROOT

REQUIRED_KEYS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "output_throughput")
METRICS = ("ttft", "tpot", "itl", "e2el")
OLDER_MARKERS = ("best_of", "request_goodput:", "benchmark_start_time_unix")


@dataclass(frozen=True)
class BenchResult:
    """One serving-benchmark run. Latencies in ms, throughputs per deployment (not per GPU)."""

    path: str
    format: str                      # "vllm bench serve" | "benchmark_serving (older)"
    model_id: str
    backend: str
    date: str
    num_prompts: int | None
    max_concurrency: int | None
    request_rate: float              # inf for a closed loop
    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float        # requests/s
    output_throughput: float         # output tokens/s
    total_token_throughput: float    # input + output tokens/s
    stats_ms: dict = field(default_factory=dict)   # {"ttft": {"mean": .., "median": .., "p99": ..}, ...}
    spec_acceptance_length: float | None = None

    @property
    def mean_input_len(self) -> float:
        return self.total_input_tokens / max(self.completed, 1)

    @property
    def mean_output_len(self) -> float:
        return self.total_output_tokens / max(self.completed, 1)

    def stat(self, metric: str, which: str = "median") -> float:
        """A latency statistic in ms, e.g. ``stat("ttft", "median")``; NaN if the file lacks it."""
        return self.stats_ms.get(metric, {}).get(which, math.nan)

    def per_gpu(self, gpus: int) -> dict:
        """The headline figures with throughputs divided by ``gpus`` (the deployment's GPU count)."""
        if not isinstance(gpus, int) or gpus < 1:
            raise M3LabError(f"gpus={gpus!r} must be a positive integer",
                             field="gpus", hint="pass the deployment's GPU count, e.g. gpus=4 for TP4")
        return {
            "model_id": self.model_id, "max_concurrency": self.max_concurrency, "gpus": gpus,
            "mean_input_len": self.mean_input_len, "mean_output_len": self.mean_output_len,
            "output_tokens_per_s_per_gpu": self.output_throughput / gpus,
            "total_tokens_per_s_per_gpu": self.total_token_throughput / gpus,
            "request_throughput": self.request_throughput,
            "median_ttft_s": self.stat("ttft", "median") / 1e3, "mean_ttft_s": self.stat("ttft", "mean") / 1e3,
            "mean_tpot_ms": self.stat("tpot", "mean"), "median_tpot_ms": self.stat("tpot", "median"),
            "mean_itl_ms": self.stat("itl", "mean"), "format": self.format, "source": self.path,
        }


def _stats(raw: dict) -> dict:
    """Collect ``mean_ttft_ms``/``p99.9_itl_ms``-style keys into ``{metric: {stat: ms}}``."""
    out: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        if not key.endswith("_ms") or not isinstance(value, (int, float)):
            continue
        stem = key[:-3]
        for metric in METRICS:
            if stem.endswith("_" + metric):
                out.setdefault(metric, {})[stem[: -len(metric) - 1]] = float(value)
    return out


def _rate(value) -> float:
    if value is None or value == "inf":
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        raise M3LabError(f"request_rate={value!r} is neither a number nor 'inf'", field="request_rate") from None


def _number(raw: dict, key: str, path: str, default=None):
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise M3LabError(f"{path}: key {key!r} is {value!r}, expected a number",
                         field=key, hint="is this a `vllm bench serve --save-result` file?")
    return value


def parse_bench_result(raw: dict, path: str = "<dict>") -> BenchResult:
    """Build a :class:`BenchResult` from a loaded result dict (either format)."""
    if not isinstance(raw, dict):
        raise M3LabError(f"{path}: a bench result must be a JSON object, got {type(raw).__name__}",
                         hint="pass a file written by `vllm bench serve --save-result`")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise M3LabError(f"{path}: not a vLLM bench result, missing key(s) {', '.join(missing)}",
                         field=missing[0], hint="pass a file written by `vllm bench serve --save-result`")
    older = any(k in raw for k in OLDER_MARKERS) and "endpoint_type" not in raw
    completed = int(_number(raw, "completed", path))
    duration = float(_number(raw, "duration", path))
    out_tok = int(_number(raw, "total_output_tokens", path))
    in_tok = int(_number(raw, "total_input_tokens", path))
    total_tp = raw.get("total_token_throughput")
    if not isinstance(total_tp, (int, float)):
        total_tp = (in_tok + out_tok) / duration if duration > 0 else math.nan
    conc = raw.get("max_concurrency")
    return BenchResult(
        path=path, format="benchmark_serving (older)" if older else "vllm bench serve",
        model_id=str(raw.get("model_id", "")), backend=str(raw.get("backend", "")), date=str(raw.get("date", "")),
        num_prompts=raw.get("num_prompts"), max_concurrency=int(conc) if conc is not None else None,
        request_rate=_rate(raw.get("request_rate")), duration_s=duration, completed=completed,
        failed=int(raw.get("failed", 0) or 0), total_input_tokens=in_tok, total_output_tokens=out_tok,
        request_throughput=float(raw.get("request_throughput", completed / duration if duration else math.nan)),
        output_throughput=float(_number(raw, "output_throughput", path)), total_token_throughput=float(total_tp),
        stats_ms=_stats(raw), spec_acceptance_length=raw.get("spec_decode_acceptance_length"),
    )


def read_bench_result(path: str | Path) -> BenchResult:
    """Read one result file; a malformed file raises :class:`M3LabError` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise M3LabError(f"bench result {str(p)!r} does not exist", field="path", hint="check the path")
    try:
        raw = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise M3LabError(f"{p}: not valid JSON ({err.__class__.__name__} at {getattr(err, 'pos', '?')})",
                         field="path", hint="pass a file written by `vllm bench serve --save-result`") from None
    return parse_bench_result(raw, str(p))


def bench_table(paths, gpus: int | dict) -> "pandas.DataFrame":  # noqa: F821
    """One row per result file with per-GPU figures; ``gpus`` is one count or ``{path or model_id: count}``."""
    import pandas as pd

    rows = []
    for path in paths:
        res = read_bench_result(path)
        n = gpus if isinstance(gpus, int) else gpus.get(str(path), gpus.get(res.model_id))
        if n is None:
            raise M3LabError(f"no GPU count given for {path}", field="gpus",
                             hint="pass gpus=N or a dict keyed by path or model_id")
        rows.append(res.per_gpu(n))
    return pd.DataFrame(rows)


DATA_DIR = Path(__file__).with_name("data")
_REPO = REPO_ROOT


def cited(path: str | Path) -> str:
    """A file as a report cites it: its repository path (``m3lab/serving/data/SOURCE.md``) when it lies in the
    checkout, else its name: no absolute path of one machine in a shared report."""
    p = Path(path).resolve()
    return p.relative_to(_REPO).as_posix() if p.is_relative_to(_REPO) else p.name
#: Shipped samples (data/SOURCE.md) with the deployment facts the files lack.
#: ``model`` is the m3lab named config of the same architecture; ``engine`` and ``spec`` describe the deployment.
SHIPPED_BENCH = {
    "inferencex_atom_mtp_tp4_conc64_isl8192_osl1024.json": {"hardware": "mi355x", "tp": 4, "gpus": 4, "quant": "fp8",
                                                            "model": "qwen3.5-397b-a17b", "engine": "ATOM",
                                                            "spec": "MTP"},
    "inferencex_sglang_fp4_mtp_tp4_conc4_isl8192_osl1024.json": {"hardware": "mi355x", "tp": 4, "gpus": 4,
                                                                 "quant": "mxfp4", "model": "glm-5.2",
                                                                 "engine": "SGLang", "spec": "MTP"},
}


def shipped_bench_table() -> "pandas.DataFrame":  # noqa: F821
    """The shipped samples as :func:`bench_table` rows plus their hardware and quantisation (measured by others)."""
    import pandas as pd

    rows = []
    for name, facts in SHIPPED_BENCH.items():
        rows.append({**read_bench_result(DATA_DIR / name).per_gpu(facts["gpus"]), **facts, "file": name,
                     "source": cited(DATA_DIR / name)})
    return pd.DataFrame(rows)
