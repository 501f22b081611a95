"""The report's plots, as PNG files (matplotlib, Agg backend: no display needed).

Each function draws one figure for one or several runs and returns its file name.
Distributions and counts (CDF, heatmap, straggler histogram, lost time) cover the measured
steps only, as the summary and the diagnosis do: the warm-up is left out. The time series
(step time, spread, pacing) show it, left of a dashed line. Long runs are reduced to at most
`MAX_POINTS` bins (median line, min-max band) so that a million steps plot as fast as a
thousand and the picture still shows the spikes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .compare import pairs
from .diagnose import MIN_CONFIDENCE, MODES, Diagnosis
from .load import Run
from .ranks import cost_per_rank, last_counts, lateness, measured

MAX_POINTS = 1500
MAX_HEAT_STEPS = 600
MAX_HEAT_RANKS = 256
MAX_BARS = 64  # ranks up to which the straggler histogram draws bars; past it, outlines
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
MODE_COLORS = {"sync_amplification": "#d62728", "locality": "#1f77b4",
               "fabric_contention": "#ff7f0e", "runtime_jitter": "#9467bd",
               "unattributed": "#bbbbbb"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    _plt().close(fig)
    return name


def _binned(x: np.ndarray, y: np.ndarray, n: int = MAX_POINTS):
    """(x, median, min, max) per bin; the raw points when there are at most n."""
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if y.size <= n:
        return x, y, y, y
    edges = np.linspace(0, y.size, n + 1).astype(int)
    xs, med, lo, hi = [], [], [], []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if b > a:
            xs.append(x[a:b].mean())
            seg = y[a:b]
            med.append(np.median(seg))
            lo.append(seg.min())
            hi.append(seg.max())
    return np.array(xs), np.array(med), np.array(lo), np.array(hi)


def _ylim(ax: Any, steady: list[np.ndarray], every: list[np.ndarray]) -> int:
    """Caps the y axis at 1.3 x the 99.5th percentile of the steady (after warm-up) points,
    so one huge outlier (a first step, a checkpoint) does not flatten the rest; returns how
    many of all the points lie above."""
    def cat(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.array([])

    v, allv = cat(steady), cat(every)
    if v.size == 0 or allv.size == 0:
        return 0
    top = float(np.percentile(v, 99.5)) * 1.3
    if top > 0 and allv.max() > top:
        ax.set_ylim(bottom=min(0.0, float(allv.min())), top=top)
        return int((allv > top).sum())
    lo, hi = float(allv.min()), float(allv.max())
    if hi - lo < 0.01 * max(abs(hi), 1e-3):  # flat: float noise drawn as steps of 1e-11 ms
        mid = 0.5 * (lo + hi)
        half = 0.05 * max(abs(mid), 1e-3)
        ax.set_ylim(mid - half, mid + half)
    return 0


def _series(runs: Sequence[Run], out: Path, name: str, title: str, ylabel: str,
            get: Any, extra: Any = None) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    shown, every = [], []
    for i, run in enumerate(runs):
        y = get(run) / 1e3
        x, med, lo, hi = _binned(run.step.astype(float), y)
        c = COLORS[i % len(COLORS)]
        ax.plot(x, med, lw=0.9, color=c, label=run.label)
        if med is not lo:
            ax.fill_between(x, lo, hi, color=c, alpha=0.2, lw=0)
        if run.first_measured_step:
            ax.axvline(run.first_measured_step, color=c, ls="--", lw=0.8, alpha=0.7)
        if extra is not None:
            extra(ax, run, c)
        shown.append(hi[x >= run.first_measured_step])  # warm-up outliers may leave the axis
        every.append(hi)
    above = _ylim(ax, shown, every)
    ax.ticklabel_format(axis="y", useOffset=False)  # a flat series read 1e-10 + 9.8878e1
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f"  ({above} point{'s' if above > 1 else ''} above the axis)"
                          if above else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, out, name)


def step_time(runs: Sequence[Run], out: Path) -> str:
    """Step time over the run, one line per run."""
    return _series(runs, out, "step_time.png", "Step time" + _dashed(runs),
                   "step time (ms)", lambda r: r.step_time)


def _dashed(runs: Sequence[Run]) -> str:
    """The title's word on the dashed line, where a run has one (a warm-up left out)."""
    return " (dashed: first measured step)" if any(r.first_measured_step for r in runs) else ""


def spread(runs: Sequence[Run], out: Path) -> str:
    """Arrival spread (solid) and the entry spread left after pacing (dotted)."""
    def residual(ax: Any, run: Run, c: str) -> None:
        if run.active.any():
            x, med, _, _ = _binned(run.step.astype(float), run.residual / 1e3)
            ax.plot(x, med, lw=0.8, ls=":", color=c, label=f"{run.label}: entry spread")

    return _series(runs, out, "spread.png", "Arrival spread, earliest to latest rank"
                   + _dashed(runs),
                   "spread (ms)", lambda r: r.spread, residual)


def cdf_title(runs: Sequence[Run]) -> str:
    """Names two runs (the compared one first); more are counted, and the legend names them."""
    title = "Step-time CDF, measured steps"
    compared = pairs(runs) if len(runs) == 2 else []
    if compared:
        base, other = compared[0]
        title += f": {runs[other].label} vs {runs[base].label}"
    elif len(runs) > 1:
        title += f" of {len(runs)} runs"
    return title


def cdf(runs: Sequence[Run], out: Path) -> str:
    """Step-time CDF of every run (baseline vs paced when both are given)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for i, run in enumerate(runs):
        st = run.step_time[measured(run)] / 1e3
        if st.size == 0:
            continue
        st = np.sort(st)
        p = np.arange(1, st.size + 1) / st.size
        ax.step(st, p, where="post", color=COLORS[i % len(COLORS)], lw=1.2,
                label=f"{run.label} (p50 {np.median(st):.1f}, p99 {np.percentile(st, 99):.1f})")
    allst = np.concatenate([r.step_time[measured(r)] for r in runs]) / 1e3
    if allst.size and allst.max() > 20 * np.median(allst):
        ax.set_xscale("log")
    else:  # no offset notation (a flat run read 1e-10 + 9.8878e1); a log axis has none
        ax.ticklabel_format(axis="x", useOffset=False)
    ax.set_title(cdf_title(runs))
    ax.set_xlabel("step time (ms)")
    ax.set_ylabel("fraction of steps")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no run with measured steps: no legend (a warning)
        ax.legend(loc="lower right", fontsize=8)
    return _save(fig, out, "cdf.png")


def lateness_heatmap(run: Run, out: Path, name: str) -> str:
    """Per-rank lateness behind the median rank, ranks x steps (red: late, blue: early).
    Steps are averaged into at most MAX_HEAT_STEPS columns, ranks into MAX_HEAT_RANKS rows."""
    plt = _plt()
    ok = measured(run)
    if not ok.any():  # nothing measured: the whole run rather than an empty picture
        ok = np.ones(run.steps, dtype=bool)
    e, steps = run.earliness[ok], run.step[ok]
    with np.errstate(all="ignore"):
        late = lateness(e) / 1e3  # ms
    late = _pool(_pool(late, MAX_HEAT_STEPS, axis=0), MAX_HEAT_RANKS, axis=1)
    fig, ax = plt.subplots(figsize=(9, max(2.8, min(6.0, 1.2 + 0.25 * late.shape[1]))))
    finite = late[np.isfinite(late)]
    lim = float(np.percentile(np.abs(finite), 99)) if finite.size else 1.0
    im = ax.imshow(late.T, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim or 1.0,
                   interpolation="nearest", origin="lower",
                   extent=(float(steps[0]), float(steps[-1]) + 1, -0.5,
                           run.world_size - 0.5))
    fig.colorbar(im, ax=ax, label="late vs median rank (ms)")
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.set_title(f"Per-rank lateness: {run.label} ({int(ok.sum())} measured steps)")
    return _save(fig, out, name)


def _pool(a: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Mean-pools `a` along `axis` into at most n slices (NaN-aware)."""
    size = a.shape[axis]
    if size <= n:
        return a
    edges = np.linspace(0, size, n + 1).astype(int)
    parts = [np.nanmean(np.take(a, range(lo, hi), axis=axis), axis=axis)
             for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    return np.stack(parts, axis=axis)


def straggler_counts(run: Run) -> tuple[np.ndarray, int, int]:
    """(steps each rank arrived last, steps counted, measured steps): over the measured steps
    with a clear last rank (`ranks.clear_last`)."""
    hist = last_counts(run)
    return hist, int(hist.sum()), int(measured(run).sum())


def stragglers(runs: Sequence[Run], out: Path) -> str:
    """Per rank: how often it arrived last, over the measured steps whose spread is above 1%
    of the median step (with no spread the 'last' rank is an arbitrary tie), and what its
    lateness cost a step (`ranks.cost_per_rank`: its lead as the last rank over the next-latest,
    per measured step)."""
    plt = _plt()
    fig, (ax, ax_cost) = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True)
    width = 0.8 / max(len(runs), 1)
    world = max(r.world_size for r in runs)
    for i, run in enumerate(runs):
        hist, k, n = straggler_counts(run)
        hist = np.pad(hist, (0, world - hist.size))
        cost = np.pad(cost_per_rank(run)[0], (0, world - run.world_size)) / 1e3  # ms a step
        steps = f"{n} measured steps" if k == n else f"{k} of {n} measured steps"
        style = dict(color=COLORS[i % len(COLORS)], label=f"{run.label} ({steps})")
        for a, values in ((ax, hist), (ax_cost, cost)):
            if world <= MAX_BARS:
                a.bar(np.arange(world) + (i - (len(runs) - 1) / 2) * width, values,
                      width=width, **style)
            else:  # one outline a run, not a bar a rank (4096 bars took 7 s to draw)
                a.stairs(values, np.arange(world + 1) - 0.5, lw=0.8, **style)
    ax.set_ylabel("steps it arrived last")
    ax.set_title("Straggler histogram, and what each rank's lateness cost")
    ax_cost.set_ylabel("ms a step")
    ax_cost.set_xlabel("rank (cost: its lead as the last rank over the next-latest, "
                       "per measured step)")
    if world <= 32:
        ax_cost.set_xticks(range(world))
    for a in (ax, ax_cost):
        a.grid(alpha=0.3, axis="y")
    ax.legend(loc="best", fontsize=8)
    return _save(fig, out, "stragglers.png")


def pacing(runs: Sequence[Run], out: Path) -> str:
    """Delays applied (mean and largest rank, per step), when pacing was on, and the share of
    the measured steps with a delay."""
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.2 + 2.0 * len(runs)), squeeze=False,
                             sharex=True)
    for i, (ax, run) in enumerate(zip(axes[:, 0], runs, strict=True)):
        c = COLORS[i % len(COLORS)]
        x = run.step.astype(float)
        with np.errstate(all="ignore"):
            mean = np.nanmean(run.delay, axis=1) / 1e3
            top = np.nanmax(run.delay, axis=1) / 1e3
        xb, mb, _, _ = _binned(x, mean)
        xt, _, _, tb = _binned(x, top)
        ax.plot(xt, tb, color=c, lw=0.7, alpha=0.6, label="largest rank")
        ax.plot(xb, mb, color=c, lw=1.2, label="mean over ranks")
        on = run.active.astype(float)
        xa, ma, _, _ = _binned(x, on)
        ax2 = ax.twinx()
        ax2.fill_between(xa, 0, ma, step="mid", color="#2ca02c", alpha=0.15, lw=0)
        ax2.set_ylim(0, 1.05)
        ax2.set_yticks([0, 1])
        ax2.set_yticklabels(["off", "on"])
        ax.set_ylim(bottom=0, top=max(1.05 * float(np.nanmax(tb, initial=0.0)), 0.1))
        if run.first_measured_step:  # the title's shares count the steps after it
            ax.axvline(run.first_measured_step, color="0.3", ls="--", lw=0.8)
        ax.set_ylabel("delay a step (ms)")  # a rank's sum over its collectives
        ok = measured(run)
        on_measured = float(on[ok].mean()) if ok.any() else 0.0
        # Pacing on is not delays applied: a rank's delay starts only after its holdoff.
        delayed = np.nan_to_num(top) > 0
        delayed_measured = float(delayed[ok].mean()) if ok.any() else 0.0
        if not delayed.any():  # an empty 0-0.1 ms axis says less than a line of text
            ax.set_yticks([])
            ax.text(0.5, 0.5, f"no delays (mode {run.mode})" if run.mode else "no delays",
                    transform=ax.transAxes, ha="center", va="center", color="0.4")
        ax.set_title(f"{run.label}: pacing armed {100 * on_measured:.0f}% of the measured steps "
                     f"(green), delays on {100 * delayed_measured:.0f}%"
                     + ("; dashed: first measured step" if run.first_measured_step else ""),
                     fontsize=10)
        ax.grid(alpha=0.3)
        if delayed.any():
            ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("step")
    return _save(fig, out, "pacing.png")


def lost_time(runs: Sequence[Run], diags: Sequence[Diagnosis], out: Path) -> str:
    """Lost time per measured step against the ideal step, one bar per run: solid for the
    modes with enough evidence, hatched grey for the unattributed rest (modes below the
    confidence threshold and excess with neither spread nor transfer excess)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 2.4 + 0.5 * len(runs)))
    labels = [r.label for r in runs]
    right = 0.0
    for j, d in enumerate(diags):
        n = max(int(d.summary.get("measured_steps", 0)), 1)
        left = 0.0
        parts = {f.mode: f.lost_us for f in d.modes}
        parts["unattributed"] = float(d.summary.get("unattributed_us", 0.0))
        for mode in (*MODES, "unattributed"):
            w = parts.get(mode, 0.0) / n / 1e3
            grey = mode == "unattributed"
            ax.barh(j, w, left=left, color=MODE_COLORS[mode], hatch="//" if grey else None,
                    edgecolor="#888888" if grey else None, lw=0,
                    label=(f"unattributed (confidence < {MIN_CONFIDENCE}, or no excess)"
                           if grey else mode) if j == 0 else None)
            left += w
        if "lost_fraction" in d.summary:
            ax.text(left, j, f"  {100 * d.summary['lost_fraction']:.1f}% of the measured time",
                    va="center", fontsize=8)
        else:  # no bar is not "lost nothing"
            ax.text(left, j, f"  not diagnosed: {d.summary.get('note', 'too little evidence')}"
                    [:90], va="center", fontsize=8, color="0.4")
        right = max(right, left)
    ax.set_xlim(0, max(right * 1.35, 1e-3))
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("time lost per measured step against the ideal step (ms)")
    ax.set_title("Lost time by failure mode (solid: enough evidence)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=8,
              ncol=3, frameon=False)
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, out, "lost_time.png")


def make_all(runs: Sequence[Run], diags: Sequence[Diagnosis], out: Path,
             progress: Any = None) -> list[tuple[str, str]]:
    """Every plot of the report into `out`; returns (file name, caption) in report order."""
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[Any, str]] = [
        (lambda: lost_time(runs, diags, out), "Time lost against the ideal step, by failure "
         f"mode; hatched grey: unattributed (no mode with confidence >= {MIN_CONFIDENCE})."),
        (lambda: step_time(runs, out), "Step time over the run (median line; the band spans "
         "min to max when steps are binned)."),
        (lambda: cdf(runs, out), "Step-time CDF: the further left and the steeper, the better."),
        (lambda: spread(runs, out), "Arrival spread between the earliest and the latest rank "
         "(dotted: entry spread left after pacing)."),
    ]
    for i, run in enumerate(runs):
        jobs.append((lambda run=run, i=i: lateness_heatmap(run, out, f"lateness_{i}.png"),
                     f"Lateness of each rank behind the median rank: {run.label}. A steady "
                     "red row is a locality rank; scattered red is random stragglers."))
    jobs += [
        (lambda: stragglers(runs, out), "How often each rank arrived last, over the measured "
         "steps, and what its lateness cost: its lead as the last rank over the next-latest, "
         "per measured step. Ranks late together (a node) lead the next-latest, one of them, "
         "by nothing: what they cost together is in the text above."),
        (lambda: pacing(runs, out), "Delays applied to early ranks, and when pacing was on."),
    ]
    made = []
    import matplotlib

    # Labels come from files: "run_$EXP_$SEED" (an unexpanded shell variable) is text, not
    # math (matplotlib's parser failed on it, and the whole report with it).
    with warnings.catch_warnings(), matplotlib.rc_context({"text.parse_math": False}):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: ranks missing
        for k, (job, caption) in enumerate(jobs):
            if progress is not None and len(runs[0].step) > 20_000:
                progress(f"plot {k + 1}/{len(jobs)}")
            made.append((job(), caption))
    return made

