"""The run summary: `summarize` turns step records into the figures the study asks for
(throughput, step-time variance and tail, arrival and entry spread, delays, who was last),
and `Summary` prints them as a table in ms, as `print(pacer.summary())` shows them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .telemetry import StepRecord

# The printed rows: label, key, scale, format. The demo prints the same rows side by side.
SUMMARY_ROWS = (
    ("throughput (samples/s)", "throughput", 1.0, "{:.0f}"),
    ("step time mean (ms)", "step_time_mean", 1e-3, "{:.2f}"),
    ("step time p50 (ms)", "step_time_p50", 1e-3, "{:.2f}"),
    ("step time p99 (ms)", "step_time_p99", 1e-3, "{:.2f}"),
    ("step time CV", "step_time_cv", 1.0, "{:.3f}"),
    # Natural arrivals (w + d): pacing cannot move them, it delays the entries after them.
    ("arrival spread mean (ms)", "spread_mean", 1e-3, "{:.2f}"),
    ("arrival spread p99 (ms)", "spread_p99", 1e-3, "{:.2f}"),
    ("entry spread mean (ms)", "entry_spread_mean", 1e-3, "{:.2f}"),
    ("entry spread p99 (ms)", "entry_spread_p99", 1e-3, "{:.2f}"),
    ("delay per rank-step (ms)", "delay_mean", 1e-3, "{:.2f}"),
    # Hysteresis on: delays may follow (the early ranks' floors still rising: none yet)
    ("pacing armed (% of steps)", "active_fraction", 100.0, "{:.0f}"),
    ("steps with a delay (%)", "delayed_fraction", 100.0, "{:.0f}"),
)
SHOWN_LAST = 5  # ranks named in the "most often last" line


class Summary(dict):
    """`summarize`'s figures: a plain dict (times in us, throughput in samples/s) that prints
    as a table in ms."""

    __slots__ = ()

    def __str__(self) -> str:
        return format_summary(self)


def format_summary(s: dict[str, Any]) -> str:
    """A summary as lines of text: what it covers, one figure a line in ms, and the ranks
    most often last (the whole histogram is one number a rank)."""
    about = ", ".join(f"{k.replace('_', ' ')} {s[k]}" for k in ("world_size", "mode", "backend",
                                                               "sites") if k in s)
    warm = s.get("warmup_steps")
    after = f" after the first {warm} (warm-up)" if warm else ""
    lines = [f"gpupace summary: {s.get('steps', 0)} steps{after}" + (f" ({about})" if about
                                                                      else "")]
    for label, key, scale, fmt in SUMMARY_ROWS:
        v = s.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if key == "throughput":
                label = f"throughput ({s.get('throughput_unit', 'samples/s')})"
            lines.append(f"{label:28}{fmt.format(v * scale):>12}")
    hist = s.get("straggler_histogram") or []
    top = sorted((r for r, c in enumerate(hist) if c), key=lambda r: (-hist[r], r))[:SHOWN_LAST]
    if top:
        lines.append("most often last: " + ", ".join(
            f"rank {r} ({hist[r]} step{'s' if hist[r] != 1 else ''})" for r in top))
    return "\n".join(lines)


def summarize(records: Iterable[StepRecord], world_size: int | None = None,
              samples_per_step: float = 1.0) -> Summary:
    """Throughput and the variance, tail and jitter figures the study asks for.
    Steps with an unknown step time (the first) are left out of the step-time figures."""
    records = list(records)
    st = np.array([r.step_time_us for r in records], dtype=np.float64)
    st = st[np.isfinite(st) & (st > 0)]
    sp = np.array([r.spread_us for r in records], dtype=np.float64)
    sp = sp[np.isfinite(sp)]
    entry = np.array([r.residual_us for r in records], dtype=np.float64)
    entry = entry[np.isfinite(entry)]
    if world_size is None:
        world_size = max((len(r.earliness_us) for r in records), default=0)
    hist = [0] * world_size
    for r in records:
        if 0 <= r.straggler < world_size:
            hist[r.straggler] += 1
    out = Summary({
        "steps": len(records),
        "throughput": float(samples_per_step * 1e6 / st.mean()) if st.size else float("nan"),
        "step_time_mean": _stat(st, np.mean),
        "step_time_cv": float(st.std() / st.mean()) if st.size > 1 and st.mean() > 0 else float("nan"),
        "step_time_p50": _stat(st, np.percentile, 50),
        "step_time_p99": _stat(st, np.percentile, 99),
        "step_time_max": _stat(st, np.max),
        "spread_mean": _stat(sp, np.mean),
        "spread_p99": _stat(sp, np.percentile, 99),
        # What pacing acts on: the spread of entries into the collective, after the delays.
        "entry_spread_mean": _stat(entry, np.mean),
        "entry_spread_p99": _stat(entry, np.percentile, 99),
        # Hysteresis on; the floors may still be rising: `delayed_fraction` is when delays ran.
        "active_fraction": float(np.mean([r.active for r in records])) if records else 0.0,
        "delayed_fraction": float(np.mean([bool(np.any(np.asarray(r.delay_us) > 0.0))
                                           for r in records])) if records else 0.0,
        "delay_mean": float(np.mean([np.sum(r.delay_us) for r in records]) / max(world_size, 1))
        if records else 0.0,
        "straggler_histogram": hist,
        "throughput_unit": "samples/s" if samples_per_step != 1 else "steps/s",
        "units": "step times, spreads and delays in us; throughput in samples/s "
        "(steps/s when samples_per_step is 1)",
    })
    return out


def _stat(a: np.ndarray, fn, *args) -> float:
    return float(fn(a, *args)) if a.size else float("nan")
