"""`gpupace.report.ranks`: who is late and what it cost a step, from the clock-free earliness.

Checked by hand on small matrices: NaN ranks, ties, a step with one known rank, long runs
split into blocks. The end-to-end test (CLI, page, findings.json) is in
test_report_attribution.py, with the demo-shaped runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpupace.report import ranks
from gpupace.report.diagnose import diagnose
from gpupace.report.load import to_run
from gpupace.report.text import cost_line
from gpupace.telemetry import StepRecord

pytestmark = pytest.mark.timeout(120)

NAN = float("nan")
# Earliness (us) of 4 ranks; the last rank has 0.
E = np.array([[3000.0, 0.0, 1000.0, 500.0],  # rank 1 last, 500 before rank 3
              [0.0, 2000.0, 2500.0, 2200.0],  # rank 0 last, 2000 before rank 1
              [NAN, 0.0, NAN, NAN],  # one known rank: no last, no lead
              [NAN, 1000.0, 0.0, NAN],  # rank 2 last among the known ones
              [0.0, 0.0, 700.0, 900.0]])  # a tie: lead 0


def test_last_leads_by_hand():
    last, lead = ranks.last_leads(E)
    np.testing.assert_array_equal(last, [1, 0, -1, 2, 0])
    np.testing.assert_array_equal(lead, [500.0, 2000.0, 0.0, 1000.0, 0.0])


def test_last_leads_in_blocks_match_one_pass(monkeypatch):
    rng = np.random.default_rng(3)
    e = rng.exponential(800.0, size=(1001, 7))
    e[rng.random(e.shape) < 0.05] = NAN
    whole = ranks.last_leads(e)
    monkeypatch.setattr(ranks, "BLOCK_VALUES", 50)  # 7 steps a block, the last one short
    split = ranks.last_leads(e)
    for a, b in zip(whole, split, strict=True):
        np.testing.assert_array_equal(a, b)
    assert ranks.last_leads(e[:, :1])[0].tolist() == [-1] * 1001  # one rank: nobody waits


def _alternating(steps: int = 80) -> list[StepRecord]:
    """Rank 1 last by 500 us on even steps, rank 0 by 2000 us on odd ones; 100 ms steps."""
    recs = []
    for k in range(steps):
        e = [3000.0, 0.0, 1000.0, 500.0] if k % 2 == 0 else [0.0, 2000.0, 2500.0, 2200.0]
        recs.append(StepRecord(step=k, time_s=k * 0.1, step_time_us=1e5, spread_us=max(e),
                               residual_us=max(e), transfer_us=300.0,
                               straggler=int(np.argmin(e)), active=False, earliness_us=e,
                               wait_us=e, delay_us=[0.0] * 4))
    return recs


def test_rank_costs_add_up_to_the_last_ranks_lead():
    run = to_run("alt", Path("alt.jsonl"), {"world_size": 4}, _alternating(), [])
    c = ranks.rank_costs(run)
    assert c["lead_us_per_step"] == pytest.approx(1250.0)
    assert c["share_of_step"] == pytest.approx(0.0125)
    assert [r["rank"] for r in c["ranks"]] == [0, 1]  # by cost; ranks 2 and 3 cost nothing
    assert [r["cost_us_per_step"] for r in c["ranks"]] == pytest.approx([1000.0, 250.0])
    assert [r["last_fraction"] for r in c["ranks"]] == pytest.approx([0.5, 0.5])
    line = cost_line(diagnose(run))
    assert line.startswith("the last rank held each step up by 1.25 ms on average"), line
    assert "(1.2% of the mean step): rank 0 1.00 ms (last in 50%), rank 1 0.25 ms" in line


def test_no_cost_without_two_ranks_or_measured_steps():
    one = [StepRecord(step=k, time_s=k * 0.1, step_time_us=1e5, spread_us=NAN,
                      residual_us=NAN, transfer_us=300.0, straggler=-1, active=False,
                      earliness_us=[0.0], wait_us=[300.0], delay_us=[0.0]) for k in range(40)]
    assert ranks.rank_costs(to_run("one", Path("one.jsonl"), {"world_size": 1}, one, [])) is None
    first = _alternating(1)
    first[0].step_time_us = NAN  # a job's first step: no exit before it
    short = to_run("short", Path("s.jsonl"), {"world_size": 4}, first, [])
    assert ranks.rank_costs(short) is None
    assert cost_line(diagnose(short)) == ""
