"""Run against run: which runs the report compares (a paced run against its baseline) and
the change of each summary figure, as the summary table's change columns, the CLI's
comparison lines and findings.json's `comparisons`.

Pairing: the k-th paced run (mode "pace") against the k-th unpaced one (observe, off, or a
simulated run without the policy) of the same world size (and simulated scenario), in the
order given, so that `gpupace demo`'s baseline-1, baseline-2, paced-1, paced-2 compare as
paced-1 vs baseline-1 and paced-2 vs baseline-2; paced runs past the unpaced ones against the
last of those (`gpupace simulate`'s none, oracle and gpupace files: each policy against
none); pacers on data-parallel subgroups pair
group by group. Two runs without such a pair (two world sizes, a simulated run beside a real
one, other groups) compare all the same, the unpaced one (else the first) as the baseline,
with a note that they are different jobs; more such runs are not compared, nor two groups of
one job (parts of it). Runs of one kind whose headers describe other jobs (`JOB_FIELDS`: a
real job's run and the demo's) are compared with that note too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from .load import Run, groups_of_one_job, settings_of, started_s

# key -> (label, kind): "rel" change in % of the baseline; "pts" a fraction's change in
# percentage points; "ms" an absolute change of a time in us, shown in ms.
CHANGES = {
    "throughput": ("throughput", "rel"),
    "step_time_mean": ("step time mean", "rel"),
    "step_time_p50": ("step time p50", "rel"),
    "step_time_p99": ("step time p99", "rel"),
    "step_time_max": ("step time max", "rel"),
    "step_time_cv": ("step time CV", "rel"),
    "spread_mean": ("arrival spread mean", "rel"),
    "spread_p99": ("arrival spread p99", "rel"),
    "entry_spread_mean": ("entry spread mean", "rel"),
    "active_fraction": ("pacing armed", "pts"),
    "delayed_fraction": ("steps with a delay", "pts"),
    "delay_mean": ("delay per rank per step", "ms"),
}
# Not compared: lost time, its unattributed part and the ideal step. Each run's ideal comes
# from that run alone, so a faster run can lose more against its own (a review saw
# throughput +25% beside time lost +5 pts); throughput and step times compare the runs.
# The figures the CLI's one comparison line names, in order.
CLI_KEYS = ("throughput", "step_time_mean", "step_time_p99", "step_time_cv", "spread_mean",
            "entry_spread_mean")
# Header fields that describe the job a run timed: a paced run and its own baseline share
# them (the demo's scenario and wait, the samples a step); a real job's run against the
# demo's, of one world size, was compared without a word.
JOB_FIELDS = ("source", "source_detail", "samples_per_step", "process_group_backend",
              "scenario", "wait")
# Of those, what a header may lack and still be the same job's: samples_per_step given to one
# run's pacer alone (the throughputs' note says so), process_group_backend before 2026-11-30.
MAYBE_MISSING = ("samples_per_step", "process_group_backend")


def pairs(runs: Sequence[Run]) -> list[tuple[int, int]]:
    """(baseline index, compared index) for each comparison the report shows: within each
    kind of run (`kind`), the k-th paced run against the k-th unpaced one, or the last."""
    base = [i for i, r in enumerate(runs) if r.mode != "pace"]
    paced = [i for i, r in enumerate(runs) if r.mode == "pace"]
    out = []
    for k in dict.fromkeys(kind(runs[i]) for i in paced):
        b = [i for i in base if kind(runs[i]) == k]
        if b:  # paced runs past the baselines meet the last one (none, oracle, gpupace)
            out += [(b[min(j, len(b) - 1)], i)
                    for j, i in enumerate(i for i in paced if kind(runs[i]) == k)]
    if out:
        return sorted(out, key=lambda pair: pair[1])
    if len(runs) != 2 or groups_of_one_job(runs[0].header, runs[1].header):
        return []
    return [(1, 0)] if runs[0].mode == "pace" and runs[1].mode != "pace" else [(0, 1)]


def kind(run: Run) -> tuple:
    """What a paced run and its baseline share: the world size, for simulated runs the
    scenario (preset, seed, steps), for a pacer on a data-parallel subgroup its global
    ranks, and the job fields every header of its writer holds (`JOB_FIELDS` less
    `MAYBE_MISSING`). Runs of 16 and 32 ranks never compare as paced and baseline, nor a
    real job's baseline with the demo's paced run when each has its own."""
    sim = run.header.get("sim")
    sim = sim if isinstance(sim, dict) else {}
    group = run.header.get("group_ranks")
    group = tuple(group) if isinstance(group, list) else None
    return run.world_size, sim.get("preset"), sim.get("seed"), sim.get("steps"), group, job_key(run)


def job_key(run: Run) -> tuple:
    """The job fields every header of its writer holds (`JOB_FIELDS` less `MAYBE_MISSING`),
    hashable: runs of one job share it, at any world size."""
    return tuple(json.dumps(run.header.get(k), sort_keys=True, default=str)
                 for k in JOB_FIELDS if k not in MAYBE_MISSING)


def resumed_at(a: Run, b: Run) -> int | None:
    """The step at which one of two runs went on with the other's job from a checkpoint (its
    header's resumed_at_step, the same kind of run and settings, started after the other),
    else None. Its file beside the one kept aside (run.jsonl, run.jsonl.1) read as a paced
    run against another without a word."""
    first, later = sorted((a, b), key=lambda r: started_s(r.header) or 0.0)
    at, before = (r.header.get("resumed_at_step") for r in (later, first))
    if not _step(at) or (before is not None and not (_step(before) and before < at)):
        return None  # not resumed, or resumed before the other was (a later restart)
    return at if _one_job(first, later) else None


def same_restart(a: Run, b: Run) -> int | None:
    """The step both runs resumed from, when they are two tries from one checkpoint (the same
    resumed_at_step, kind of run and settings), else None."""
    at = a.header.get("resumed_at_step")
    if not _step(at) or b.header.get("resumed_at_step") != at:
        return None
    return at if _one_job(a, b) else None


def restart_note(a: Run, b: Run) -> str | None:
    """What a comparison of two parts of one restarted job must say, or None."""
    if (at := resumed_at(a, b)) is not None:
        return (f"one job before and after its restart from a checkpoint at step {at}: not a "
                "paced run against a baseline")
    if (at := same_restart(a, b)) is not None:
        return f"two tries of one job from its checkpoint at step {at}: not a paced run " \
            "against a baseline"
    return None


def job_differences(a: Run, b: Run) -> list[str]:
    """The `JOB_FIELDS` in which two runs' headers differ, as "name A and B"; one of
    `MAYBE_MISSING` in one header alone is no difference."""
    out = []
    for k in JOB_FIELDS:
        va, vb = a.header.get(k), b.header.get(k)
        if va != vb and not (k in MAYBE_MISSING and None in (va, vb)):
            out.append(f"{k} {va!r} and {vb!r}")
    return out


def _one_job(a: Run, b: Run) -> bool:
    """The same kind of run with the same settings (telemetry path aside)."""
    return kind(a) == kind(b) and settings_of(a.header) == settings_of(b.header)


def _step(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


# A relative change's baseline at or below this is zero: every figure compared so (times in
# us, throughputs, a CV) that is not zero is far above it.
ZERO = 1e-9


def change(key: str, base: Any, other: Any) -> float | None:
    """The change of `key` from `base` to `other` in its kind's unit (%, points, ms), or None
    when either figure is missing or a relative change has no baseline to divide by: zero, or
    float rounding off it (the step-time CV of constant step times reads 1e-16, and a change
    of -12.8% from it was printed)."""
    b, o = _num(base), _num(other)
    if b is None or o is None or key not in CHANGES:
        return None
    kind = CHANGES[key][1]
    if kind == "rel":
        return 100.0 * (o - b) / abs(b) if abs(b) > ZERO else None
    if kind == "pts":
        return 100.0 * (o - b)
    return (o - b) / 1e3


P99_STEPS = 100  # fewer measured steps: a p99 is about the slowest step


def summary_change(key: str, base: dict[str, Any], other: dict[str, Any]) -> float | None:
    """`change` of `key` between two runs' summaries; None for throughputs in other units
    (steps/s against samples/s: one run's header gives samples_per_step, the other's not)."""
    if key == "throughput" and base.get("throughput_unit") != other.get("throughput_unit"):
        return None
    return change(key, base.get(key), other.get(key))


def gap_pct(values: Sequence[float]) -> float:
    """How far apart figures of the same code are, in % of their mean: (max - min) / mean."""
    mean = sum(values) / len(values) if values else 0.0
    return 100.0 * (max(values) - min(values)) / mean if mean > 0 else float("nan")


def baseline_gap(runs: Sequence[Run], sums: Sequence[dict[str, Any]],
                 compared: int) -> tuple[list[str], float] | None:
    """The noise gauge of a comparison: where the runs given hold two or more real unpaced
    runs of the compared run's kind (`gpupace demo`'s baseline-1 and baseline-2, the same code
    at the run's two ends), their labels and how far apart their throughputs are (`gap_pct`);
    else None. A simulated baseline run again is the same run, and gauges nothing; nor do
    two unpaced runs compared with each other (a job before and after a fix) gauge theirs."""
    if runs[compared].mode != "pace":
        return None
    paced = runs[compared]
    # every job field, samples_per_step included (two batch sizes are two jobs), and settings
    same = [i for i, r in enumerate(runs) if r.mode != "pace" and not r.header.get("sim")
            and kind(r) == kind(paced) and not job_differences(r, paced)
            and r.header.get("samples_per_step") == paced.header.get("samples_per_step")]
    units = {sums[i].get("throughput_unit") for i in same}
    values = [_num(sums[i].get("throughput")) for i in same]
    if len(same) < 2 or len(units) > 1 or None in values:
        return None
    gap = gap_pct(values)
    return ([runs[i].label for i in same], gap) if math.isfinite(gap) else None


def _undelayed_simulation(run: Run) -> str:
    """What a simulated paced run that delayed nobody differs from its baseline by: the
    pacing cost its scenario charged, if any."""
    scenario = run.header["sim"].get("scenario") or {}
    site, step = (scenario.get(k) or 0.0 for k in ("pacing_site_us", "pacing_step_us"))
    if not (isinstance(site, (int, float)) and isinstance(step, (int, float))) or site + step <= 0:
        return "in the simulator that is the baseline's run again"
    return (f"in the simulator that is the baseline's run plus pacing's cost ({site:g} us a "
            f"paced collective, {step:g} us a step), which is all its changes show")


def notes(base: dict[str, Any], other: dict[str, Any], paced: bool,
          runs: tuple[Run, Run] | None = None,
          gap: tuple[list[str], float] | None = None) -> list[str]:
    """What a reader of the changes must know: two runs of different jobs (`runs`: baseline
    and compared, when known), figures that could not be compared, a p99 of few steps, a
    paced run that delayed nobody (it ran the baseline's code: its changes are noise), and
    how far apart the job's baselines are (`gap`, from `baseline_gap`): the noise a change
    must exceed."""
    out = []
    restart = restart_note(*runs) if runs is not None else None
    if restart:
        out.append(restart)
    if runs is not None and (kind(runs[0]) != kind(runs[1]) or job_differences(*runs)):
        out.append(f"different jobs ({_difference(*runs)}): the changes compare them, not a "
                   "paced run with its own baseline")
    for run in runs or ():
        if run.unfinished:  # a crash's last steps may be the slow ones, or its first alone run
            out.append(f"{run.label} did not finish ({run.unfinished}): its figures cover the "
                       "steps it ran")
    if base.get("throughput_unit") != other.get("throughput_unit"):
        out.append(f"throughput not compared: {base.get('throughput_unit')} against "
                   f"{other.get('throughput_unit')} (samples_per_step is in one run's header "
                   "only)")
    fewest = min((x for x in (base.get("measured_steps"), other.get("measured_steps"))
                  if isinstance(x, int)), default=None)
    if fewest is not None and 0 < fewest < P99_STEPS:  # none: no figure to compare at all
        out.append(f"the p99 of {fewest} measured steps is about their slowest step: its "
                   "change is one step's")
    both_paced = paced and runs is not None and runs[0].mode == "pace"
    if both_paced and restart is None:
        out.append(f"both runs paced: {runs[0].label} stands in for a baseline, which the "
                   "runs given have none of")
    if (paced and not both_paced and other.get("delayed_fraction") == 0
            and (other.get("measured_steps") or 0) > 0):  # none measured: nothing to say
        simulated = runs is not None and all(r.header.get("sim") for r in runs)
        out.append("pacing delayed nobody in the paced run: " + (
            _undelayed_simulation(runs[1]) if simulated else
            "both ran the same code, so the changes are this machine's noise"))
    if gap is not None:
        labels, pct = gap
        told = summary_change("throughput", base, other)
        verdict = ("this throughput change is within that, so it may be noise alone"
                   if told is not None and abs(told) <= pct else
                   "a change must exceed that to be more than noise, and "
                   f"{'two' if len(labels) == 2 else 'a few'} runs can understate the noise: "
                   "repeat them before reading a change as pacing's")
        out.append(f"the unpaced runs {', '.join(labels)}, if they ran the same code, differ in "
                   f"throughput by {pct:.1f}%; {verdict}")
    return out


def _difference(b: Run, o: Run) -> str:
    """What makes two runs different jobs, in words."""
    sims = [r.header.get("sim") for r in (b, o)]
    if b.world_size != o.world_size:
        return f"{b.world_size} and {o.world_size} ranks"
    if all(sims) and kind(b)[1:4] != kind(o)[1:4]:
        return "other simulated scenarios"
    if any(sims) and not all(sims):
        return "a simulated run and a real one"
    return "; ".join(job_differences(b, o)) or "other data-parallel groups"


def fmt_change(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    kind = CHANGES[key][1]
    if kind == "rel":
        return f"{v:+.1f}%"
    if kind == "pts":
        return f"{v:+.1f} pts"
    return f"{v:+.2f} ms"


def comparisons(runs: Sequence[Run], sums: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per pair: labels and, per figure, both values and the change."""
    out = []
    for i, j in pairs(runs):
        rows = {}
        for key, (label, kind) in CHANGES.items():
            b, o = sums[i].get(key), sums[j].get(key)
            unit = {"rel": "%", "pts": "percentage points", "ms": "ms"}[kind]
            rows[key] = {"label": label, "baseline": _num(b), "compared": _num(o),
                         "change": summary_change(key, sums[i], sums[j]), "change_unit": unit}
        out.append({"baseline": runs[i].label, "compared": runs[j].label,
                    "title": f"{runs[j].label} vs {runs[i].label}", "changes": rows,
                    "notes": notes(sums[i], sums[j], runs[j].mode == "pace",
                                   (runs[i], runs[j]), baseline_gap(runs, sums, j))})
    return out


def cli_line(comp: dict[str, Any]) -> str:
    """`paced-1 vs baseline-1: throughput +2.5%, ..., entry spread mean -30.1%`."""
    parts = []
    for key in CLI_KEYS:
        row = comp["changes"][key]
        if row["change"] is None:
            continue
        text = f"{row['label']} {fmt_change(key, row['change'])}"
        if key == "step_time_cv":
            text = (f"{row['label']} {row['baseline']:.3f} -> {row['compared']:.3f} "
                    f"({fmt_change(key, row['change'])})")
        parts.append(text)
    line = f"{comp['title']}: " + (", ".join(parts) or "no figure to compare")
    return "\n".join([line, *(f"  ({note})" for note in comp["notes"])])
