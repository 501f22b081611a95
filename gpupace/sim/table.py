"""The scaling table: every node count under `none`, `gpupace` and `oracle`, and its plot.

Gains are against `none` at the same node count and seed (the three runs see the same
random draws), and `oracle_fraction` is gpupace's gain over the oracle's gain (None when the
oracle gains less than `MIN_ORACLE_GAIN_PCT`, where the ratio means nothing).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..config import PaceConfig
from .scenario import Scenario
from .simulate import POLICIES, SimResult, simulate

MIN_ORACLE_GAIN_PCT = 0.05


def scaling_table(
    make: Callable[[int], Scenario],
    nodes: Sequence[int],
    *,
    steps: int = 2000,
    seed: int = 0,
    config: PaceConfig | None = None,
    skip: int | None = None,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[SimResult], None] | None = None,
) -> list[dict[str, Any]]:
    """Rows {"nodes", "ranks", "policy", "throughput", "step_time_cv", "step_time_p99",
    "gain_pct", "oracle_fraction"} for each node count and policy. `make(nodes)` builds the
    scenario; `skip` steps are left out of the figures (default: the first half)."""
    if not nodes:
        raise ValueError("nodes must list at least one node count, got none")
    rows: list[dict[str, Any]] = []
    for n in nodes:
        sc = make(n)
        sums = {}
        for pol in POLICIES:
            def report(done: int, total: int, pol: str = pol, n: int = n) -> None:
                if progress is not None:
                    progress(f"{n} nodes, {pol}: step {done}/{total}")
            res = simulate(sc, pol, config, steps, seed, progress=report)
            if on_result is not None:
                on_result(res)
            sums[pol] = res.summary(skip)
            del res  # not alive beside the next run's arrays (check_memory counts one)
        base = sums["none"]["throughput"]
        gain_oracle = 100.0 * (sums["oracle"]["throughput"] / base - 1.0)
        for pol in POLICIES:
            gain = 100.0 * (sums[pol]["throughput"] / base - 1.0)
            frac = gain / gain_oracle if gain_oracle >= MIN_ORACLE_GAIN_PCT else None
            rows.append({
                "nodes": n,
                "ranks": sc.ranks,
                "policy": pol,
                "throughput": sums[pol]["throughput"],
                "step_time_cv": sums[pol]["step_time_cv"],
                "step_time_p99": sums[pol]["step_time_p99"],
                "gain_pct": gain,
                "oracle_fraction": frac,
            })
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width text table; gpupace's share of the oracle's gain in %."""
    lines = [f"{'nodes':>5} {'ranks':>6} {'policy':>8} {'samples/s':>11} {'CV':>6} "
             f"{'p99 ms':>8}  {'gain vs none %':>14}  {'% of oracle gain':>16}"]
    for r in rows:
        # A gain that rounds to zero is printed without a sign ("-0.000" read as a loss): the
        # share rounds to an int, which has no -0, and "+ 0.0" turns a float's -0.0 into 0.0.
        frac = "-" if r["oracle_fraction"] is None else f"{round(100.0 * r['oracle_fraction'])}"
        gain = round(r["gain_pct"], 3) + 0.0
        lines.append(f"{r['nodes']:>5} {r['ranks']:>6} {r['policy']:>8} {r['throughput']:>11.1f} "
                     f"{r['step_time_cv']:>6.3f} {r['step_time_p99'] / 1e3:>8.1f} "
                     f"{gain:>14.3f}  {frac:>16}")
    if any(r["oracle_fraction"] is None for r in rows):
        lines.append(f"(% of oracle gain: - where the oracle gained under "
                     f"{MIN_ORACLE_GAIN_PCT}% or lost, too little to take a share of)")
    return "\n".join(lines)


def plot_table(rows: list[dict[str, Any]], path: str | os.PathLike, title: str = "") -> None:
    """Throughput, step-time CV and gain over `none` (%) against node count for the three
    policies, with ideal linear scaling from the smallest node count's baseline. The gain panel
    is there because gains of 0.01% leave the three throughput lines on top of each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for pol, style in zip(POLICIES, ("o-", "s-", "^--"), strict=True):
        sel = [r for r in rows if r["policy"] == pol]
        xs = [r["nodes"] for r in sel]
        ax1.plot(xs, [r["throughput"] for r in sel], style, label=pol)
        ax2.plot(xs, [r["step_time_cv"] for r in sel], style, label=pol)
        ax3.plot(xs, [r["gain_pct"] for r in sel], style, label=pol)
    base = [r for r in rows if r["policy"] == "none"]
    if base:
        n0, t0 = base[0]["nodes"], base[0]["throughput"]
        xs = [r["nodes"] for r in base]
        ax1.plot(xs, [t0 * x / n0 for x in xs], "k:", label="ideal linear")
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes")
        ax.legend()
        ax.grid(True, alpha=0.3)
    ax1.set_yscale("log", base=2)  # log-log: linear scaling is a straight line
    ax1.set_ylabel("throughput (samples/s)")
    ax2.set_ylabel("step-time CV")
    ax3.set_ylabel("throughput gain over none (%)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: None instead."""
    return x if x is None or math.isfinite(x) else None
