"""Who is late, rank by rank: each rank's lateness behind the median rank, its steady offset,
how often it arrived last, and what its lateness cost the job per step.

All of it from the clock-free earliness of each record (at its site of largest spread): no
timestamps are compared across ranks.
- A rank's cost is its lead as the last arrival over the next-latest rank, summed over the
  steps it was last, per measured step. Had it arrived with the next-latest rank, each of
  those steps would have ended that much sooner (at most: the transfer and the other sites
  unchanged). The ranks' costs add up to the last rank's mean lead, and they answer "how much
  does rank 3 cost" directly, where the lost time is against an ideal step that a noisy
  machine never repeats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .load import Run

CLEAR_LAST = 0.01  # a step's last rank counts when the spread is above this x the median step
TOP_RANKS = 5  # ranks named by cost
# Steps per block when the costs are computed: bounds the temporary copies of a long run with
# many ranks (4096 ranks x 100k steps is 3.3 GB a copy).
BLOCK_VALUES = 1 << 22


def lateness(e: np.ndarray) -> np.ndarray:
    """Each rank's lateness behind the median rank at each step, [steps, N] (us), from the
    earliness [steps, N]. With 2 ranks the median is the mean and would halve an offset: the
    earliest rank is the reference then. NaN-aware only when `e` holds NaN: np.nanmedian
    costs several times np.median on a long run."""
    clean = np.isfinite(e).all()
    if e.shape[1] > 2:
        ref = (np.median if clean else np.nanmedian)(e, axis=1, keepdims=True)
    else:
        ref = (np.max if clean else np.nanmax)(e, axis=1, keepdims=True)
    return ref - e


def locality_offsets(run: Run, rows: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, float]:
    """Per rank: steady lateness behind the median rank (median over steps, us), the fraction
    of steps it is late by at least half of that, and the noise of lateness (us, robust).
    `rows`: a boolean mask of the steps to use (default: all)."""
    e = run.earliness
    n = e.shape[1]
    ok = np.isfinite(e).all(axis=1)
    if rows is not None:
        ok &= rows
    e = e[ok]
    if e.shape[0] == 0 or n < 2:
        return np.zeros(n), np.zeros(n), 0.0
    late = lateness(e)
    offset = np.median(late, axis=0)
    consistency = np.mean(late >= 0.5 * offset[None, :], axis=0)
    noise = float(np.median(np.median(np.abs(late - offset[None, :]), axis=0))) * 1.4826
    return offset, consistency, noise


def measured(run: Run) -> np.ndarray:
    """The steps every figure and count of the report uses: past the warm-up, with a step
    time (the first step has none)."""
    st = run.step_time
    return np.isfinite(st) & (st > 0) & (run.step >= run.warmup_steps)


def clear_last(run: Run) -> np.ndarray:
    """Measured steps whose last arrival is known and means something: the spread is above
    CLEAR_LAST of the median step (with no spread the 'last' rank is an arbitrary tie)."""
    ok = measured(run)
    st = run.step_time[ok]
    thr = CLEAR_LAST * float(np.median(st)) if st.size else 0.0
    return ok & (run.straggler >= 0) & (run.straggler < run.world_size) \
        & (np.nan_to_num(run.spread) > thr)


def last_counts(run: Run) -> np.ndarray:
    """[world size]: how often each rank arrived last, over the measured steps with a clear
    last rank (`clear_last`)."""
    return np.bincount(run.straggler[clear_last(run)], minlength=run.world_size)[:run.world_size]


def late_rank(run: Run, offset: np.ndarray | None = None) -> dict[str, Any] | None:
    """The rank most often last: how often (of the measured steps with a clear last rank) and
    by how much (its median lateness behind the median rank). `persistent` when it is last
    at least halfway between chance and always: (1 + 1/N) / 2 of them, 75% at 2 ranks, just
    over half at many (twice chance, the rule before, asked 100% of 2 ranks). None when no
    step has a clear last."""
    hist = last_counts(run)
    if not hist.any():
        return None
    r = int(np.argmax(hist))
    frac = float(hist[r] / hist.sum())
    if offset is None:
        offset = locality_offsets(run, measured(run))[0]
    behind = float(offset[r]) if r < offset.size else float("nan")
    return {"rank": r, "last_fraction": frac, "last_steps": int(hist[r]),
            "steps_with_clear_last": int(hist.sum()), "behind_median_us": behind,
            "persistent": bool(frac >= (1.0 + 1.0 / max(run.world_size, 1)) / 2.0)}


def last_leads(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step of the earliness [steps, N]: the last rank (lowest earliness; -1 with fewer
    than two known ranks) and its lead over the next-latest rank (us; 0 when unknown)."""
    steps, n = e.shape
    last = np.full(steps, -1, dtype=np.int64)
    lead = np.zeros(steps)
    if n < 2:
        return last, lead
    block = max(1, BLOCK_VALUES // n)
    for lo in range(0, steps, block):
        x = np.where(np.isfinite(e[lo:lo + block]), e[lo:lo + block], np.inf)
        two = np.partition(x, 1, axis=1)[:, :2]
        gap = two[:, 1] - two[:, 0]
        known = np.isfinite(gap)
        last[lo:lo + block] = np.where(known, np.argmin(x, axis=1), -1)
        lead[lo:lo + block] = np.where(known, gap, 0.0)
    return last, lead


def cost_per_rank(run: Run) -> tuple[np.ndarray, float]:
    """([world size] us a measured step that each rank's lateness cost, the last rank's mean
    lead over the next-latest in us a step: the costs' sum). Zeros with no measured step."""
    ok = measured(run)
    n = int(ok.sum())
    if n == 0:
        return np.zeros(run.world_size), 0.0
    last, lead = last_leads(run.earliness[ok])
    known = last >= 0
    cost = np.bincount(last[known], weights=lead[known], minlength=run.world_size)
    return cost[:run.world_size] / n, float(lead.sum()) / n


def rank_costs(run: Run, top: int = TOP_RANKS) -> dict[str, Any] | None:
    """What the late ranks cost, over the measured steps: the last rank's mean lead over the
    next-latest (us a step, and as a share of the mean step), and the `top` ranks by their
    part of it, each with how often it was last (of the steps with a clear last rank, as in
    the headline). None with no measured step or fewer than two ranks."""
    ok = measured(run)
    if not ok.any() or run.world_size < 2:
        return None
    cost, total = cost_per_rank(run)
    mean_step = float(np.mean(run.step_time[ok]))
    counts = last_counts(run)
    clear = max(int(counts.sum()), 1)
    ranks = [{"rank": int(r), "cost_us_per_step": float(cost[r]),
              "share_of_step": float(cost[r]) / mean_step,
              "last_fraction": float(counts[r]) / clear}
             for r in np.argsort(-cost, kind="stable")[:top] if cost[r] > 0]
    return {"lead_us_per_step": total, "share_of_step": total / mean_step, "ranks": ranks}
