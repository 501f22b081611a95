"""`gpupace.report.spells`: ranks, or groups of ranks, late for a stretch of the run only,
found with their steps, charged what they cost, and named in the report's words; none where
ranks are late at random, steadily, or all run long."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_report_ranks import _late, _run

from gpupace.report.diagnose import SUMMARY_KEYS, diagnose
from gpupace.report.html import findings
from gpupace.report.spells import late_spells
from gpupace.report.text import cost_line, headline

pytestmark = pytest.mark.timeout(120)


def _in_turn(late_by_block: list, steps: int = 100, world: int = 16):
    """A run of blocks of `steps` steps, in each the block's rank or ranks (or none) 3 ms
    late, 50 us of noise; each step ends at its last arrival (100 ms + its lateness). Returns
    the run and what each step would have taken had its last rank arrived with the
    next-latest."""
    def late(r):
        return {} if r is None else {q: 3000.0 for q in np.atleast_1d(r)}

    e = np.concatenate([_late(steps, world, late(r), seed=i)
                        for i, r in enumerate(late_by_block)])
    late = e.max(axis=1, keepdims=True) - e  # behind the earliest rank
    top2 = np.sort(late, axis=1)[:, -2:]
    return _run(e, 1e5 + top2[:, 1]), 1e5 + top2[:, 0]


def test_ranks_late_in_turn_are_named_as_late_spells_with_their_cost():
    """Ranks 3, 7, 11 and 2 late in turn, each 3 ms for 100 steps: no rank is late in most
    steps (no locality) and every step pays, so the 5th-percentile step held the lateness and
    the report said "nothing worth diagnosing" against a true 2.8% loss. Each spell is found,
    its cost taken off the ideal step, and the time goes to sync_amplification with its own
    advice (not placement)."""
    run, fixed = _in_turn([3, 7, 11, 2])
    found, lead = late_spells(run)
    assert [(s["ranks"], s["first_step"], s["last_step"]) for s in found] == \
        [([3], 0, 99), ([7], 100, 199), ([11], 200, 299), ([2], 300, 399)]
    assert all(s["behind_us"] == pytest.approx(3000.0, abs=100.0) for s in found)
    saving = run.step_time[1:] - fixed[1:]  # the first step has no step time
    assert lead.mean() == pytest.approx(saving.mean(), rel=0.02)
    d = diagnose(run)
    assert d.summary["lost_fraction"] == pytest.approx(saving.sum() / run.step_time[1:].sum(),
                                                       rel=0.05)
    amp = next(m for m in d.modes if m.mode == "sync_amplification")
    assert amp.verdict == "likely" and amp.share > 0.9 and sorted(amp.ranks) == [2, 3, 7, 11]
    assert "not placement" in amp.action
    assert headline(d).startswith("r: ranks 2, 3, 7, 11 (4 ranks) late in spells, one at a "
                                  "time (4 spells, 100% of the steps: steps 0-99 rank 3, "), \
        headline(d)
    assert "typically 3.0 ms behind the others; leading cause sync_amplification" \
        in headline(d)


def test_a_rank_late_from_halfway_on_is_a_late_spell():
    """Rank 5 3 ms late from step 200 of 400 on: the headline says when, and the time it cost
    has a cause (before: "no single cause with enough evidence")."""
    run, _ = _in_turn([None, None, 5, 5])
    d = diagnose(run)
    assert headline(d).startswith("r: rank 5 late in steps 200-399 only (a late spell, late in "
                                  "100% of its steps), typically 3.0 ms behind the others; "
                                  "leading cause sync_amplification"), headline(d)
    assert cost_line(d).startswith("rank 5, in its late spell (50% of the steps), arrived after "
                                   "every other rank: 1.4")


def test_a_step_of_a_spell_late_by_less_does_not_end_it():
    """Rank 5 3 ms late in steps 40-119, but by 0.5 ms only at steps 48 and 115 (still last):
    the spell read as steps 49-119, its edge stopped at the first step late by less than half
    the offset, and its cost and share of the steps with it."""
    e = _late(200, 16, {}, seed=1)
    e[40:120] = _late(80, 16, {5: 3000.0}, seed=2)
    e[[48, 115]] = _late(2, 16, {5: 500.0}, seed=3)
    run = _run(e)
    (spell,), _ = late_spells(run)
    assert (spell["ranks"], spell["first_step"], spell["last_step"]) == ([5], 40, 119), spell
    assert spell["late_fraction"] == pytest.approx(78 / 80)


@pytest.mark.parametrize("world", [2, 3, 16])
def test_random_weakly_or_always_late_ranks_make_no_late_spell(world):
    """No spell where a rank is late at random (heavy-tailed noise, 2000 steps), steadily but
    not always (late by half its offset in 80-85% of the steps all run long: many windows
    reach a spell's share, but the rest of the run is no different), or all run long (3 ms)."""
    weak = {2: 800.0, 3: 800.0, 16: 500.0}[world]
    for seed in range(6):
        a = np.random.default_rng(seed).standard_t(3, size=(2000, world)) * 200.0
        a[:, 1] += (0.0, weak, 3000.0)[seed % 3]
        e = a.max(axis=1, keepdims=True) - a
        found, lead = late_spells(_run(e, 1e5 + e.max(axis=1)))
        assert found == [] and not lead.any(), (seed, found)


def test_nodes_late_in_turn_are_late_spells_of_their_ranks_together():
    """Ranks 0-3 (a node) 3 ms late in steps 0-149, ranks 8-11 in 150-299, nobody after: no
    rank of a node is last in most steps, yet each node's spell is found with its four ranks,
    and its time (each step's lead of the node over every other rank) taken off the ideal."""
    blocks = [range(0, 4), range(8, 12), None]
    run, _ = _in_turn([b for b in blocks for _ in range(3)], steps=50)
    found, lead = late_spells(run)
    assert [(s["ranks"], s["first_step"], s["last_step"]) for s in found] == \
        [([0, 1, 2, 3], 0, 149), ([8, 9, 10, 11], 150, 299)]
    assert all(s["behind_us"] == pytest.approx(3000.0, abs=100.0) for s in found)
    assert lead[:300].mean() == pytest.approx(3000.0, rel=0.05) and not lead[300:].any()
    d = diagnose(run)
    assert d.summary["lost_fraction"] == pytest.approx(2 * 3000.0 / (3 * 1e5 + 2 * 3000.0),
                                                       rel=0.1)
    assert headline(d).startswith("r: ranks 0, 1, 2, 3, 8, 9, 10, 11 (8 ranks) late in spells, "
                                  "one at a time (2 spells, 67% of the steps: steps 0-149 "
                                  "ranks 0, 1, 2, 3 (4 ranks), steps 150-299 ranks 8, 9, 10, "
                                  "11 (4 ranks)), typically 3.1 ms behind the others"), \
        headline(d)  # the latest of four ranks with 50 us of noise


def _arrivals(world: int, steps: int, late: list[tuple], seed: int = 0) -> tuple:
    """A run of `steps` with 50 us of arrival noise, each (ranks, first, end, us) of `late`
    that many us later in steps [first, end); each step ends at its last arrival. Returns the
    run and the late ranks' true cost a step: their lead over the ranks on time."""
    a = np.random.default_rng(seed).normal(0.0, 50.0, (steps, world))
    lat = np.zeros((steps, world), dtype=bool)
    for ranks_, lo, hi, us in late:
        a[lo:hi, list(ranks_)] += us
        lat[lo:hi, list(ranks_)] = True
    on_time = np.where(lat, -np.inf, a).max(axis=1)
    cost = np.clip(a.max(axis=1) - on_time, 0.0, None)
    e = a.max(axis=1, keepdims=True) - a
    return _run(e, 1e5 + np.ptp(a, axis=1)), cost


def test_spells_at_once_share_their_steps_and_are_charged_once():
    """Ranks 3, 7 and 11 each 3 ms late over stretches that overlap: in the overlap neither
    leads the other, yet both lead every rank on time. Each spell's lead was taken over the
    other spell's rank too, and the cost read 0.76 ms a step against a true 2.72 (the rest
    went to runtime_jitter), '192% of the steps', 'one at a time'."""
    run, cost = _arrivals(16, 600, [((3,), 50, 450, 3000.0), ((7,), 150, 550, 3000.0),
                                    ((11,), 250, 600, 3000.0)])
    d = diagnose(run)
    sp = d.summary["late_spells"]
    assert sp["cost_us_per_step"] == pytest.approx(cost.mean(), rel=0.05)
    assert sp["steps_fraction"] == pytest.approx(550 / 600, abs=0.02) and sp["overlapping"]
    assert "late in spells, some at once (3 spells, 92% of the steps" in headline(d)
    assert next(m for m in d.modes if m.mode == "runtime_jitter").share == 0.0


def test_a_node_of_half_the_ranks_is_read_behind_the_ranks_on_time():
    """Two nodes of 4 ranks late in turn, 100 steps each: the median of all ranks lies
    halfway, and read behind it the spells' offset was 1.5 ms and the loss half the truth."""
    late = [((0, 1, 2, 3) if k % 2 == 0 else (4, 5, 6, 7), 100 * k, 100 * k + 100, 3000.0)
            for k in range(6)]
    run, cost = _arrivals(8, 600, late)
    d = diagnose(run)
    true_lost = cost[1:].sum() / run.step_time[1:].sum()
    assert d.summary["lost_fraction"] == pytest.approx(true_lost, rel=0.1)
    assert d.summary["late_spells"]["behind_us"] == pytest.approx(3000.0, rel=0.1)


def test_a_spell_inside_a_later_ranks_spell_costs_nothing_and_is_still_behind():
    """Rank 9 1 ms late in steps 300-399, inside rank 5's 3 ms spell (100-499): rank 9 never
    leads, so its spell costs 0 (it read rank 5's 2 ms), yet it was 1 ms behind the others."""
    run, _ = _arrivals(16, 600, [((5,), 100, 500, 3000.0), ((9,), 300, 400, 1000.0)])
    found, _ = late_spells(run)
    by = {tuple(s["ranks"]): s for s in found}
    assert by[(9,)]["cost_us_per_step"] < 50.0
    assert by[(9,)]["behind_us"] == pytest.approx(1000.0, rel=0.1)
    # the two spells' lead over the ranks on time, charged to the latest, rank 5: 3 ms
    assert by[(5,)]["cost_us_per_step"] == pytest.approx(3000.0, rel=0.05)


def test_a_steady_late_rank_is_named_before_another_ranks_spell():
    """Rank 1 3 ms late all run long, rank 5 5 ms late in steps 200-399: the headline named
    rank 5's spell alone, and the locality it blamed had no rank in it."""
    run, _ = _arrivals(16, 600, [((1,), 0, 600, 3000.0), ((5,), 200, 400, 5000.0)])
    line = headline(diagnose(run))
    assert line.startswith("r: rank 1 last in 67% of steps, typically 3.0 ms behind the median "
                           "rank; also rank 5 late in steps 200-399 only"), line


def test_steps_a_spell_rank_is_unknown_in_count_neither_late_nor_on_time():
    """Rank 5 3 ms late in steps 200-399, its row invalid (NaN) in 30% of them: the spell was
    'late in 72% of its steps' and charged 0.7 of its cost; the unknown steps now count in
    neither."""
    run, _ = _arrivals(16, 600, [((5,), 200, 400, 3000.0)])
    rng = np.random.default_rng(1)
    gone = 200 + rng.choice(200, 60, replace=False)
    run.earliness[gone, 5] = np.nan
    (sp,), _ = late_spells(run)
    assert sp["ranks"] == [5] and (sp["first_step"], sp["last_step"]) == (200, 399)
    assert sp["late_fraction"] == 1.0
    assert sp["cost_us_per_step"] == pytest.approx(2920.0, rel=0.05)


def test_every_run_in_findings_json_has_the_same_summary_keys():
    """A script reads findings.json's runs by one schema: a run too short to diagnose lacked
    18 of its summary's keys (lost_fraction, late_rank, ...), and runs without steadily late
    ranks or late spells lacked those; each is null now (`diagnose.SUMMARY_KEYS`)."""
    spells, _ = _in_turn([None, 3, 5])
    steady, _ = _arrivals(16, 200, [((4,), 0, 200, 3000.0)])
    short, _ = _arrivals(16, 20, [])
    runs = [spells, steady, short]
    diags = [diagnose(r) for r in runs]
    assert diags[0].summary.get("late_spells") and diags[1].summary.get("late_group")
    for d in diags:  # a key a diagnosis gains must be listed, or some runs would lack it
        assert set(d.summary) <= set(SUMMARY_KEYS), set(d.summary) - set(SUMMARY_KEYS)
    keys = [set(r["summary"]) for r in findings(runs, diags)["runs"]]
    assert keys[0] == keys[1] == keys[2] and keys[0] >= set(SUMMARY_KEYS)
    short_summary = findings([short], diags[2:])["runs"][0]["summary"]
    assert short_summary["lost_fraction"] is None and "only 20 measured" in short_summary["note"]


def test_a_comparison_with_a_run_of_no_measured_step_says_nothing_of_its_p99():
    """It said "the p99 of 0 measured steps is about their slowest step"."""
    from gpupace.report.compare import notes

    few = {"measured_steps": 20, "throughput_unit": "steps/s"}
    assert any("p99 of 20 measured steps" in n for n in notes(few, {**few, "measured_steps": 50},
                                                               False))
    assert not any("p99" in n for n in notes({**few, "measured_steps": 0}, few, False))


def test_the_readme_names_every_key_a_script_reads():
    """findings.json's and the telemetry records' keys were documented nowhere but in code (a
    review): the README's "The files, for scripts" names each."""
    import dataclasses
    from pathlib import Path

    from gpupace.pacer import PACER_HEADER_FIELDS
    from gpupace.telemetry import END_FIELDS, HEADER_FIELDS, StepRecord

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### The files, for scripts")[1].split("\n## ")[0]
    steady, _ = _arrivals(16, 200, [((4,), 0, 200, 3000.0)])
    doc = findings([steady], [diagnose(steady)])
    run = doc["runs"][0]
    keys = {*doc, *run, *run["summary"], *run["modes"][0], *HEADER_FIELDS,
            *PACER_HEADER_FIELDS, *(f.name for f in dataclasses.fields(StepRecord)),
            *END_FIELDS, "end_mark"}
    named = set(re.findall(r"`([a-z0-9_]+)`", section))
    for stem, alts in re.findall(r"`([a-z_]+)_\{([a-z0-9,]+)\}`", section):  # `x_{mean,p99}`
        named |= {f"{stem}_{a}" for a in alts.split(",")}
    assert not keys - named, sorted(keys - named)


def test_a_share_of_steps_is_of_the_measured_steps():
    """Rank 2 last in 28 of 31 measured steps, the other 3 without a clear last rank: the
    headline said "last in 100% of steps" (of the clear ones), where the histogram had 28."""
    run, _ = _arrivals(16, 31, [((2,), 0, 28, 3000.0)])
    d = diagnose(run)
    assert d.summary["late_rank"]["steps_with_clear_last"] == 28
    assert headline(d).startswith("r: rank 2 last in 90% of steps"), headline(d)
    assert "rank 2 " in cost_line(d) and "(last in 90%)" in cost_line(d), cost_line(d)


def test_a_verdict_follows_its_confidence_at_the_thresholds():
    """Nothing sat near the likely/possible boundary: a threshold moved to 0.8 went unseen."""
    from gpupace.report.diagnose import LIKELY, MIN_CONFIDENCE, verdict_of

    assert (LIKELY, MIN_CONFIDENCE) == (0.6, 0.3)  # the README's "likely" and "possible"
    assert [verdict_of(c) for c in (0.6, 0.5999, 0.3, 0.2999, 0.0, 1.0)] == [
        "likely", "possible", "possible", "not enough evidence", "not enough evidence", "likely"]
    run, _ = _arrivals(16, 600, [((1,), 0, 600, 3000.0), ((5,), 200, 400, 5000.0)])
    for m in diagnose(run).modes:
        assert m.verdict == verdict_of(m.confidence), m


def test_lost_time_is_split_without_counting_a_step_twice():
    """A steady late rank and another's spell over the same steps, either one the later: each
    step pays one lead (only its last rank leads every other), so the modes' time and the
    unattributed part add up to the time lost, none of it negative."""
    for steady_us, spell_us in ((3000.0, 5000.0), (5000.0, 3000.0)):
        _split_adds_up([((1,), 0, 600, steady_us), ((5,), 200, 400, spell_us)])


def _split_adds_up(late):
    run, _ = _arrivals(16, 600, late)
    d = diagnose(run)
    assert all(m.lost_us >= 0.0 for m in d.modes)
    assert sum(m.lost_us for m in d.modes) + d.summary["unattributed_us"] == \
        pytest.approx(d.summary["lost_us"], rel=1e-9)
    assert d.summary["unexplained_us"] >= 0.0 and d.summary["low_confidence_us"] >= 0.0
    assert d.summary["late_group"] and d.summary["late_spells"]  # both on the same steps


@pytest.mark.parametrize("steps, persistent", [(9, False), (10, True)])
def test_a_rank_is_persistently_late_from_min_clear_steps_on(steps, persistent):
    """Last in every step with a clear last rank, but too few of them to say more: persistent
    from MIN_CLEAR_STEPS (10) on (the boundary moved by one went unseen)."""
    from gpupace.report.ranks import MIN_CLEAR_STEPS, late_rank

    run, _ = _arrivals(16, steps, [((2,), 0, steps, 3000.0)])
    lr = late_rank(run)
    assert MIN_CLEAR_STEPS == 10 and lr["steps_with_clear_last"] == steps
    assert lr["rank"] == 2 and lr["persistent"] is persistent
