"""Failure-mode diagnosis: splits the time a run lost against an ideal step between the
study's four failure modes, each with a share, a confidence, its evidence and its ranks.

Method (clock-free telemetry only; warm-up steps left out, here and in every figure and
count of the report):
- Ideal step: the 5th percentile of step times (the fastest step the job repeats, not one
  lucky step), each step time less what a persistently late rank's steady offset added to
  it (its lead over every other rank, up to the offset), over the steps that paid it (the
  rank late by at least half of it): no percentile removes an offset that most steps pay.
  It is what a step would take without the late rank's handicap, so it can lie below every
  measured step.
- Lost time = sum over steps of max(step time - ideal, 0); the lost fraction is that over
  the total measured step time (the share of the run's time the ideal would have saved),
  so it stays between 0 and 100%. Of each step's loss, locality takes up to the step's lead
  on the steps that paid the offset, and the rest is split below.
  Assumed: a late arrival lengthens the step. Lateness that the step hides (a bucket whose
  collective overlaps compute that outlasts it) is counted as lost all the same.
- locality: each rank's lateness behind the median rank; a rank late by a steady offset in
  most steps is a locality rank, and every step loses the largest such offset.
- Late spells (`spells.late_spells`): a rank, or ranks together, with a steady offset over
  a stretch of the run, not all of it (late in turn, or from halfway on). Each spell step's
  lead is taken off the ideal as a locality rank's, and goes to sync_amplification: a delay
  on one rank that every rank waits for, with the spell's own advice (what ran there then,
  not placement).
- Each step's remaining excess over the 5th percentile is split between the arrival spread
  it saw and the transfer time, in proportion to their excesses over their own 5th
  percentiles, each weighted by what one us of it costs in step time in this run (a
  non-negative least-squares fit), and each at most twice that weighted excess (EXPLAIN_FACTOR:
  a step slowed on every rank alike, a checkpoint or a drift, is no coordination cost).
  Excess with neither, or beyond both, is left unattributed.
  - spread part: sync_amplification (random late ranks that everyone waits for), except on
    spike steps (beyond q75 + 3 IQR) where it is runtime_jitter (heavy-tailed stalls) for
    a fraction 1 - coupling index (`coupling_index`: waiting ranks visibly slowed down, so
    that part of the stall's cost is amplification).
  - transfer part: fabric_contention, except what a communication-bound regime's factor added
    (the transfer time jumps up, stays, and comes back: `_regimes`), which is runtime_jitter.
- Confidence = signature strength (late rank rotating; steady offset; transfer varying,
  correlated in time, independent of arrivals; heavy tail or regimes) x enough steps
  (sqrt(steps / 200): a signature's standard error shrinks as the square root of the steps;
  for locality, the binomial z of its rank's late steps against one half, over 5)
  x a share worth naming. Below MIN_CONFIDENCE (0.3), or under 0.5% of the time lost, the
  verdict is "not enough evidence" and the mode's time goes to "unattributed": the split
  above only says where the time would go if the mode were real (`candidate_share`), and a
  mode without its signature gets 0%.
Limits: one transfer figure per collective (the slowest link sets it for every rank), so
fabric contention cannot be tied to a node group from one job's telemetry; spread growing
with world size needs several runs (`scaling`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .advice import action, rank_names
from .load import Run
from .ranks import (
    clear_last,
    late_rank,
    lateness,
    locality_offsets,
    measured,
    offset_floor,
    rank_costs,
)
from .spells import late_spells, spell_shaped

MODES = ("sync_amplification", "locality", "fabric_contention", "runtime_jitter")
MIN_STEPS = 30  # fewer measured steps: nothing is diagnosed
# Every key a diagnosis's summary may hold, for findings.json's one schema: those a run lacks
# (too few steps to diagnose, no steadily late ranks, no late spell, no note) are null there.
SUMMARY_KEYS = ("label", "steps", "measured_steps", "warmup_steps_left_out", "world_size",
                "skipped_lines", "note", "late_rank", "late_cost", "late_group", "late_spells",
                "ideal_step_us", "p5_step_us", "median_step_us", "mean_step_us",
                "steady_offset_us", "locality_cost_us", "offset_paid_fraction", "lost_us",
                "lost_fraction", "lost_definition", "unattributed_us", "unattributed_share",
                "unexplained_us", "low_confidence_us", "attribution_threshold")
FULL_STEPS = 200  # steps for full confidence
CLEAR_Z = 5.0  # locality's late-step z for full confidence (below, instead of FULL_STEPS)
MIN_LOST = 0.005  # fraction of the measured time below which nothing is worth naming
# Attribution threshold: a mode below it is "not enough evidence" and its time is counted
# as unattributed. 0.3 is the verdict threshold ("possible"), so that every mode with a
# share names its evidence and no mode without it takes a share.
MIN_CONFIDENCE = 0.3
LIKELY = 0.6  # confidence from which a finding reads "likely" (`verdict_of`)
LOST_DEFINITION = ("lost time: per measured step, step time minus the ideal step (the "
                   "5th percentile of the step times, each less what persistently late ranks, "
                   "or the rank of a late spell, added to it: how much later than every other "
                   "rank they arrived), summed, "
                   "as a share of the total measured step time")
LOCALITY_CONSISTENCY = 0.7  # fraction of steps a locality rank must be late by half its offset
SPIKE_IQR = 3.0
# runtime_jitter's confidence where its time is mostly regimes (a transfer that jumps and
# stays), which fabric bursts look the same as: "possible" at most.
REGIME_ONLY_CONFIDENCE = 0.5
EXPLAIN_FACTOR = 2.0  # a step's spread or transfer part: at most this times its fitted cost
REGIME_Z = 6.0  # a regime switch: a one-step change of the log transfer beyond this many MADs
REGIME_MIN_RATIO = 1.5  # ... and by this factor at least
REGIME_BASE = 5  # steps outside regimes whose median is the level a regime jumps from
REGIME_MIN_LEN = 3  # steps of a regime at the least (shorter: a spike)
REGIME_FULL_SWITCHES = 5  # regimes for the signature's full strength
REGIME_LOW_FACTOR = 0.6  # a stretch under this share of the usual log factor is not a regime


@dataclass(slots=True)
class ModeFinding:
    """One failure mode's part of the lost time."""

    mode: str
    share: float  # of the run's lost time attributed to it, 0..1 (0 below MIN_CONFIDENCE)
    confidence: float  # 0..1
    evidence: dict[str, Any]
    ranks: list[int]
    verdict: str = "not enough evidence"  # "likely", "possible" or "not enough evidence"
    action: str = ""
    lost_us: float = 0.0  # attributed, total over the run
    candidate_share: float = 0.0  # what the split gave it before the confidence check


@dataclass(slots=True)
class Diagnosis:
    """A run's diagnosis: the lost-time summary and one finding per mode, by share."""

    summary: dict[str, Any]
    modes: list[ModeFinding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": _clean(self.summary), "modes": [_clean(asdict(m)) for m in self.modes]}


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf -> None, NumPy scalars -> Python, floats rounded to 6 decimals (at
    4, the terminal's 3-decimal CV of 0.67752 read 0.677 from 0.6775, the page's 0.678)."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return round(v, 6) if math.isfinite(v) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _p(a: np.ndarray, q: float) -> float:
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else 0.0


def _regimes(x: np.ndarray) -> tuple[bool, np.ndarray, dict[str, Any]]:
    """Communication-bound regimes in the transfer time. A stretch opens where the log transfer
    jumps up in one step by more than REGIME_Z robust sigmas of its step-to-step changes (their
    MAD, over consecutive known steps) and a factor REGIME_MIN_RATIO, both from the step before
    and from the level outside regimes (the median of its last REGIME_BASE steps: a return from
    a dip is no jump). Its level is the median of its first REGIME_MIN_LEN steps (an opening
    step may overshoot): not up by the threshold there, it is a spike. It closes at the first
    two steps in a row below halfway back to the level outside, and only a stretch that falls
    there in one step by half its height or more is a regime (a shock that decays, as a
    switch's load does, is not); a stretch shorter than REGIME_MIN_LEN is a spike; one that
    never comes back is a new level, from which the search goes on (unless it is the last of
    several regimes and no longer than twice the longest). Drift opens none. Switching: two
    regimes at least, high in 2% to 60% of the steps. Unknown steps carry the last known value.
    `info["step_ratio"]`: each step's factor (its regime's median over the level it jumped
    from; 1 outside). A split of the transfer into two levels (before 2026-12-01) found no
    regimes where fabric contention blurs them and filed their 1.0-1.6 ms a step on `paper`
    under fabric contention. On the simulator's presets this finds, with no step wrong but a
    handful: `jitter`'s and `paper`'s regimes at 8 nodes but those under 3 steps (2-4% of the
    steps), 67-96% of `paper`'s at 64 nodes, 30-70% of `mixed`'s (its 2x regimes sit near the
    threshold), and none on `fabric` (4 to 64 nodes), `locality` or `amplification`. Missed
    (left to fabric contention): regimes entered or left over several steps, one already on at
    the first step, regimes high in over 60% of the steps, and regimes below 6 MADs of the step
    changes (a noisy transfer, as on the demo's gloo runs, where that is a 20-50x jump), and
    any in a file where under half the consecutive steps are both known (one step in 2 or 3
    recorded). Of three regimes or more, one far below the others' factor (under 0.6 of their
    median log factor) is taken for a burst of contention."""
    info: dict[str, Any] = {"separation": 0.0, "high_fraction": 0.0, "level_ratio": 1.0,
                            "switches": 0, "step_ratio": np.ones(x.size)}
    good = np.isfinite(x) & (x > 0)
    none = (False, np.zeros(x.size, dtype=bool), info)
    if good.sum() < MIN_STEPS:
        return none
    last = np.where(good, np.arange(x.size), 0)
    np.maximum.accumulate(last, out=last)
    last[:int(np.argmax(good))] = int(np.argmax(good))  # before the first known: the first
    lx = np.log(x[last])
    d = np.diff(lx)
    known = d[good[1:] & good[:-1]]  # a carried step changes by 0 and would shrink the MAD
    if known.size < MIN_STEPS // 2:
        return none
    mad = 1.4826 * float(np.median(np.abs(known - np.median(known))))
    thr = max(REGIME_Z * mad, math.log(REGIME_MIN_RATIO))
    n = x.size
    stretches: list[tuple[int, int, float]] = []  # (first, end, log factor)
    level_from, high_until, open_end = 0, 0, None
    span_from = -1  # where the last regime or faded shock began
    for i in np.flatnonzero(d > thr) + 1:  # the one-step jumps up, in order
        if i < max(high_until, level_from):
            continue  # inside the last stretch
        low = lx[max(high_until, level_from, i - REGIME_BASE):i]
        if low.size < REGIME_BASE and span_from > level_from:
            # and before the last regime or shock, on this level (not its tail)
            low = np.concatenate([lx[max(level_from, span_from - REGIME_BASE + low.size):
                                     span_from], low])
        base = float(np.median(low))
        if lx[i] - base <= thr:
            continue  # back from a dip, not up from the level
        top = float(np.median(lx[i:i + REGIME_MIN_LEN]))  # the stretch's level
        if top - base <= thr:
            continue  # did not stay up: a spike
        back = base + 0.5 * (top - base)
        below = lx[i + 1:] <= back
        closing = below.copy()
        closing[:-1] &= below[1:]  # two in a row (the last step alone)
        k = np.flatnonzero(closing)
        if k.size == 0:  # never came back: a new level, or a regime the run ended in, if
            # it still holds at the end (a shock the run ends in fades)
            held = np.median(lx[-REGIME_MIN_LEN:]) >= top - 0.25 * (top - base)
            open_end = (int(i), n, float(np.median(lx[i:])) - base) if held else None
            level_from = int(i)
            continue
        j = int(i + 1 + k[0])
        span_from = int(i)
        if lx[j - 1] - lx[j] < 0.5 * (top - base):
            high_until = j  # it faded rather than switched off: a shock, not a regime
            continue
        if j - i >= REGIME_MIN_LEN:
            stretches.append((int(i), j, float(np.median(lx[i:j])) - base))
            high_until, open_end = j, None
    if open_end is not None and len(stretches) >= 2 and \
            open_end[1] - open_end[0] <= 2 * max(b - a for a, b, _ in stretches):
        stretches.append(open_end)
    if len(stretches) >= 3:  # a stretch far below the others' factor: a burst of contention
        usual = float(np.median([r for _, _, r in stretches]))
        stretches = [st for st in stretches if st[2] >= REGIME_LOW_FACTOR * usual]
    hi = np.zeros(n, dtype=bool)
    ratio = np.ones(n)
    for a, b, r in stretches:
        hi[a:b] = True
        ratio[a:b] = math.exp(max(r, 0.0))
    frac = float(hi.mean())
    if len(stretches) < 2 or not 0.02 <= frac <= 0.6:
        return none
    jump = float(np.median([r for _, _, r in stretches]))
    return True, hi, {"separation": min(jump / mad, 1e3) if mad > 0 else 1e3,
                      "high_fraction": frac, "level_ratio": math.exp(jump),
                      "switches": len(stretches), "step_ratio": ratio}


def coupling_index(run: Run, rows: np.ndarray | None = None) -> float:
    """How much the arrival spread shrinks from the first site to the later ones, 0..1:
    1 - (median spread over the later half of the sites) / (median spread at the first).
    Without coupling a late rank stays late through the step (noise even widens the spread);
    when waiting slows a rank's overlapped compute (NCCL kernels spinning on SMs), the early
    ranks fall back and the spread shrinks. 0 with fewer than 3 sites (no evidence).
    `rows`: a boolean mask of the steps to use (default: all)."""
    ss = run.site_spread if rows is None else run.site_spread[rows]
    if ss.shape[1] < 3:
        return 0.0
    med = np.nanmedian(ss, axis=0)
    if not np.isfinite(med[0]) or med[0] <= 0:
        return 0.0
    later = float(np.nanmedian(med[ss.shape[1] // 2:]))
    return float(np.clip(1.0 - later / med[0], 0.0, 1.0))


def follows(run: Run) -> np.ndarray:
    """Per record: whether the record before it is the step before it. Not so after a gap:
    a file written one step in `telemetry_every`, or records the writer dropped."""
    out = np.zeros(run.steps, dtype=bool)
    out[1:] = np.diff(run.step) == 1
    return out


def aligned_spread(run: Run) -> np.ndarray:
    """The arrival spread each step time saw. A step time is the exit-to-exit interval of the
    first site, so step k's window holds sites 1.. of step k-1 and site 0 of step k; a late
    arrival there is what lengthens it. Where step k-1 was not recorded, or the records have
    no per-site spreads, the step's own largest spread stands for it."""
    ss = run.site_spread
    spread = np.nan_to_num(run.spread, nan=0.0)
    if ss.shape[1] == 0 or not np.isfinite(ss).any():
        return spread
    ss = np.nan_to_num(ss, nan=0.0)
    out = ss[:, 0].copy()
    if ss.shape[1] > 1:
        prev = follows(run)
        out[1:] = np.maximum(out[1:], ss[:-1, 1:].max(axis=1))
        out[~prev] = spread[~prev]
    return out


def aligned_transfer(run: Run) -> np.ndarray:
    """The transfer time each step time saw: the mean of this step's and the previous one's
    (only one transfer figure per step is recorded, at its site of largest spread); the
    step's own where the previous step was not recorded."""
    x = run.transfer.astype(np.float64)
    fill = float(np.nanmedian(x)) if np.isfinite(x).any() else 0.0
    x = np.where(np.isfinite(x), x, fill)
    out = x.copy()
    out[1:] = np.where(follows(run)[1:], 0.5 * (x[1:] + x[:-1]), x[1:])
    return out


def _nnls2(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Non-negative least squares y ~ alpha a + beta b (no intercept): how many us of step
    time one us of spread and of transfer excess cost (a transfer on every bucket of a
    communication-bound step costs several times its one recorded figure)."""
    def one(x: np.ndarray) -> float:
        d = float(x @ x)
        return max(0.0, float(x @ y) / d) if d > 0 else 0.0
    m = np.stack([a, b], axis=1)
    try:
        coef = np.linalg.lstsq(m, y, rcond=None)[0]
    except np.linalg.LinAlgError:
        coef = np.array([-1.0, -1.0])
    if coef[0] >= 0 and coef[1] >= 0:
        alpha, beta = float(coef[0]), float(coef[1])
    else:
        fa, fb = one(a), one(b)
        ra, rb = np.sum((y - fa * a) ** 2), np.sum((y - fb * b) ** 2)
        alpha, beta = (fa, 0.0) if ra <= rb else (0.0, fb)
    if alpha == 0.0 and beta == 0.0:  # nothing fits: weigh the two excesses as they are
        return 1.0, 1.0
    return alpha, beta


def _entropy(counts: np.ndarray) -> float:
    """Normalised entropy of a histogram: 1 when every rank is equally often late."""
    c = counts[counts > 0].astype(np.float64)
    if c.size < 2:
        return 0.0
    p = c / c.sum()
    return float(-(p * np.log(p)).sum() / math.log(min(counts.size, int(counts.sum()))))


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 3 or np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def diagnose(run: Run) -> Diagnosis:
    """The diagnosis of one run. Never raises on odd data: too little of it gives
    "not enough evidence" everywhere, with the reason in the summary."""
    with warnings.catch_warnings():  # all-NaN slices (ranks missing from a record) are fine
        warnings.simplefilter("ignore", RuntimeWarning)
        return _diagnose(run)


def _unmeasured(run: Run) -> str:
    """Why the steps read are not measured: how many were warm-up, how many had no step time
    (the first has none: its step time is the interval from the step before)."""
    warm = int((run.step < run.first_measured_step).sum())
    timed = np.isfinite(run.step_time) & (run.step_time > 0)
    untimed = int((~timed & (run.step >= run.first_measured_step)).sum())
    return (f"of {run.steps} steps read, {warm} were warm-up (steps before "
            f"{run.first_measured_step}) and {untimed} more had no step time above 0")


def _diagnose(run: Run) -> Diagnosis:
    st_all = run.step_time
    ok = measured(run)
    n = int(ok.sum())
    first = int(run.step[0]) if run.steps else 0
    summary: dict[str, Any] = {"label": run.label, "steps": run.steps, "measured_steps": n,
                               # steps, not a step number: 5 after a restart at step 100
                               "warmup_steps_left_out": max(0, run.first_measured_step - first),
                               "world_size": run.world_size, "skipped_lines": len(run.skipped)}
    if n < MIN_STEPS:
        summary["note"] = (f"only {n} measured steps (need {MIN_STEPS}): not enough evidence "
                           f"({_unmeasured(run)})")
        every = run.header.get("telemetry_every") or 1
        if isinstance(every, int) and every > 1:  # 4096 ranks: one step in 64 by default
            summary["note"] += (f" (the file holds one step in {every}, telemetry_every: "
                                f"run {every * MIN_STEPS} steps past the warm-up, or set "
                                "PaceConfig(telemetry_every=...) lower)")
        return Diagnosis(summary, [ModeFinding(m, 0.0, 0.0, {}, [],
                                               action=action(m, [], run.comm_backend))
                                   for m in MODES])
    st = st_all[ok]
    spread_raw, xfer_raw = aligned_spread(run), aligned_transfer(run)
    spread = spread_raw[ok]
    xfer = xfer_raw[ok]
    strag = run.straggler[ok]

    # -- locality: steady offsets
    past_warmup = run.step >= run.first_measured_step
    offset, consistency, noise, loc_steps = locality_offsets(run, past_warmup)
    p50 = float(np.median(st))
    floor = offset_floor(noise, loc_steps, p50)
    loc_mask = (offset > floor) & (consistency >= LOCALITY_CONSISTENCY)
    loc_ranks = [int(r) for r in np.argsort(-offset) if loc_mask[r]]
    # A rank late in 70% of the steps from step 110 of 400 on is a late spell, not placement
    spelled = spell_shaped(run, loc_ranks, offset)
    loc_ranks = [r for r in loc_ranks if r not in spelled]
    loc_us = float(offset[loc_ranks[0]]) if loc_ranks else 0.0

    summary["late_rank"] = late_rank(run)
    summary["late_cost"] = rank_costs(run)

    # -- ideal and lost time. The steps that paid the steady offset: those in which the
    # locality rank was late by at least half of it (all steps when there is none). What the
    # offset cost such a step: not the offset behind the median rank, but how much later than
    # every other rank the locality ranks' last one arrived, up to the offset (without it the
    # step would have ended at the latest other rank): its `lead`. The ideal step is the 5th
    # percentile of the step times less their lead, step by step, over the paying steps: a
    # lead taken off a percentile of the step times as one number (before) went below 0 where
    # the lead varied and was most of the step (a 2-rank demo: ideal 0 ms, 100% lost).
    paying = np.ones(n, dtype=bool)
    offset_us, loc_us = loc_us, 0.0
    lead = np.zeros(n)  # the locality ranks' lead over every other rank, on the paying steps
    behind_us = offset_us  # the top locality rank's lateness behind the other ranks' median
    if loc_ranks:
        late_all = lateness(run.earliness[ok])
        late0 = late_all[:, loc_ranks[0]]
        paying = np.isfinite(late0) & (late0 >= 0.5 * offset_us)
        if paying.sum() < MIN_STEPS:  # too few to take a percentile over: every step
            paying = np.ones(n, dtype=bool)
        others = np.delete(late_all, loc_ranks, axis=1)
        if others.shape[1]:
            # Behind the median of the other ranks, not of all: with half the ranks late
            # (one slow node of two) the median rank lies halfway, and a 3 ms offset read 1.5.
            behind_us = _p(late0 - np.nanmedian(others, axis=1), 50)
            ahead = np.nanmax(late_all[:, loc_ranks], axis=1) - np.nanmax(others, axis=1)
            # up to the steady offset (a spike on top of it is not locality's); a lead longer
            # than its step cannot be; 0 where unknown
            lead = np.where(paying, np.minimum(np.nan_to_num(np.clip(ahead, 0.0, behind_us)),
                                               st), 0.0)
            loc_us = _p(lead[paying], 50)
    # Late spells: a rank late for a stretch of the run (not all of it: a locality rank is
    # not looked at). Every step of a spell pays its rank's lead, so the 5th percentile of
    # the step times holds it too when the spells cover most of the run (one rank after
    # another): it is taken off step by step, as the locality ranks' lead.
    spells, spell_lead = late_spells(run, loc_ranks)
    spell_lead = np.minimum(spell_lead, st)
    p5 = _p(st[paying], 5)
    ideal = _p((st - lead - spell_lead)[paying], 5)
    if loc_ranks:
        # The headline and the cost line name the steadily late ranks together: a late node
        # of 8 ranks has no single rank last in most steps, nor one with a lead over the
        # next-latest (another of the 8), yet together they cost each step their lead.
        summary["late_group"] = {
            "ranks": loc_ranks, "behind_others_us": behind_us,
            "late_fraction": float(consistency[loc_ranks[0]]),
            "paid_fraction": float(paying.mean()), "lead_us": loc_us,
            # the steps in which they arrived after every other rank, and by how much then
            # (`lead_us` is the median over the paying steps, 0 where another was last)
            "last_fraction": float((lead > 0).mean()),
            "last_lead_us": float(np.median(lead[lead > 0])) if (lead > 0).any() else 0.0,
            "cost_us_per_step": float(lead.mean()),
            "share_of_step": float(lead.sum() / st.sum()) if st.sum() > 0 else 0.0}
    if spells:
        step_no = run.step[ok]
        spans = [(step_no >= sp["first_step"]) & (step_no <= sp["last_step"]) for sp in spells]
        weight = np.array([sp["cost_us_per_step"] * sp["steps"] for sp in spells])
        behind = np.array([sp["behind_us"] for sp in spells])
        order = np.argsort(behind)  # "typically": the median weighed by what each spell cost
        cum = np.cumsum(weight[order])
        typical = float(behind[order][np.searchsorted(cum, 0.5 * cum[-1])]) if cum[-1] > 0 \
            else float(np.median(behind))
        summary["late_spells"] = {
            "spells": spells, "ranks": sorted({r for sp in spells for r in sp["ranks"]}),
            "steps_fraction": float(np.logical_or.reduce(spans).mean()),
            "overlapping": bool((np.sum(spans, axis=0) > 1).any()),
            "behind_us": typical,
            # each spell's cost over the steps its ranks were known in, for all its steps
            "cost_us_per_step": float(weight.sum() / n),
            "share_of_step": float(weight.sum() / st.sum()) if st.sum() > 0 else 0.0}
    lost_step = np.maximum(st - ideal, 0.0)
    loc_part = np.minimum(lost_step, lead)
    # Only a step's last rank leads every other, so a step pays a locality lead or a spell's.
    spell_part = np.minimum(lost_step - loc_part, spell_lead)
    excess = lost_step - loc_part - spell_part  # what the spread and the transfer split
    lost_total = float(lost_step.sum())
    measured_total = float(st.sum())
    summary.update(ideal_step_us=ideal, p5_step_us=p5, median_step_us=p50,
                   mean_step_us=measured_total / n, steady_offset_us=offset_us,
                   locality_cost_us=loc_us,
                   offset_paid_fraction=float(paying.mean()), lost_us=lost_total,
                   lost_fraction=lost_total / measured_total if measured_total > 0 else 0.0,
                   lost_definition=LOST_DEFINITION)

    # -- split each step's excess between the spread and the transfer
    a = np.maximum(spread - _p(spread, 5), 0.0)
    b = np.maximum(xfer - _p(xfer, 5), 0.0)
    alpha, beta = _nnls2(a, b, excess)
    a_w, b_w = alpha * a, beta * b
    ab = a_w + b_w
    with np.errstate(invalid="ignore", divide="ignore"):
        spread_part = np.where(ab > 0, excess * a_w / ab, 0.0)
        xfer_part = np.where(ab > 0, excess * b_w / ab, 0.0)
    # Each part at most EXPLAIN_FACTOR times what the fit says its excess costs: a step slowed
    # on every rank alike (a checkpoint, a drift) has a spread a little above its 5th
    # percentile, and the split in proportion alone gave that spread all of the step's excess.
    spread_part = np.minimum(spread_part, EXPLAIN_FACTOR * a_w)
    xfer_part = np.minimum(xfer_part, EXPLAIN_FACTOR * b_w)
    unexplained = float((excess - spread_part - xfer_part).sum())

    q25, q75 = np.percentile(excess, [25, 75])
    spike_thr = max(q75 + SPIKE_IQR * (q75 - q25), 0.01 * p50)
    spike = excess > spike_thr
    body = ~spike

    # Regimes are found on the recorded transfer; a step time whose window touches a high
    # step gets what the regime's factor added to its transfer.
    regime, hi_measured, reg_info = _regimes(run.transfer[past_warmup])
    hi_raw = np.zeros(run.steps, dtype=bool)
    hi_raw[past_warmup] = hi_measured
    hi_raw &= np.isfinite(run.transfer)
    ratio_raw = np.ones(run.steps)
    ratio_raw[past_warmup] = reg_info["step_ratio"]
    ratio_raw[~hi_raw] = 1.0
    hi, ratio = hi_raw.copy(), ratio_raw.copy()
    prev = follows(run)[1:]
    hi[1:] |= hi_raw[:-1] & prev
    ratio[1:] = np.maximum(ratio[1:], np.where(prev, ratio_raw[:-1], 1.0))
    hi, ratio = hi[ok], ratio[ok]
    if regime:
        # what each high step's regime factor added to its transfer (the level drifts: one
        # gap in us for all of them over-counted the steps of low contention, under-counted
        # the others; one factor for all, the regimes of other factors)
        jump = np.where(hi, np.minimum(xfer * (1.0 - 1.0 / ratio), b), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            jit_frac = np.where(b > 0, jump / b, 0.0)
    else:
        jit_frac = np.zeros(n)

    coupling = coupling_index(run, past_warmup)
    spike_loss = float(spread_part[spike].sum())
    lost = {
        "locality": float(loc_part.sum()),
        "sync_amplification": float(spread_part[body].sum()) + coupling * spike_loss
        + float(spell_part.sum()),
        "runtime_jitter": (1.0 - coupling) * spike_loss + float((xfer_part * jit_frac).sum()),
        "fabric_contention": float((xfer_part * (1.0 - jit_frac)).sum()),
    }
    size = min(1.0, math.sqrt(n / FULL_STEPS))

    # -- signatures and evidence
    late_steps = body & (a > 0) & clear_last(run)[ok]  # the steps the headline counts
    hist_body = np.bincount(strag[late_steps & (strag >= 0)], minlength=run.world_size)
    rotation = _entropy(hist_body)
    top_share = float(hist_body.max() / hist_body.sum()) if hist_body.sum() else 0.0
    # The most often late ranks, leaving out locality ranks (late for another reason).
    amp_ranks = [int(r) for r in np.argsort(-hist_body) if hist_body[r] > 0
                 and r not in loc_ranks][:5]
    amp_sig = rotation * (1.0 - max(0.0, top_share - 0.5))
    amp_ev = {"late_rank_rotation": rotation, "top_late_rank_fraction": top_share,
              "coupling_index": coupling, "spike_loss_shared_us": coupling * spike_loss,
              "steps_with_spread_excess": int(late_steps.sum()),
              # the spread each step time saw (`aligned_spread`), not the summary's spread
              "aligned_spread_p50_us": _p(spread, 50), "aligned_spread_p99_us": _p(spread, 99),
              "aligned_spread_over_step_p50": _p(spread, 50) / p50}
    amp_strength = amp_sig * size
    if spells:
        # A spell's evidence is locality's, over the spell: how often its ranks were late by
        # half its offset and how far that stands from a coin's half (a binomial z, full at
        # CLEAR_Z). Weighed with the rotation's by the lost time each explains.
        spell_strength = sum(sp["late_fraction"] * min(1.0, (2.0 * sp["late_fraction"] - 1.0)
                                                      * math.sqrt(sp["steps"]) / CLEAR_Z)
                             * sp["steps"] for sp in spells) / sum(sp["steps"] for sp in spells)
        spell_lost = float(spell_part.sum())
        if lost["sync_amplification"] > 0:
            amp_strength = (spell_lost * spell_strength + (lost["sync_amplification"]
                            - spell_lost) * amp_strength) / lost["sync_amplification"]
        by_cost = sorted(spells, key=lambda sp: -sp["cost_us_per_step"] * sp["steps"])
        amp_ranks = list(dict.fromkeys([r for sp in by_cost for r in sp["ranks"]]
                                       + amp_ranks))[:8]
        amp_ev.update(late_spells=len(spells), spell_steps_fraction=summary["late_spells"][
            "steps_fraction"], spell_cost_us_per_step=summary["late_spells"]["cost_us_per_step"],
            spell_behind_us={f"{rank_names(sp['ranks'])} steps {sp['first_step']}-{sp['last_step']}":
                             sp["behind_us"] for sp in by_cost[:8]})

    loc_sig = float(max(consistency[loc_ranks])) if loc_ranks else 0.0
    if loc_ranks:
        loc_sig *= min(1.0, offset[loc_ranks[0]] / (3.0 * floor[loc_ranks[0]]))
    # Enough steps for locality: how far the top rank's share of late steps stands from the
    # half that a rank with no offset gets (a binomial z). A rank late in 30 of 30 steps is
    # as clear as one late in 70% of 150; sqrt(steps / 200) called the first "possible".
    # Over the steps the top rank's offset came from: past the warm-up, the rank known.
    loc_z = (2.0 * float(consistency[loc_ranks[0]]) - 1.0) * math.sqrt(loc_steps[loc_ranks[0]]) \
        if loc_ranks else 0.0
    loc_ev = {"offset_us": {str(r): float(offset[r]) for r in loc_ranks[:16]},
              "late_in_fraction_of_steps": {str(r): float(consistency[r]) for r in loc_ranks[:16]},
              "lateness_noise_us": noise, "locality_ranks": len(loc_ranks),
              "late_steps_z": loc_z}
    g = run.gpus_per_node
    if g and loc_ranks:  # the same local GPUs in every node point at the node's layout
        loc_ev["local_gpus"] = sorted({r % g for r in loc_ranks})
        loc_ev["nodes_with_late_gpus"] = len({r // g for r in loc_ranks})
        loc_ev["nodes"] = -(-run.world_size // g)
        # Every GPU of a node late, and no other: the host, not a GPU's placement
        nodes = whole_nodes(loc_ranks, g, run.world_size)
        if nodes:
            loc_ev["late_nodes"] = nodes
            summary["late_group"]["nodes"] = nodes

    # Variability and lag-1 autocorrelation of the transfer as recorded, over pairs of
    # consecutive measured records (one step apart, or k where the writer kept one step in k:
    # from 128 ranks on, by default, where pairs one step apart never occur): the aligned
    # series is a two-step mean, which alone gives independent noise an autocorrelation of 0.5.
    raw = run.transfer[ok]
    raw_ok = np.isfinite(raw)
    xcv = float(np.std(raw[raw_ok]) / np.mean(raw[raw_ok])) \
        if raw_ok.sum() > 1 and np.mean(raw[raw_ok]) > 0 else 0.0
    pair = (np.diff(run.step[ok]) == run.record_gap) & raw_ok[1:] & raw_ok[:-1]
    xac = _corr(raw[:-1][pair], raw[1:][pair])
    calm = 1.0 - max(0.0, _corr(xfer, spread))
    fab_sig = min(1.0, xcv / 0.05) * max(0.0, xac) * calm
    fab_ev = {"transfer_cv": xcv, "transfer_lag1_autocorrelation": xac,
              "transfer_spread_correlation": _corr(xfer, spread),
              "transfer_p5_us": _p(xfer, 5), "transfer_p99_us": _p(xfer, 99),
              "node_group_correlation": None,
              "node_group_note": "transfer time is one number per collective in the telemetry; "
              "no per-node figure to correlate"}

    tail = (_p(st, 99) - p50) / max(q75 - q25, 1e-9 * p50, 1e-9)
    spike_share = (1.0 - coupling) * spike_loss / lost["runtime_jitter"] \
        if lost["runtime_jitter"] > 0 else 0.0
    jit_sig = max(min(1.0, max(0.0, tail - 3.0) / 6.0) if spike.any() else 0.0,
                  min(1.0, reg_info["switches"] / REGIME_FULL_SWITCHES) if regime else 0.0)
    jit_hist = np.bincount(strag[spike & (a > 0) & (strag >= 0)], minlength=run.world_size)
    jit_ranks = [int(r) for r in np.argsort(-jit_hist)[:5] if jit_hist[r] > 0]
    # As a step time: the ideal + the threshold on the excess, + the step's lead on the steps
    # that paid a steady offset (here its typical one, loc_us; 0 without one).
    jit_ev = {"spike_steps": int(spike.sum()),
              "spike_threshold_us": float(ideal + loc_us + spike_thr),
              "step_p99_over_p50": _p(st, 99) / p50, "tail_ratio_p99_iqr": tail,
              "step_max_us": float(st.max()), "regime_switching": regime,
              "regime_high_fraction": reg_info["high_fraction"],
              "regime_level_ratio": reg_info["level_ratio"],
              "regime_switches": reg_info["switches"],
              "regime_separation": reg_info["separation"],
              "spike_part_of_jitter": spike_share}

    sigs = {"sync_amplification": (amp_strength, 1.0, amp_ev, amp_ranks),
            "locality": (loc_sig, min(1.0, loc_z / CLEAR_Z), loc_ev, loc_ranks),
            "fabric_contention": (fab_sig, size, fab_ev, []),
            "runtime_jitter": (jit_sig, size, jit_ev, jit_ranks)}
    worth = summary["lost_fraction"] >= MIN_LOST
    if not worth:
        summary["note"] = (f"lost {100 * summary['lost_fraction']:.2f}% of the measured time "
                           f"(< {100 * MIN_LOST:.1f}%): nothing worth diagnosing")
    findings = []
    low_confidence = 0.0
    # The steps in which pacing delayed some rank (engaged pacing may delay none of them).
    delayed = float((np.nan_to_num(run.delay[ok]) > 0).any(axis=1).mean()) \
        if run.delay.shape[1] else 0.0
    for mode in MODES:
        sig, enough, ev, ranks = sigs[mode]
        candidate = lost[mode] / lost_total if lost_total > 0 else 0.0
        ev = dict(ev, candidate_lost_us_per_step=lost[mode] / n)
        conf = float(np.clip(sig, 0, 1) * enough * min(1.0, candidate / 0.1)) if worth else 0.0
        act = action(mode, ranks, run.comm_backend, nodes=ev.get("late_nodes", []))
        if mode == "runtime_jitter" and regime and spike_share < 0.5:
            # Its time is the regimes' more than the spikes': a transfer time that jumps up,
            # stays and comes back, which one transfer figure a collective cannot tell from
            # bursts of contention on the fabric. Possible at most, and both named.
            conf = min(conf, REGIME_ONLY_CONFIDENCE)
            act += ("; or contention that comes and goes on the fabric (other jobs' traffic "
                    "on shared links), which the telemetry cannot tell from a runtime's regimes")
            ev["regimes_or_fabric_bursts"] = True
        verdict = verdict_of(conf)
        attributed = lost[mode] if verdict != "not enough evidence" else 0.0
        if not attributed:  # the time stays unattributed: no evidence, no share
            low_confidence += lost[mode]
        if mode == "sync_amplification" and spells and spell_lost >= 0.5 * lost[mode]:
            act = action("late_spells", list(dict.fromkeys(r for sp in by_cost
                                                           for r in sp["ranks"])),
                         run.comm_backend)
        if mode == "sync_amplification" and delayed > 0.1:
            act = (f"pacing delayed ranks in {100 * delayed:.0f}% of the steps: this is what it "
                   "left; compare with an unpaced baseline, and tune threshold_us and gain")
        share = attributed / lost_total if lost_total > 0 else 0.0
        findings.append(ModeFinding(mode, share, conf, ev, ranks, verdict, act, attributed,
                                    candidate))
    unattributed = unexplained + low_confidence
    summary.update(unattributed_us=unattributed,
                   unattributed_share=unattributed / lost_total if lost_total > 0 else 0.0,
                   unexplained_us=unexplained, low_confidence_us=low_confidence,
                   attribution_threshold=MIN_CONFIDENCE)
    findings.sort(key=lambda f: (-f.share, -f.candidate_share, MODES.index(f.mode)))
    return Diagnosis(summary, findings)


def verdict_of(confidence: float) -> str:
    """A finding's word for its confidence: "likely" from LIKELY on, "possible" from
    MIN_CONFIDENCE, else "not enough evidence" (its time then stays unattributed)."""
    return ("likely" if confidence >= LIKELY else "possible" if confidence >= MIN_CONFIDENCE
            else "not enough evidence")


def whole_nodes(ranks: list[int], gpus_per_node: int, world_size: int) -> list[int]:
    """The nodes all of whose ranks are in `ranks`, when `ranks` is just those nodes' ranks
    (else none): a late node, not late GPUs in some nodes."""
    late = set(ranks)
    nodes = sorted({r // gpus_per_node for r in late})
    members = {r for n in nodes for r in range(n * gpus_per_node,
                                                min((n + 1) * gpus_per_node, world_size))}
    return nodes if members == late and len(nodes) < -(-world_size // gpus_per_node) else []


def scaling(runs: list[Run], diags: list[Diagnosis]) -> dict[str, Any] | None:
    """Across runs of different world sizes: the median arrival spread at each size and
    whether it grows with the size (amplification's signature: the more ranks, the likelier
    one is late on any step). None with fewer than two distinct sizes."""
    rows = []
    for run, d in zip(runs, diags, strict=True):
        ok = measured(run)
        sp, st = aligned_spread(run)[ok], run.step_time[ok]
        if sp.size == 0 or st.size == 0:
            continue
        amp = next((m.share for m in d.modes if m.mode == "sync_amplification"), 0.0)
        rows.append({"label": run.label, "world_size": run.world_size,
                     "spread_p50_us": _p(sp, 50), "spread_over_step_p50":
                     _p(sp, 50) / float(np.median(st)), "sync_amplification_share": amp})
    sizes = sorted({r["world_size"] for r in rows})
    if len(sizes) < 2:
        return None
    rows.sort(key=lambda r: (r["world_size"], r["label"]))
    if len({_job(run) for run in runs}) > 1:  # the demo's 2 ranks, a real job's 16: no trend
        return {"rows": rows, "spread_grows_with_world_size": None,
                "note": "runs of different jobs: their spreads are listed, no trend is read "
                        "across them"}
    by = [np.median([r["spread_p50_us"] for r in rows if r["world_size"] == w]) for w in sizes]
    grows = bool(all(b > a for a, b in zip(by[:-1], by[1:], strict=True)))
    return {"rows": rows, "spread_grows_with_world_size": grows}


def _job(run: Run) -> tuple:
    """What runs of one job at several world sizes share: `compare.job_key` (the samples a
    step, which grow with the ranks, left out) and a simulated run's preset."""
    from .compare import job_key

    sim = run.header.get("sim")
    return job_key(run), sim.get("preset") if isinstance(sim, dict) else None
