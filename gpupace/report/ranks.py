"""Who is late, rank by rank: each rank's lateness behind the median rank, its steady offset,
how often it arrived last, and what its lateness cost the job per step.

All of it from the clock-free earliness of each record (at its site of largest spread): no
timestamps are compared across ranks.
- A rank's cost is its lead as the last arrival over the next-latest rank, summed over the
  steps it was clearly last (the steps the headline counts), per measured step. Had it
  arrived with the next-latest rank, each of those steps would have ended that much sooner
  (at most: the transfer and the other sites unchanged). The ranks' costs add up to the last
  rank's mean lead, and they answer "how much does rank 3 cost" directly, where the lost time
  is against an ideal step that a noisy machine never repeats.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .load import Run

CLEAR_LAST = 0.01  # a step's last rank counts when the spread is above this x the median step
TOP_RANKS = 5  # ranks named by cost
MIN_CLEAR_STEPS = 10  # steps with a clear last rank before one can be called persistent
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
                     ) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """Per rank: steady lateness behind the median rank (median over steps, us), the fraction
    of steps it is late by at least half of that, the noise of lateness (us, robust), and the
    number of steps these come from. `rows`: a boolean mask of the steps to use (default: all).
    A rank is counted over the steps in which it is known with at least two other ranks (the
    other one, at 2 ranks), so that one rank missing from many records (an invalid row, a
    broken clock) does not hide the others' offsets; a rank never known gets 0 and 0 from 0
    steps. (With two ranks known of more, the median rank would be their mean, and an offset
    would count half.)"""
    return offsets_of(run.earliness if rows is None else run.earliness[rows])


def offsets_of(e: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """`locality_offsets` of an earliness matrix [steps, N]."""
    n = e.shape[1]
    known = np.isfinite(e)
    ok = known.sum(axis=1) >= min(n, 3)
    e, known = e[ok], known[ok]
    counted = known.sum(axis=0)
    if e.shape[0] == 0 or n < 2:
        return np.zeros(n), np.zeros(n), 0.0, counted
    late = lateness(e)
    if known.all():  # the usual case, at the cost of plain medians
        offset = np.median(late, axis=0)
        consistency = np.mean(late >= 0.5 * offset[None, :], axis=0)
        dev = np.median(np.abs(late - offset[None, :]), axis=0)
    else:
        with warnings.catch_warnings():  # a rank never known: All-NaN slice, handled below
            warnings.simplefilter("ignore", RuntimeWarning)
            offset = np.nanmedian(late, axis=0)
            dev = np.nanmedian(np.abs(late - offset[None, :]), axis=0)
        offset = np.where(counted > 0, offset, 0.0)
        consistency = np.sum(known & (late >= 0.5 * offset[None, :]), axis=0) \
            / np.maximum(counted, 1)
        dev = dev[counted > 0]
    noise = float(np.median(dev)) * 1.4826 if dev.size else 0.0
    return offset, consistency, noise, counted


def offset_floor(noise: float, steps: np.ndarray | int, median_step_us: float) -> np.ndarray:
    """The least steady offset worth naming, per rank: 5 standard errors of its median (1.25
    sigma / sqrt n, over the `steps` the rank was known in) of the lateness `noise`, and at
    least 0.2% of the median step."""
    return np.maximum(5.0 * 1.25 * noise / np.sqrt(np.maximum(steps, 1)), 0.002 * median_step_us)


def measured(run: Run) -> np.ndarray:
    """The steps every figure and count of the report uses: past the warm-up, with a step
    time (the first step has none)."""
    st = run.step_time
    return np.isfinite(st) & (st > 0) & (run.step >= run.first_measured_step)


def clear_last(run: Run) -> np.ndarray:
    """Measured steps whose last arrival is known and means something: the spread is above
    CLEAR_LAST of the median step (with no spread the 'last' rank is an arbitrary tie)."""
    ok = measured(run)
    st = run.step_time[ok]
    thr = CLEAR_LAST * float(np.median(st)) if st.size else 0.0
    return ok & (run.straggler >= 0) & (run.straggler < run.world_size) \
        & (np.nan_to_num(run.spread) > thr)


def last_counts(run: Run, clear: np.ndarray | None = None) -> np.ndarray:
    """[world size]: how often each rank arrived last, over the measured steps with a clear
    last rank (`clear`: `clear_last(run)`, when the caller has it already)."""
    clear = clear_last(run) if clear is None else clear
    return np.bincount(run.straggler[clear], minlength=run.world_size)[:run.world_size]


def late_rank(run: Run) -> dict[str, Any] | None:
    """The rank most often last: how often (of the measured steps with a clear last rank) and
    by how much (its median lateness behind the median rank over those steps in which it was
    last: a rank late in the last 40% of a run only is "3 ms behind" then, not the median over
    the whole run, which the on-time steps pull to 0). `persistent` when it is last
    at least halfway between chance and always: (1 + 1/N) / 2 of them, 75% at 2 ranks, just
    over half at many (twice chance, the rule before, asked 100% of 2 ranks), over at least
    MIN_CLEAR_STEPS of them. None when no step has a clear last."""
    clear = clear_last(run)
    hist = last_counts(run, clear)
    if not hist.any():
        return None
    r = int(np.argmax(hist))
    frac = float(hist[r] / hist.sum())
    steps = np.flatnonzero(clear & (run.straggler == r))
    block = max(1, BLOCK_VALUES // max(run.world_size, 1))
    behind = np.concatenate([lateness(run.earliness[steps[lo:lo + block]])[:, r]
                             for lo in range(0, steps.size, block)])
    behind = float(np.nanmedian(behind)) if np.isfinite(behind).any() else float("nan")
    return {"rank": r, "last_fraction": frac, "last_steps": int(hist[r]),
            "steps_with_clear_last": int(hist.sum()), "behind_median_us": behind,
            "persistent": bool(frac >= (1.0 + 1.0 / max(run.world_size, 1)) / 2.0
                               and hist.sum() >= MIN_CLEAR_STEPS)}


def last_leads(e: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per step of the earliness [steps, N] and its last rank [steps]: that rank's lead over
    the next-latest (us), the lowest earliness of the other known ranks less its own; NaN
    where either is unknown (a rank missing from the record, or whose row was invalid)."""
    rows = np.arange(e.shape[0])
    x = np.where(np.isfinite(e), e, np.inf)
    own = x[rows, last]
    x[rows, last] = np.inf
    with np.errstate(invalid="ignore"):  # inf - inf: no other known rank
        lead = x.min(axis=1) - own
    return np.where(np.isfinite(lead), lead, np.nan)


def cost_per_rank(run: Run) -> tuple[np.ndarray, float]:
    """([world size] us a measured step that each rank's lateness cost, their sum: the last
    rank's mean lead over the next-latest). Counted over the steps with a clear last rank
    (`clear_last`, the steps the headline's "last in" counts), per measured step; the steps
    without one had a spread under 1% of the median step. A step whose lead is unknown (the
    last rank, or every other one, missing from the record) counts in neither the sum nor
    the steps: as 0 it would understate every cost by the share of such steps."""
    n = int((measured(run) & np.isfinite(run.spread)).sum())
    cost = np.zeros(run.world_size)
    steps = np.flatnonzero(clear_last(run))
    block = max(1, BLOCK_VALUES // max(run.world_size, 1))
    for lo in range(0, steps.size, block):  # one block of rows copied at a time
        idx = steps[lo:lo + block]
        last = run.straggler[idx]
        lead = last_leads(run.earliness[idx], last)
        n -= int(np.isnan(lead).sum())
        lead = np.nan_to_num(lead, nan=0.0)
        cost += np.bincount(last, weights=lead, minlength=run.world_size)[:run.world_size]
    if n <= 0:
        return np.zeros(run.world_size), 0.0
    return cost / n, float(cost.sum()) / n


def rank_costs(run: Run, top: int = TOP_RANKS) -> dict[str, Any] | None:
    """What the late ranks cost, over the measured steps: the last rank's mean lead over the
    next-latest (us a step, and as a share of the mean step), and the `top` ranks by their
    part of it, each with how often it was last (of the steps with a clear last rank, the
    steps its cost is counted over). None with fewer than two ranks or no step with a clear
    last rank."""
    counts = last_counts(run)
    if run.world_size < 2 or not counts.any():
        return None
    cost, total = cost_per_rank(run)
    mean_step = float(np.mean(run.step_time[measured(run)]))
    clear = int(counts.sum())
    ranks = [{"rank": int(r), "cost_us_per_step": float(cost[r]),
              "share_of_step": float(cost[r]) / mean_step,
              "last_fraction": float(counts[r]) / clear, "last_steps": int(counts[r])}
             for r in np.argsort(-cost, kind="stable")[:top] if cost[r] > 0]
    return {"lead_us_per_step": total, "share_of_step": total / mean_step, "ranks": ranks,
            "steps_with_clear_last": clear}
