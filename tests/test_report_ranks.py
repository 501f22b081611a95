"""`gpupace.report.ranks`: who is late and what it cost a step, from the clock-free earliness.

Checked by hand on small matrices: NaN ranks (missing, or invalid rows), ties, a step with one
known rank, long runs split into blocks, runs without a clear last rank. The end-to-end test
(CLI, page, findings.json) is in test_report_attribution.py, with the demo-shaped runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpupace.report import ranks
from gpupace.report.diagnose import diagnose
from gpupace.report.load import to_run
from gpupace.report.text import cost_line, headline
from gpupace.telemetry import StepRecord

pytestmark = pytest.mark.timeout(120)

NAN = float("nan")


def test_last_leads_by_hand():
    e = np.array([[3000.0, 0.0, 1000.0, 500.0],  # rank 1 last, 500 before rank 3
                  [0.0, 2000.0, 2500.0, 2200.0],  # rank 0 last, 2000 before rank 1
                  [NAN, 0.0, NAN, NAN],  # one known rank: no lead (unknown)
                  [NAN, 1000.0, 0.0, NAN],  # rank 2 last among the known ones
                  [3000.0, 0.0, 1000.0, NAN],  # rank 3's row invalid: not a tie at 0
                  [0.0, 0.0, 700.0, 900.0]])  # a tie: lead 0
    lead = ranks.last_leads(e, np.array([1, 0, 1, 2, 1, 0]))
    np.testing.assert_array_equal(lead, [500.0, 2000.0, NAN, 1000.0, 1000.0, 0.0])


def _run(earliness: np.ndarray, step_us: float | np.ndarray = 1e5, label: str = "r"):
    """A run from an earliness matrix [steps, N]: the last rank is the lowest, the spread the
    largest; 100 ms steps, or the step times given."""
    recs = []
    step_us = np.broadcast_to(step_us, earliness.shape[:1])
    for k, e in enumerate(earliness):
        known = e[np.isfinite(e)]
        recs.append(StepRecord(step=k, time_s=0.1 * k, step_time_us=float(step_us[k]),
                               spread_us=float(np.ptp(known)) if known.size else NAN,
                               residual_us=0.0, transfer_us=300.0,
                               straggler=int(np.nanargmin(e)) if known.size else -1,
                               active=False, earliness_us=e, wait_us=e,
                               delay_us=np.zeros(e.size)))
    return to_run(label, Path(f"{label}.jsonl"), {"world_size": earliness.shape[1]}, recs, [])


def test_costs_in_blocks_match_one_pass(monkeypatch):
    rng = np.random.default_rng(3)
    e = rng.exponential(3000.0, size=(1001, 7))
    e[rng.random(e.shape) < 0.05] = NAN
    e -= np.nanmin(e, axis=1, keepdims=True)
    run = _run(e)
    whole = ranks.cost_per_rank(run)
    monkeypatch.setattr(ranks, "BLOCK_VALUES", 50)  # 7 steps a block, the last one short
    split = ranks.cost_per_rank(run)
    np.testing.assert_allclose(whole[0], split[0], rtol=1e-12)
    assert whole[1] == pytest.approx(split[1]) and whole[1] == pytest.approx(whole[0].sum())


def _alternating(steps: int = 80) -> np.ndarray:
    """Rank 1 last by 500 us on even steps, rank 0 by 2000 us on odd ones."""
    even, odd = [3000.0, 0.0, 1000.0, 500.0], [0.0, 2000.0, 2500.0, 2200.0]
    return np.array([even if k % 2 == 0 else odd for k in range(steps)])


def test_rank_costs_add_up_to_the_last_ranks_lead():
    run = _run(_alternating())
    c = ranks.rank_costs(run)
    assert c["lead_us_per_step"] == pytest.approx(1250.0)
    assert c["share_of_step"] == pytest.approx(0.0125)
    assert [r["rank"] for r in c["ranks"]] == [0, 1]  # by cost; ranks 2 and 3 cost nothing
    assert [r["cost_us_per_step"] for r in c["ranks"]] == pytest.approx([1000.0, 250.0])
    assert [r["last_fraction"] for r in c["ranks"]] == pytest.approx([0.5, 0.5])
    line = cost_line(diagnose(run))
    assert line.startswith("the last rank alone, by its lead over the next-latest: up to 1.25 ms a "
                           "step on average (1.2% of the mean step): rank 0 1.00 ms (last in 50%), rank 1 "
                           "0.25 ms (last in 50%)"), line


def test_costs_count_the_steps_the_headline_counts():
    """A lead under 1% of the median step makes no clear last rank: the headline counts no
    such step, and neither does the cost (it read "last in 0%" beside a cost before)."""
    e = _alternating()
    e[::2] = [800.0, 0.0, 600.0, 500.0]  # rank 1 last by 500 us of a 100 ms step: no clear last
    c = ranks.rank_costs(_run(e))
    assert [r["rank"] for r in c["ranks"]] == [0]
    assert c["ranks"][0]["last_fraction"] == 1.0
    assert c["lead_us_per_step"] == pytest.approx(1000.0)  # 2000 us on half the steps


def test_no_cost_without_two_ranks_or_a_clear_last_rank():
    assert ranks.rank_costs(_run(np.zeros((40, 1)))) is None  # one rank
    assert ranks.rank_costs(_run(np.full((40, 4), NAN))) is None  # nothing known
    tiny = np.tile([30.0, 0.0, 20.0, 10.0], (40, 1))  # spreads far under 1% of the step
    run = _run(tiny)
    assert ranks.rank_costs(run) is None
    assert diagnose(run).summary["late_cost"] is None and cost_line(diagnose(run)) == ""
    first = _alternating(1)
    short = _run(first, step_us=NAN)  # no step time: nothing measured
    assert ranks.rank_costs(short) is None


def test_a_rank_missing_from_every_record_does_not_hide_another_ranks_offset():
    """Rank 3's row is invalid in every record (NaN earliness) and rank 1 is 3 ms late in every
    step: rank 1's offset, its late steps and their count come from the steps in which it is
    known with another rank; rank 3 gets nothing from no step. (Before, only the steps with
    every rank known counted: none here, and no locality was found.)"""
    rng = np.random.default_rng(0)
    e = rng.uniform(3000.0, 3400.0, size=(200, 5))
    e[:, 1] = rng.uniform(0.0, 100.0, 200)
    e[:, 3] = NAN
    e[::10, 4] = NAN  # and rank 4 is missing from one record in ten
    e -= np.nanmin(e, axis=1, keepdims=True)
    run = _run(e)
    offset, late_in, noise, counted = ranks.locality_offsets(run)
    assert offset[1] == pytest.approx(3150.0, abs=100.0) and late_in[1] == 1.0
    assert offset[3] == 0.0 and late_in[3] == 0.0
    np.testing.assert_array_equal(counted, [200, 200, 200, 0, 180])
    assert np.all(np.abs(offset[[0, 2, 4]]) < 150.0) and 0.0 < noise < 200.0
    # The same figures as with rank 3 left out of the run altogether
    alone = ranks.locality_offsets(_run(np.delete(e, 3, axis=1)))
    np.testing.assert_allclose(np.delete(offset, 3), alone[0])
    np.testing.assert_allclose(np.delete(late_in, 3), alone[1])
    loc = next(m for m in diagnose(run).modes if m.mode == "locality")
    assert loc.ranks == [1] and loc.evidence["late_steps_z"] == pytest.approx(200 ** 0.5)


def test_steps_with_two_ranks_known_of_many_do_not_halve_an_offset():
    """Ranks 2-5 missing together from 60% of the records: in those, the median of the two
    known ranks would be their mean, and rank 1's 3 ms would count as 1.5 (rank 0 as -1.5).
    Such steps are left out: at least three ranks known (both, at two ranks)."""
    rng = np.random.default_rng(1)
    e = rng.uniform(3000.0, 3100.0, size=(300, 6))
    e[:, 1] = rng.uniform(0.0, 100.0, 300)
    e[rng.random(300) < 0.6, 2:] = NAN
    e -= np.nanmin(e, axis=1, keepdims=True)
    offset, late_in, _, counted = ranks.locality_offsets(_run(e))
    assert offset[1] == pytest.approx(3000.0, abs=100.0) and late_in[1] == 1.0
    assert abs(offset[0]) < 100.0
    assert counted[0] == counted[1] == counted[2] < 200


def _late(steps: int, world: int, late: dict[int, float], seed: int = 0,
          noise_us: float = 50.0) -> np.ndarray:
    """Earliness [steps, world] of ranks arriving with `noise_us` of noise (sd), each rank of
    `late` that many us later."""
    a = np.random.default_rng(seed).normal(0.0, noise_us, size=(steps, world))
    for r, us in late.items():
        a[:, r] += us
    return a.max(axis=1, keepdims=True) - a


@pytest.mark.parametrize("late", [range(12, 16), range(8, 16)])
def test_a_late_node_is_named_together_with_its_cost(late):
    """Ranks 12-15 (a node) 3 ms late in every step: none of them is last in most steps, nor
    leads the next-latest (another of the four), yet together they cost each step ~3 ms.
    The headline and the cost line name the four, not "no persistently late rank" and a
    cost of ~0 (as before). With half the ranks late (8-15), the median rank lies halfway:
    their lateness is read behind the others, 3 ms, not 1.5."""
    d = diagnose(_run(_late(200, 16, {r: 3000.0 for r in late})))
    group = d.summary["late_group"]
    assert sorted(group["ranks"]) == list(late)
    assert group["cost_us_per_step"] == pytest.approx(3000.0, rel=0.1)
    assert d.summary["lost_fraction"] == pytest.approx(0.03, rel=0.1)
    names = f"ranks {', '.join(map(str, list(late)[:8]))} ({len(late)} ranks)"
    line = headline(d)
    assert f"{names} steadily late, typically 3.0 ms behind the others (late in 100% of " \
        "steps); leading cause locality" in line, line
    start = f"{names} arrived after every other rank in 100% of the steps, by typically "
    assert cost_line(d).startswith(start), cost_line(d)
    assert float(cost_line(d)[len(start):].split()[0]) == pytest.approx(3.0, abs=0.1)
    # a lower bound, and why: one collective's arrivals a step
    assert f": together at least {group['cost_us_per_step'] / 1e3:.2f} ms a step" in cost_line(d)
    assert "seen at one collective a step" in cost_line(d)
    assert "no persistently late rank" not in line


def test_a_steadily_late_rank_is_said_to_be_last_only_where_it_was():
    """Rank 3 3 ms late in every step, rank 2 later still in half of them: the cost line said
    rank 3 "arrived after every other rank ... in 100% of the steps" (the steps it was late
    by half its offset) by a median lead that counted the others' steps as 0."""
    e = _late(400, 16, {3: 3000.0}, seed=4)
    half = np.random.default_rng(5).random(400) < 0.5
    e[half, 2] -= 4000.0  # rank 2 arrives 1 ms after rank 3 there
    d = diagnose(_run(e))
    assert d.summary["late_group"]["ranks"] == [3]
    m = re.match(r"rank 3 arrived after every other rank in (\d+)% of the steps, by typically "
                 r"([\d.]+) ms", cost_line(d))
    assert m, cost_line(d)
    assert int(m[1]) == pytest.approx(100 * (~half).mean(), abs=2)
    assert float(m[2]) == pytest.approx(3.0, abs=0.1)


def test_a_late_rank_under_the_clear_last_bar_is_still_named():
    """Rank 5 0.45 ms late in every 57 ms step: under the 1% that makes a step's last rank
    count, but a steady offset that locality finds; the headline names it from there."""
    run = _run(_late(200, 16, {5: 450.0}, noise_us=10.0), step_us=57e3)
    assert ranks.late_rank(run) is None  # no step's spread above 1% of the step
    d = diagnose(run)
    assert headline(d).startswith("r: rank 5 steadily late, typically 0.45 ms behind the "
                                  "others"), headline(d)
    assert re.match(r"rank 5 arrived after every other rank in 100% of the steps, by "
                    r"typically 0\.4", cost_line(d)), cost_line(d)


def test_how_far_behind_a_late_rank_is_counts_the_steps_it_was_last():
    """Rank 5 3 ms late in the last 40% of the steps only: 'typically 3.0 ms behind', not the
    median over the whole run (~0: most steps it was on time)."""
    e = np.concatenate([_late(120, 8, {}), _late(80, 8, {5: 3000.0}, seed=1)])
    lr = ranks.late_rank(_run(e))
    assert lr["rank"] == 5 and lr["behind_median_us"] == pytest.approx(3000.0, abs=100.0)


def test_a_step_whose_lead_is_unknown_counts_for_no_cost():
    """Rank 1 last by 2 ms in every step, its earliness missing (an invalid row) in a quarter
    of them: its cost is 2 ms a step over the steps it is known in, not 1.5."""
    e = np.tile([3000.0, 1000.0, 3500.0, 3200.0], (80, 1))
    run = _run(e)
    run.earliness[::4, 1] = NAN
    cost, total = ranks.cost_per_rank(run)
    assert cost[1] == pytest.approx(2000.0) and total == pytest.approx(2000.0)


def test_the_cdf_of_steps_with_a_long_tail_draws_on_a_log_axis(tmp_path):
    """A step 50x the median puts the CDF's axis on a log scale, whose formatter has no
    offset to turn off: ticklabel_format raised there, and the report with it (a CI run's
    subgroup report, whose first steps were slow)."""
    from gpupace.report.plots import cdf

    steps = np.full(200, 1e5)
    steps[5] = 5e6
    assert cdf([_run(_late(200, 4, {}), step_us=steps)], tmp_path) == "cdf.png"
    assert cdf([_run(_late(200, 4, {}), step_us=np.full(200, 1e5))], tmp_path) == "cdf.png"


def test_the_split_of_lost_time_adds_up_to_a_whole():
    """Each share rounded alone read 36% + 16% + 49% = 101%."""
    from gpupace.report.text import whole_percents

    assert whole_percents([0.355, 0.155, 0.49]) == [36, 15, 49]
    assert sum(whole_percents([0.333, 0.333, 0.334])) == 100
    assert whole_percents([0.0, 1.0]) == [0, 100]
    assert whole_percents([0.2, 0.3]) == [20, 30]  # a part of the whole: its own sum
    assert whole_percents([]) == []
