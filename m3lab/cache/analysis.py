"""Tables for notebook 06: hit rate against capacity and policy, and the timelines of a serving run.

Analyzers take a trace or a run and return pandas DataFrames; :mod:`m3lab.cache.plots` draws them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from m3lab.cache.replay import blocks_for_tokens, replay
from m3lab.cache.trace import Trace


def capacity_curve(trace: Trace, capacities_tokens, policies=("lru",), *, concurrency: int = 1) -> pd.DataFrame:
    """Replay ``trace`` at each capacity (tokens; ``None`` = unlimited) under each policy:
    ``[policy, capacity_tokens, hit_rate_tokens, hit_rate_blocks, evicted_blocks, peak_kv_usage]``."""
    rows = []
    for policy in policies:
        for cap in capacities_tokens:
            s = replay(trace, num_blocks=blocks_for_tokens(cap, trace.block_size), policy=policy,
                       concurrency=concurrency).summary()
            rows.append({"policy": policy, "capacity_tokens": np.inf if cap is None else float(cap),
                         **{k: s[k] for k in ("hit_rate_tokens", "hit_rate_blocks", "evicted_blocks", "peak_kv_usage")}})
    return pd.DataFrame(rows)


def theoretical_vs_realised(curve: pd.DataFrame, policy: str = "lru") -> pd.DataFrame:
    """Per finite capacity: the unlimited-cache (theoretical) hit rate, the realised one, and the share kept."""
    sub = curve[curve["policy"] == policy]
    theory = float(sub.loc[np.isinf(sub["capacity_tokens"]), "hit_rate_tokens"].iloc[0])
    fin = sub[np.isfinite(sub["capacity_tokens"])].copy()
    fin["theoretical_hit_rate"] = theory
    fin["share_of_theoretical"] = fin["hit_rate_tokens"] / theory if theory else np.nan
    return fin[["capacity_tokens", "theoretical_hit_rate", "hit_rate_tokens", "share_of_theoretical",
                "evicted_blocks", "peak_kv_usage"]].reset_index(drop=True)


def latency_percentiles(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT (s) and TPOT (ms) at p50 / p90 / p99 from a serving run's per-request table."""
    rows = []
    for metric, unit in (("ttft_s", "s"), ("tpot_ms", "ms")):
        x = requests[metric].to_numpy(float)
        x = x[np.isfinite(x)]
        rows.append({"metric": metric, "unit": unit,
                     **{f"p{q}": float(np.percentile(x, q)) if len(x) else np.nan for q in (50, 90, 99)}})
    return pd.DataFrame(rows)


def hit_rate_by_turn(requests: pd.DataFrame) -> pd.DataFrame:
    """Mean prefix-hit share of the prompt by turn number within a session (first admission of each)."""
    df = requests.copy()
    df["turn"] = df.groupby("session").cumcount()
    df["hit_share"] = df["hit_tokens"] / df["prompt_tokens"]
    return df.groupby("turn", as_index=False)["hit_share"].mean()
