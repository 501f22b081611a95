"""Late spells: stretches of a run in which a rank, or a group of ranks together (a slow
node), had a steady offset that the rest of the run did not have. Ranks late in turn for ~100
steps each, or one late from halfway on: neither a whole run's steady offset (locality) nor
random lateness describes them, and every step of a spell pays its lead, so the 5th-percentile
step holds it too when spells cover most of the run.

Method, over the measured steps (`ranks.measured`):
- windows of SPELL_STEPS steps, half a window apart: in each, the locality test of the whole
  run (`ranks.offsets_of`: an offset above `ranks.offset_floor`), late by half of it in
  SPELL_SHARE of the window's steps;
- each rank's run of such windows, trimmed to the steps it was late by half its offset and
  extended while it stays so (through SPELL_GAP steps that are not, a late one after); kept
  when at least SPELL_STEPS long, with at least SPELL_STEPS steps outside the rank's spells,
  in which it was late at most half as often; ranks whose stretches overlap by SAME_SPELL of
  the longer make one spell;
- per step, the ranks of the spells active then lead every other rank by what the latest of
  them arrived after all the rest (at most that spell's offset: a spike on top is not the
  spell's); the spell of that latest rank is charged the lead. Two spells at once share a
  step: neither leads the other's rank, and the step's lead is counted once.
Limits: lateness is read behind the median rank to find and trim a spell, so where the ranks
late at once are half of all or more (two spells of a small job overlapping), the overlap
reads as on time: the spells' extents and costs shrink to the steps outside it (the lost time
stays right, the overlap's share going to the other modes). A step where every rank of its
spells is unknown (NaN) is charged nothing; a spell's cost is per step its ranks were known.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .load import Run
from .ranks import BLOCK_VALUES, lateness, measured, offset_floor, offsets_of

SPELL_STEPS = 50  # the window a late spell is found in, and its shortest length
# Of a window's steps, a spell's rank is late (by half its offset) in at least this many: 5
# standard deviations above the half that any rank is, over SPELL_STEPS (0.5 + 5 * 0.5 / sqrt
# 50). A whole run's locality asks 0.7 of many more steps.
SPELL_SHARE = 0.85
SAME_SPELL = 0.8  # ranks whose spells overlap by this much of the longer are late together
# A spell's edge moves past this many steps in a row on which its rank was not late, when a
# late step follows (a noisy step inside a spell is no end of it).
SPELL_GAP = 3


def spell_shaped(run: Run, ranks: list[int], offsets: np.ndarray) -> list[int]:
    """Of `ranks`, a whole run's steadily late ones (locality) with their `offsets` (us, by
    rank), those late only for a stretch of it: in its first or its last SPELL_STEPS measured
    steps late by half their offset in fewer than half of them, as a rank on time is (a rank
    late in 70% of the steps rarely is: below 0.3% a window). Placement does not come and go:
    the spell finder takes them. Runs of under 3 SPELL_STEPS measured steps are not judged."""
    idx = np.flatnonzero(measured(run))
    if idx.size < 3 * SPELL_STEPS or not ranks:
        return []
    out = []
    for part in (idx[:SPELL_STEPS], idx[-SPELL_STEPS:]):
        behind = lateness(run.earliness[part])[:, ranks]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a rank unknown in every step
            late = np.where(np.isnan(behind), np.nan, behind >= 0.5 * offsets[ranks])
            share = np.nanmean(late, axis=0)
        out += [r for r, x in zip(ranks, share, strict=True) if x < 0.5]
    return sorted(set(out), key=ranks.index)


def late_spells(run: Run, exclude: list[int] | tuple[int, ...] = ()
                ) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The late spells of `run` (see the module doc), leaving out the ranks in `exclude` (a
    whole run's locality ranks), in order of their first step: ranks, first and last step,
    length, the fraction of its steps its ranks were late, how far its latest rank was behind
    the median of the ranks in no spell then (median over the spell's steps, us) and what it
    cost a step of the spell; and [measured steps] the spells' lead over every other rank
    (us; 0 outside them)."""
    ok = measured(run)
    idx = np.flatnonzero(ok)
    n, world = idx.size, run.world_size
    lead = np.zeros(n)
    if n < 2 * SPELL_STEPS or world < 2:
        return [], lead
    p50 = float(np.median(run.step_time[ok]))
    starts = np.unique(np.r_[np.arange(0, n - SPELL_STEPS + 1, SPELL_STEPS // 2),
                             n - SPELL_STEPS])
    late_in = np.zeros((starts.size, world), dtype=bool)  # [window, rank]
    for j, a in enumerate(starts):
        offset, share, noise, counted = offsets_of(run.earliness[idx[a:a + SPELL_STEPS]])
        late_in[j] = (offset > offset_floor(noise, counted, p50)) & (share >= SPELL_SHARE)
    late_in[:, list(exclude)] = False
    candidates = np.flatnonzero(late_in.any(axis=0))
    if not candidates.size:
        return [], lead
    block = max(1, BLOCK_VALUES // world)
    # Behind the median rank, to trim each stretch to its late steps (with half the ranks
    # late the median sits halfway, which still tells late from on time; how far behind the
    # others a spell's ranks were is measured by `_charge`, against the ranks in no spell).
    behind = np.concatenate([lateness(run.earliness[idx[lo:lo + block]])[:, candidates]
                             for lo in range(0, n, block)])  # [measured steps, candidates]
    found = []  # (rank, start, end, late fraction)
    for c, r in enumerate(candidates):
        found += _stretches_of(behind[:, c], [(int(starts[a]), int(starts[b - 1]) + SPELL_STEPS)
                                              for a, b in _runs(late_in[:, r])], int(r))
    groups = _together(found)
    if not groups:
        return [], lead
    spells = [{"ranks": sorted({f[0] for f in g}), "start": min(f[1] for f in g),
               "end": max(f[2] for f in g), "late_fraction": float(np.mean([f[3] for f in g]))}
              for g in groups]
    _charge(run, idx, spells, lead, block)
    out = []
    for sp in sorted(spells, key=lambda sp: sp["start"]):
        a, b = sp["start"], sp["end"]
        out.append({"ranks": sp["ranks"], "first_step": int(run.step[idx[a]]),
                    "last_step": int(run.step[idx[b - 1]]), "steps": b - a,
                    "late_fraction": sp["late_fraction"], "behind_us": sp["behind_us"],
                    "cost_us_per_step": sp["cost"] / max(sp["known"], 1)})
    return out, lead


def _stretches_of(col: np.ndarray, windows: list[tuple[int, int]],
                  rank: int) -> list[tuple[int, int, int, float]]:
    """One rank's spells from its runs of late windows [start, end): each trimmed to the
    steps it was late by half its offset there and extended while it stays so (or unknown;
    `_reach`), runs that then touch merged; none unless the rest of the run holds SPELL_STEPS
    steps and the rank was late there at most half as often as in its spells. The fraction of
    a spell's steps the rank was late counts the steps it was known in, by the spell's own
    offset."""
    n = col.size
    known = np.isfinite(col)
    own: list[list] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for a, b in windows:
            off = float(np.nanmedian(col[a:b]))
            late = col >= 0.5 * off
            go_on = late | ~known
            while a < b and not late[a]:
                a += 1
            while b > a and not late[b - 1]:
                b -= 1
            a = _reach(go_on, a - 1, -1) + 1
            b = _reach(go_on, b, 1)
            if own and a <= own[-1][1]:
                own[-1][1] = max(own[-1][1], b)
            else:
                own.append([a, b, off])
        own = [sp for sp in own if sp[1] - sp[0] >= SPELL_STEPS]
        covered = np.zeros(n, dtype=bool)
        for a, b, _ in own:
            covered[a:b] = True
        if not own or n - covered.sum() < SPELL_STEPS:
            return []
        late = col >= 0.5 * float(np.median([sp[2] for sp in own]))
    if _share(late, known, ~covered) > 0.5 * _share(late, known, covered):
        return []
    span = np.zeros(n, dtype=bool)
    out = []
    for a, b, off in own:
        span[:] = False
        span[a:b] = True
        out.append((rank, a, b, _share(col >= 0.5 * off, known, span)))
    return out


def _reach(go_on: np.ndarray, i: int, step: int) -> int:
    """Where a spell's edge moves from step `i` outward (`step` -1 or 1): past each step on
    which `go_on` holds, and past up to SPELL_GAP steps in a row on which it does not when one
    on which it does follows: the first step of no spell's, or -1 or the end. One step late
    by less than half the offset stopped a spell there (steps 40-119 read as 49-119)."""
    edge, misses = i, 0
    while 0 <= i < go_on.size and misses <= SPELL_GAP:
        if go_on[i]:
            edge, misses = i + step, 0
        else:
            misses += 1
        i += step
    return edge


def _share(late: np.ndarray, known: np.ndarray, where: np.ndarray) -> float:
    """The fraction of the known steps of `where` in which the rank was late (0 with none)."""
    k = int((known & where).sum())
    return float((late & known & where).sum() / k) if k else 0.0


def _charge(run: Run, idx: np.ndarray, spells: list[dict], lead: np.ndarray,
            block: int) -> None:
    """Fills `lead` and each spell's `behind_us` and `cost` (its charged lead, summed over the
    steps its ranks were known in, and their count `known`): per step, the latest rank of the
    spells active then against every rank in none of them (see the module doc). A step whose
    spell ranks are all unknown is charged nothing and not counted."""
    n, count = idx.size, len(spells)
    ranks = sorted({r for sp in spells for r in sp["ranks"]})
    col = {r: c for c, r in enumerate(ranks)}
    cols = np.array(ranks)
    spell_of = np.full((n, len(ranks)), -1)  # [step, spell rank]: its spell active then
    for i, sp in enumerate(spells):
        for r in sp["ranks"]:
            spell_of[sp["start"]:sp["end"], col[r]] = i
    steps = np.flatnonzero((spell_of >= 0).any(axis=1))
    which = np.full(n, -1)  # the spell charged at each step
    ahead = np.full(n, np.nan)
    keys, gaps = [], []  # (step * count + spell, how far its latest rank was behind the rest)
    for lo in range(0, steps.size, block):
        at = steps[lo:lo + block]
        x = run.earliness[idx[at]]
        x = np.where(np.isfinite(x), x, np.inf)  # unknown: never the latest
        of = spell_of[at]
        active = of >= 0
        mine = np.where(active, x[:, cols], np.inf)
        rest = x.copy()
        rest[:, cols] = np.where(active, np.inf, x[:, cols])
        rest = np.where(np.isinf(rest), np.nan, rest)
        who = np.argmin(mine, axis=1)
        latest = mine[np.arange(at.size), who]
        with warnings.catch_warnings():  # a row with no known rank at rest: NaN, not counted
            warnings.simplefilter("ignore", RuntimeWarning)
            first_rest = np.nanmin(rest, axis=1)
            median_rest = np.nanmedian(rest, axis=1)
        seen = np.isfinite(latest)
        which[at] = np.where(seen, of[np.arange(at.size), who], -1)
        ahead[at] = np.where(seen, first_rest - latest, np.nan)
        # Each spell's own latest rank at each of its steps, charged or not (a spell inside
        # another's, never the latest of the two, is late all the same): grouped by step and
        # spell with one sort, not a loop over the spells.
        t, c = np.nonzero(active)
        key = at[t] * count + of[t, c]
        val = x[t, cols[c]]
        order = np.lexsort((val, key))
        key, val, t = key[order], val[order], t[order]
        firsts = np.r_[True, key[1:] != key[:-1]]  # the lowest earliness of each group
        gap = median_rest[t[firsts]] - val[firsts]
        keys.append(key[firsts])
        gaps.append(gap)
    key, gap = np.concatenate(keys), np.concatenate(gaps)
    spell_id = key % count
    for i, sp in enumerate(spells):
        g = gap[(spell_id == i) & np.isfinite(gap)]
        sp["behind_us"] = max(float(np.median(g)), 0.0) if g.size else 0.0
    caps = np.array([sp["behind_us"] for sp in spells])
    charged = (which >= 0) & np.isfinite(ahead)
    got = np.clip(ahead[charged], 0.0, caps[which[charged]])
    lead[charged] = got
    cost = np.bincount(which[charged], weights=got, minlength=count)
    for i, sp in enumerate(spells):
        known = (spell_id == i) & np.isfinite(gap)
        sp["cost"], sp["known"] = float(cost[i]), int(known.sum())


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) runs of True in `mask`."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def _together(found: list[tuple]) -> list[list[tuple]]:
    """Groups the (rank, start, end, ...) stretches that overlap by SAME_SPELL of the longer
    of the two: a slow node's ranks turn late together."""
    groups: list[list[tuple]] = []
    for f in sorted(found, key=lambda f: (f[1], f[0])):
        for g in groups:
            a, b = g[0][1], g[0][2]
            if min(b, f[2]) - max(a, f[1]) >= SAME_SPELL * max(b - a, f[2] - f[1]):
                g.append(f)
                break
        else:
            groups.append([f])
    return groups
