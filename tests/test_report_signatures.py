"""The diagnosis's figures on hand-built runs whose truth is known (from a review helper's
reproductions): what a steady offset costs a step, the transfer's autocorrelation, files that
skip steps, warm-up steps kept out of the regimes and the coupling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpupace.report.diagnose import aligned_spread, diagnose, follows
from gpupace.report.load import to_run
from gpupace.telemetry import StepRecord

pytestmark = pytest.mark.timeout(120)


def _run(e, step_us, transfer_us, sites=None, steps=None, warmup=0):
    """A run from earliness [steps, N], step times and transfers; per-site spreads `sites`
    [steps, S] (default: one site, the spread of the step)."""
    recs = []
    for k, row in enumerate(e):
        ss = np.array([np.ptp(row)]) if sites is None else sites[k]
        recs.append(StepRecord(step=int(steps[k]) if steps is not None else k, time_s=0.1 * k,
                               step_time_us=float(step_us[k]), spread_us=float(ss.max()),
                               residual_us=0.0, transfer_us=float(transfer_us[k]),
                               straggler=int(np.argmin(row)), active=False, earliness_us=row,
                               wait_us=np.zeros(row.size), delay_us=np.zeros(row.size),
                               site_spread_us=ss))
    header = {"world_size": e.shape[1], "config": {"warmup_steps": warmup}, "source": "pacer"}
    return to_run("r", Path("r.jsonl"), header, recs, [])


def _mode(d, name):
    return next(m for m in d.modes if m.mode == name)


def test_a_steady_offset_costs_what_it_adds_over_the_latest_other_rank():
    """64 ranks with 1 ms of arrival noise, rank 5 always 4 ms later: the step ends at the last
    arrival, so without the offset it would end at the latest other rank, ~1.7 ms sooner, not
    4 ms (the offset behind the median rank, which the ideal step took off before)."""
    rng = np.random.default_rng(5)
    late = rng.normal(0.0, 1000.0, size=(400, 64))
    late[:, 5] += 4000.0
    step_us = 100_000.0 + late.max(axis=1)
    fixed = 100_000.0 + np.maximum(np.delete(late, 5, axis=1).max(axis=1), late[:, 5] - 4000.0)
    d = diagnose(_run(late.max(axis=1, keepdims=True) - late, step_us, np.full(400, 3000.0)))
    s = d.summary
    assert s["steady_offset_us"] == pytest.approx(4000.0, rel=0.05)  # the headline's figure
    saving = float((step_us - fixed).mean())  # 1.70 ms
    assert s["locality_cost_us"] == pytest.approx(saving, rel=0.15)
    assert _mode(d, "locality").lost_us / 400 == pytest.approx(saving, rel=0.15)
    assert s["ideal_step_us"] == pytest.approx(np.percentile(fixed, 5), rel=0.01)


def test_independent_transfer_noise_is_not_fabric_contention():
    """Transfers with 15% noise, independent from step to step: the smoothed series the step
    times are matched with has a lag-1 autocorrelation of 0.5 by construction, the recorded
    one ~0, which is what the fabric signature reads."""
    rng = np.random.default_rng(1)
    e = rng.normal(0.0, 50.0, size=(400, 8))
    e -= e.min(axis=1, keepdims=True)
    x = 5000.0 * (1.0 + 0.15 * rng.standard_normal(400))
    d = diagnose(_run(e, 100_000.0 + 3.0 * x + np.ptp(e, axis=1), x))
    fab = _mode(d, "fabric_contention")
    assert abs(fab.evidence["transfer_lag1_autocorrelation"]) < 0.15
    assert fab.verdict == "not enough evidence" and fab.share == 0.0


def test_records_written_one_step_in_k_are_not_aligned_across_the_gaps():
    """`telemetry_every` = 4: the record before step 8 is step 4's, not step 7's, so step 8's
    time is matched with its own spread, not with step 4's later sites."""
    e = np.zeros((4, 2))
    sites = np.array([[1.0, 500.0], [2.0, 600.0], [3.0, 700.0], [4.0, 800.0]])
    every4 = _run(e, np.full(4, 1e5), np.full(4, 300.0), sites=sites, steps=[0, 4, 8, 9])
    np.testing.assert_array_equal(follows(every4), [False, False, False, True])
    np.testing.assert_array_equal(aligned_spread(every4), [500.0, 600.0, 700.0, 700.0])
    each = _run(e, np.full(4, 1e5), np.full(4, 300.0), sites=sites)
    np.testing.assert_array_equal(aligned_spread(each), [500.0, 500.0, 600.0, 700.0])


def test_fabric_contention_is_found_in_a_file_of_one_step_in_four():
    """Contention that varies slowly (AR(1), 0.98 a step) in a file that keeps one step in 4,
    the pacer's default at 256 ranks: the autocorrelation is read between consecutive records
    (0.98^4), not between steps one apart, which such a file never has (a review helper's
    `gpupace simulate --preset fabric`: fabric 'likely' in the full file, 0 when thinned)."""
    rng = np.random.default_rng(3)
    n = 1600
    x = np.empty(n)
    x[0] = 0.0
    for k in range(1, n):
        x[k] = 0.98 * x[k - 1] + 0.2 * rng.standard_normal()
    transfer = 5000.0 * np.exp(0.5 * x / x.std())
    e = rng.normal(0.0, 30.0, size=(n, 8))
    e -= e.min(axis=1, keepdims=True)
    step_us = 100_000.0 + 3.0 * transfer + np.ptp(e, axis=1)
    kept = np.arange(0, n, 4)
    run = _run(e[kept], step_us[kept], transfer[kept], steps=kept)
    assert run.record_gap == 4 and any("one record in 4 steps" in note for note in run.notes)
    # the header's telemetry_every, where the writer gave it: a file that lost every other
    # record of one step in 1 is no file of one step in 2
    run.header["telemetry_every"] = 1
    assert run.record_gap == 1
    run.header["telemetry_every"] = 4
    fab = _mode(diagnose(run), "fabric_contention")
    assert fab.evidence["transfer_lag1_autocorrelation"] > 0.6
    assert fab.verdict != "not enough evidence" and fab.share > 0.5


def test_a_slowdown_of_every_rank_alike_is_no_coordination_cost():
    """A checkpoint (+200 ms on every rank, one step in 100) moves no rank relative to the
    others: its time goes to "unattributed", not to the spread's modes (before the cap on
    each part, runtime_jitter took 85% of the lost time, 'likely', naming random ranks)."""
    rng = np.random.default_rng(7)
    n, world = 1000, 16
    arrive = rng.normal(0.0, 300.0, size=(n, world))
    transfer = 3000.0 * (1.0 + 0.01 * rng.standard_normal(n))
    step_us = 100_000.0 + np.ptp(arrive, axis=1) + transfer
    step_us[::100] += 200_000.0
    d = diagnose(_run(arrive.max(axis=1, keepdims=True) - arrive, step_us, transfer))
    s = d.summary
    assert s["unattributed_us"] > 0.8 * s["lost_us"], s
    for mode in ("runtime_jitter", "sync_amplification", "fabric_contention"):
        assert _mode(d, mode).share < 0.1, (mode, _mode(d, mode))


def test_transfer_bursts_are_named_as_regimes_or_fabric_bursts_and_possible_at_most():
    """The transfer x3 for 20 steps in every 100: a runtime's regimes and bursts of contention
    give the same telemetry (one transfer a collective); runtime_jitter was 'likely, 1.00'
    with advice about cores and allocators alone."""
    rng = np.random.default_rng(11)
    n = 1000
    transfer = 3000.0 * (1.0 + 0.02 * rng.standard_normal(n))
    transfer[(np.arange(n) % 100) < 20] *= 3.0
    e = rng.normal(0.0, 30.0, size=(n, 8))
    e -= e.min(axis=1, keepdims=True)
    d = diagnose(_run(e, 100_000.0 + transfer + np.ptp(e, axis=1), transfer))
    jit = _mode(d, "runtime_jitter")
    assert jit.verdict == "possible" and jit.share > 0.5, (jit.verdict, jit.share)
    assert jit.evidence["regime_switching"] and jit.evidence["regimes_or_fabric_bursts"]
    assert "contention that comes and goes on the fabric" in jit.action


def test_warm_up_steps_are_kept_out_of_the_regimes_and_the_coupling():
    """60 warm-up steps with 4x the transfer (NCCL's start) and small later-site spreads: past
    the warm-up there is one transfer level and no coupling, as in the same run without them."""
    rng = np.random.default_rng(2)
    n, w = 460, 60
    e = rng.exponential(800.0, size=(n, 8))
    e -= e.min(axis=1, keepdims=True)
    x = 5000.0 * (1.0 + 0.02 * rng.standard_normal(n))
    x[:w - 1] *= 4.0
    step_us = 100_000.0 + 3.0 * x + np.ptp(e, axis=1)
    step_us[w + np.array([50, 170, 300])] += 30_000.0  # three stalls
    sites = np.stack([np.ptp(e, axis=1)] * 4, axis=1)
    sites[:w - 1, 1:] *= 0.05
    with_warmup = diagnose(_run(e, step_us, x, sites=sites, warmup=w))
    without = diagnose(_run(e[w:], step_us[w:], x[w:], sites=sites[w:], steps=np.arange(w, n)))
    for d in (with_warmup, without):
        assert _mode(d, "runtime_jitter").evidence["regime_switching"] is False
        assert _mode(d, "sync_amplification").evidence["coupling_index"] == 0.0


@pytest.mark.parametrize("spp, unit", [(None, "steps/s"), (1.0, "steps/s"), (32.0, "samples/s")])
def test_throughput_is_in_samples_only_when_a_step_has_more_than_one(spp, unit):
    """A Pacer writes samples_per_step 1.0 unless told: its throughput is steps/s, as its own
    summary() says."""
    from gpupace.report.html import run_summary

    e = np.random.default_rng(0).exponential(100.0, size=(40, 4))
    run = _run(e, np.full(40, 1e5), np.full(40, 300.0))
    if spp is not None:
        run.header["samples_per_step"] = spp
    assert run_summary(run, diagnose(run))["throughput_unit"] == unit


def test_a_last_rank_share_of_few_clear_steps_says_how_few():
    """Rank 3 is 5 ms late in ~8% of 400 steps, the rest have a spread of noise (no clear
    last rank): it was last in all the clear steps, which the headline must not call 100% of
    the steps; the rotation of late ranks counts those same steps, not the noise's ties."""
    from gpupace.report.ranks import clear_last
    from gpupace.report.text import headline

    rng = np.random.default_rng(3)
    e = rng.normal(0.0, 20.0, size=(400, 8))
    hit = rng.random(400) < 0.08
    e[hit, 3] -= 5000.0
    e -= e.min(axis=1, keepdims=True)
    run = _run(e, 100_000.0 + np.ptp(e, axis=1) + rng.normal(0.0, 100.0, 400),
               np.full(400, 3000.0))
    d = diagnose(run)
    clear = int(clear_last(run).sum())
    assert clear == int(hit.sum())
    assert f"rank 3 last in 100% of the {clear} steps with a clear last rank (400 measured)" \
        in headline(d)
    amp = _mode(d, "sync_amplification")
    # (was 0.997, from 344 steps of noise-level spread)
    assert amp.evidence["late_rank_rotation"] == 0.0
    assert amp.evidence["steps_with_spread_excess"] <= clear


def test_a_rank_last_in_a_few_clear_steps_is_not_persistent():
    from gpupace.report.ranks import MIN_CLEAR_STEPS, late_rank

    e = np.zeros((200, 4))  # all ranks together: no clear last rank
    e[:MIN_CLEAR_STEPS - 1] = [3000.0, 0.0, 2500.0, 2800.0]  # but in 9 steps, rank 1
    lr = late_rank(_run(e, np.full(200, 1e5), np.full(200, 300.0)))
    assert lr["rank"] == 1 and lr["last_fraction"] == 1.0 and not lr["persistent"]


def test_the_spike_threshold_shown_is_the_one_applied():
    """Step times steady to 0.01%, 10 steps 0.5% longer and 10 steps 5% longer: the IQR rule
    alone would call all 20 spikes, the floor of 1% of the median step keeps the 10 long ones.
    The evidence must show the threshold that was applied (the rule's, before, with the 20
    steps above it and 10 counted)."""
    rng = np.random.default_rng(2)
    n = 300
    st = 1e5 + rng.normal(0.0, 10.0, n)
    st[10:20] += 500.0
    st[50:60] += 5000.0
    e = rng.normal(0.0, 20.0, size=(n, 8))
    e -= e.min(axis=1, keepdims=True)
    ev = _mode(diagnose(_run(e, st, np.full(n, 300.0))), "runtime_jitter").evidence
    assert ev["spike_steps"] == 10
    assert int((st > ev["spike_threshold_us"]).sum()) == 10
