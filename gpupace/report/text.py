"""The diagnosis in words, for the CLI, the page and findings.json: a headline per run (who
is late, how often, by how much, and the leading cause with its confidence), what the late
ranks cost a step, the lost time with its definition, and where the lost time went."""

from __future__ import annotations

import math

from .advice import node_names
from .diagnose import MIN_CONFIDENCE, Diagnosis


def headline(d: Diagnosis) -> str:
    """One line: who is late (rank, how often, by how much) and the leading cause with its
    confidence (a "likely" one before any "possible" one, then by share of the lost time), or
    that no single cause has enough evidence."""
    s = d.summary
    label = s.get("label", "")
    if "lost_fraction" not in s:
        return f"{label}: {s.get('note', 'no verdict')}"
    lr = s.get("late_rank")
    group = _late_group(d)
    spells = _late_spells(d)
    others = "the other rank" if s.get("world_size") == 2 else "the others"
    # A rank last in most steps that is no spell's: a steady one, named first (the spells
    # after it); the rank of a spell from halfway on is last in most clear steps too.
    steady = lr is not None and lr["persistent"] and (
        spells is None or lr["rank"] not in spells["ranks"])
    if group is not None:
        behind = group["behind_others_us"] / 1e3
        node = (f" (all of {node_names(group['nodes'])})" if group.get("nodes") else "")
        who = (f"{_ranks(group['ranks'])}{node} steadily late, typically "
               f"{behind:.{1 if behind >= 1 else 2}f} ms behind {others} (late in "
               f"{100 * group['late_fraction']:.0f}% of steps)")
    elif spells is not None and not steady:
        who = _spells_words(spells, others)
        spells = None  # told
    elif lr is None:
        who = "no step with a clear last rank"
    else:
        pct, of = _last_share(lr["last_steps"], lr["steps_with_clear_last"],
                              s.get("measured_steps", 0))
        if lr["persistent"]:
            behind = lr["behind_median_us"]
            by = f", typically {behind / 1e3:.1f} ms behind {_reference(s)}" \
                if math.isfinite(behind) and behind >= 50.0 else ""  # shown as >= 0.1 ms
            who = f"rank {lr['rank']} last in {_pct(pct)} {of}{by}"
        else:
            chance = 100 / max(int(s.get("world_size") or 1), 1)
            who = (f"no persistently late rank (most often rank {lr['rank']}: last in "
                   f"{_pct(pct)} {of}, {_pct(chance)} by chance)")
    if spells is not None:
        who += f"; also {_spells_words(spells, others)}"
    # The largest share among the "likely" modes, else among the "possible" ones: a mode
    # with a larger share and weak evidence does not outrank one with strong evidence.
    named = [m for m in d.modes if m.share > 0]
    lead = next((m for m in named if m.verdict == "likely"), named[0] if named else None)
    if lead is not None:
        cause = (f"{'leading' if lead.verdict == 'likely' else 'possible'} cause {lead.mode} "
                 f"({100 * lead.share:.0f}% of the lost time, confidence "
                 f"{lead.confidence:.2f})")  # the verdict is in the first word
    elif s.get("note"):
        cause = s["note"]
    else:
        cause = f"no single cause with enough evidence (confidence >= {MIN_CONFIDENCE})"
    return f"{label}: {who}; {cause}"


def cost_line(d: Diagnosis) -> str:
    """What the last arrivals cost a step, and the ranks that cost most (`ranks.rank_costs`);
    first, what the steadily late ranks cost together (their lead over every other rank),
    where the diagnosis found any: a late node's ranks lead the next-latest, one of them, by
    nothing."""
    parts = []
    group = _late_group(d)
    if group is not None:
        # At least: the record holds one site's arrivals, and after the first a site's are
        # gated by the collective before it, which hides the rest of a handicap (README).
        parts.append(f"{_ranks(group['ranks'])} arrived after every other rank in "
                     f"{100 * group['last_fraction']:.0f}% of the steps, by typically "
                     f"{group['last_lead_us'] / 1e3:.2f} ms: together at least "
                     f"{group['cost_us_per_step'] / 1e3:.2f} ms a step on "
                     f"average ({100 * group['share_of_step']:.1f}% of the measured time; seen "
                     f"at one collective a step, a handicap spread over the backward shows in "
                     f"part)")
    spells = _late_spells(d)
    if spells is not None:
        parts.append(f"{_ranks(spells['ranks'])}, in {_their(spells)} late "
                     f"spell{'s' if len(spells['spells']) > 1 else ''} "
                     f"({100 * spells['steps_fraction']:.0f}% of the steps), arrived after "
                     f"every other rank: {spells['cost_us_per_step'] / 1e3:.2f} ms a step on "
                     f"average ({100 * spells['share_of_step']:.1f}% of the measured time)")
    c = d.summary.get("late_cost")
    if c and c["lead_us_per_step"] >= 5.0:  # shown as >= 0.01 ms; less: no cost worth a line
        measured = d.summary.get("measured_steps", 0)
        ranks = ", ".join(
            f"rank {r['rank']} {r['cost_us_per_step'] / 1e3:.2f} ms (last in "
            f"{_pct(_last_share(r['last_steps'], c['steps_with_clear_last'], measured)[0])})"
            for r in c["ranks"][:3])
        by = f": {ranks}" if ranks else ""
        # An upper bound for one rank, after the group's lower bound for several: "alone"
        # says why it can be the smaller figure.
        parts.append(f"the last rank alone, by its lead over the next-latest: up to "
                     f"{c['lead_us_per_step'] / 1e3:.2f} ms a step on average "
                     f"({100 * c['share_of_step']:.1f}% of the mean step){by}")
    return "; ".join(parts)


def _pct(x: float) -> str:
    """A share in %, whole from 10 up and to two significant digits below: at 512 ranks
    "last in 2% of steps, 0% by chance" hid a tenfold excess (0.2% by chance)."""
    if not math.isfinite(x):
        return "-"
    if 0 < x < 0.01:
        return "<0.01%"
    return f"{x:.0f}%" if x == 0 or x >= 9.5 else f"{x:.2g}%"


def _last_share(last: int, clear: int, measured: int) -> tuple[float, str]:
    """How often a rank was last, in %, and of what: of the measured steps where nearly all
    had a clear last rank (last in 28 of 31 read "100% of steps", of the clear ones), else
    of those that had, saying how few (the others had no spread worth a last rank). The
    headline and the cost line give the same share."""
    if clear >= 0.9 * measured:
        return 100 * last / max(measured, 1), "of steps"
    return 100 * last / max(clear, 1), \
        f"of the {clear} steps with a clear last rank ({measured} measured)"


def _late_group(d: Diagnosis) -> dict | None:
    """The steadily late ranks of the summary, when the locality finding has evidence; not
    one rank that is last in most steps: the late rank's own figures say it then."""
    group = d.summary.get("late_group")
    loc = next((m for m in d.modes if m.mode == "locality"), None)
    if not group or loc is None or loc.share <= 0:
        return None
    lr = d.summary.get("late_rank")
    alone = lr is not None and lr["persistent"] and group["ranks"] == [lr["rank"]]
    return None if alone else group


def _late_spells(d: Diagnosis) -> dict | None:
    """The late spells of the summary, when the finding they count in (sync_amplification)
    has evidence."""
    spells = d.summary.get("late_spells")
    amp = next((m for m in d.modes if m.mode == "sync_amplification"), None)
    return spells if spells and amp is not None and amp.share > 0 else None


def _spells_words(spells: dict, others: str) -> str:
    """'rank 5 late in steps 200-399 only (a late spell, ...), typically 3.0 ms behind the
    others' for one spell; 'ranks ... late in spells, one at a time (4 spells, ...)' for
    several, 'in spells, some at once' where they overlap."""
    sp = spells["spells"]
    behind = spells["behind_us"] / 1e3
    by = f"typically {behind:.{1 if behind >= 1 else 2}f} ms behind {others}"
    if len(sp) == 1:
        return (f"{_ranks(sp[0]['ranks'])} late in steps {sp[0]['first_step']}-"
                f"{sp[0]['last_step']} only (a late spell, late in "
                f"{100 * sp[0]['late_fraction']:.0f}% of its steps), {by}")
    when = "some at once" if spells.get("overlapping") else "one at a time"
    return f"{_ranks(spells['ranks'])} late in spells, {when} ({_spell_steps(spells)}), {by}"


def _their(spells: dict) -> str:
    return "its" if len(spells["ranks"]) == 1 else "their"


def _spell_steps(spells: dict) -> str:
    """The count, the share of steps, and the four spells that cost most, in time order."""
    sp = spells["spells"]
    top = sorted(sorted(sp, key=lambda x: -x["cost_us_per_step"] * x["steps"])[:4],
                 key=lambda x: x["first_step"])
    shown = ", ".join(f"steps {x['first_step']}-{x['last_step']} {_ranks(x['ranks'])}"
                      for x in top)
    more = f", {len(sp) - 4} more" if len(sp) > 4 else ""
    return (f"{len(sp)} spell{'s' if len(sp) > 1 else ''}, "
            f"{100 * spells['steps_fraction']:.0f}% of the steps: {shown}{more}")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, sorted(ranks)[:8]))
    return f"ranks {shown}{', ...' if len(ranks) > 8 else ''} ({len(ranks)} ranks)"


def _reference(summary: dict) -> str:
    # of two ranks the lateness is behind the other one (no median to speak of)
    return "the other rank" if summary.get("world_size") == 2 else "the median rank"


def lost_line(d: Diagnosis) -> str:
    """The lost time with its definition, in words."""
    s = d.summary
    if "lost_fraction" not in s:
        return ""
    cost = s.get("locality_cost_us", 0.0)
    loc = next((m for m in d.modes if m.mode == "locality" and m.ranks), None)
    whos = [_ranks(loc.ranks) if loc is not None else "the late ranks"] if cost > 0 else []
    if s.get("late_spells"):
        whos.append("the rank of each late spell")
    typically = f": typically {cost / 1e3:.1f} ms" if cost > 0 and len(whos) == 1 else ""
    base = (f"the 5th percentile of the step times, each less the lead by which "
            f"{' or '.join(whos)} arrived after every other rank{typically}") if whos \
        else "the 5th-percentile step"
    return (f"lost {100 * s['lost_fraction']:.1f}% of the measured time: mean step "
            f"{s['mean_step_us'] / 1e3:.1f} ms against an ideal step of "
            f"{s['ideal_step_us'] / 1e3:.1f} ms ({base})")


def whole_percents(shares: list[float]) -> list[int]:
    """Shares of one whole in whole percent that add up as the shares do (largest remainder:
    rounded each alone, 36% + 16% + 49% read 101%)."""
    exact = [100.0 * max(x, 0.0) for x in shares]
    out = [math.floor(x) for x in exact]
    short = round(sum(exact)) - sum(out)  # whole percents the floors left out
    for k in sorted(range(len(exact)), key=lambda k: out[k] - exact[k])[:short]:
        out[k] += 1  # to the largest remainders
    return out


def split_line(d: Diagnosis) -> str:
    """Where the lost time went: the attributed modes, then the unattributed rest and why."""
    s = d.summary
    if "lost_fraction" not in s:
        return ""
    shown = [m for m in d.modes if m.share > 0]
    *pcts, rest_pct = whole_percents([m.share for m in shown]
                                     + [s.get("unattributed_share", 0.0)])
    parts = [f"{m.mode} {pct}% ({m.verdict}, {m.confidence:.2f})"
             for m, pct in zip(shown, pcts, strict=True)]
    lost = s.get("lost_us") or 0.0
    low = [f"{m.mode} {100 * m.candidate_share:.0f}%" for m in d.modes
           if m.share == 0 and m.candidate_share >= 0.005]
    why = [f"below confidence {MIN_CONFIDENCE}: " + ", ".join(low)] if low else []
    if lost > 0 and s.get("unexplained_us", 0.0) / lost >= 0.005:
        why.append(f"no spread or transfer excess: {100 * s['unexplained_us'] / lost:.0f}%")
    rest = f"unattributed {rest_pct}%"
    rest += f" ({'; '.join(why)})" if why else ""
    return "; ".join([*parts, rest])
