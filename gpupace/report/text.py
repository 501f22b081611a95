"""The diagnosis in words, for the CLI, the page and findings.json: a headline per run (who
is late, how often, by how much, and the leading cause with its confidence), what the late
ranks cost a step, the lost time with its definition, and where the lost time went."""

from __future__ import annotations

import math

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
    if lr is None:
        who = "no step with a clear last rank"
    else:
        pct = 100 * lr["last_fraction"]
        clear, measured = lr["steps_with_clear_last"], s.get("measured_steps", 0)
        # A share of few steps must say how few (the others had no spread worth a last rank).
        of = "of steps" if clear >= 0.9 * measured else \
            f"of the {clear} steps with a clear last rank ({measured} measured)"
        if lr["persistent"]:
            behind = lr["behind_median_us"]
            # of two ranks the lateness is behind the other one (no median to speak of)
            other = "the other rank" if s.get("world_size") == 2 else "the median rank"
            by = f", typically {behind / 1e3:.1f} ms behind {other}" \
                if math.isfinite(behind) and behind >= 50.0 else ""  # shown as >= 0.1 ms
            who = f"rank {lr['rank']} last in {pct:.0f}% {of}{by}"
        else:
            chance = 100 / max(int(s.get("world_size") or 1), 1)
            who = (f"no persistently late rank (most often rank {lr['rank']}: last in "
                   f"{pct:.0f}% {of}, {chance:.0f}% by chance)")
    # The largest share among the "likely" modes, else among the "possible" ones: a mode
    # with a larger share and weak evidence does not outrank one with strong evidence.
    named = [m for m in d.modes if m.share > 0]
    lead = next((m for m in named if m.verdict == "likely"), named[0] if named else None)
    if lead is not None:
        cause = (f"{'leading' if lead.verdict == 'likely' else 'possible'} cause {lead.mode} "
                 f"({100 * lead.share:.0f}% of the lost time, {lead.verdict}, "
                 f"confidence {lead.confidence:.2f})")
    elif s.get("note"):
        cause = s["note"]
    else:
        cause = f"no single cause with enough evidence (confidence >= {MIN_CONFIDENCE})"
    return f"{label}: {who}; {cause}"


def cost_line(d: Diagnosis) -> str:
    """What the last arrivals cost a step, and the ranks that cost most (`ranks.rank_costs`)."""
    c = d.summary.get("late_cost")
    if not c:
        return ""
    ranks = ", ".join(f"rank {r['rank']} {r['cost_us_per_step'] / 1e3:.2f} ms "
                      f"(last in {100 * r['last_fraction']:.0f}%)" for r in c["ranks"][:3])
    by = f": {ranks}" if ranks else ""
    return (f"the last rank's lead over the next-latest cost up to "
            f"{c['lead_us_per_step'] / 1e3:.2f} ms a step ({100 * c['share_of_step']:.1f}% of "
            f"the mean step){by}")


def lost_line(d: Diagnosis) -> str:
    """The lost time with its definition, in words."""
    s = d.summary
    if "lost_fraction" not in s:
        return ""
    cost = s.get("locality_cost_us", 0.0)
    loc = next((m for m in d.modes if m.mode == "locality" and m.ranks), None)
    who = "the late ranks"
    if loc is not None:
        names = ", ".join(str(r) for r in loc.ranks[:4]) + (", ..." if len(loc.ranks) > 4 else "")
        who = f"rank{'s' if len(loc.ranks) > 1 else ''} {names}"
    less = (f" less the {cost / 1e3:.1f} ms by which {who} typically arrived after every "
            f"other rank") if cost > 0 else ""
    return (f"lost {100 * s['lost_fraction']:.1f}% of the measured time: mean step "
            f"{s['mean_step_us'] / 1e3:.1f} ms against an ideal step of "
            f"{s['ideal_step_us'] / 1e3:.1f} ms (the 5th-percentile step of "
            f"{s['p5_step_us'] / 1e3:.1f} ms{less})")


def split_line(d: Diagnosis) -> str:
    """Where the lost time went: the attributed modes, then the unattributed rest and why."""
    s = d.summary
    if "lost_fraction" not in s:
        return ""
    parts = [f"{m.mode} {100 * m.share:.0f}% ({m.verdict}, {m.confidence:.2f})"
             for m in d.modes if m.share > 0]
    lost = s.get("lost_us") or 0.0
    low = [f"{m.mode} {100 * m.candidate_share:.0f}%" for m in d.modes
           if m.share == 0 and m.candidate_share >= 0.005]
    why = [f"below confidence {MIN_CONFIDENCE}: " + ", ".join(low)] if low else []
    if lost > 0 and s.get("unexplained_us", 0.0) / lost >= 0.005:
        why.append(f"no spread or transfer excess: {100 * s['unexplained_us'] / lost:.0f}%")
    rest = f"unattributed {100 * s.get('unattributed_share', 0.0):.0f}%"
    rest += f" ({'; '.join(why)})" if why else ""
    return "; ".join([*parts, rest])
