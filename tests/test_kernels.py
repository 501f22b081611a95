"""The Triton kernels on the CPU under TRITON_INTERPRET=1, on their clock-free path: the spin's
clamp, bound and bookkeeping, the stamps, the clock helpers, and the reduction's NumPy twin
against the policy. The update kernel against the policy is in test_kernels_update.py.

TRITON_INTERPRET is set for this module only: the fixture reloads the kernel modules under it
and reloads them back afterwards, so other tests see ordinary compiled kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupace import PaceConfig, policy


def buffers(m: int, start_ns: int = 1_000_000):
    row = torch.zeros(2 + 2 * m)
    row[1:2 + m] = float("nan")
    stamps = torch.zeros(m, 3, dtype=torch.int64)
    clk = torch.tensor([0, start_ns], dtype=torch.int64)
    return row, stamps, clk


def spin_once(k, delay, cap_us, fake_tick=1000, max_reads=None, backoff_ns=0):
    d = torch.tensor([delay], dtype=torch.float32)
    applied = torch.full((1,), -1.0)
    reads = torch.full((1,), -1, dtype=torch.int32)
    clk = torch.tensor([0, 5_000], dtype=torch.int64)
    k["spin"].spin(d, applied, reads, clk, cap_us=cap_us, fake_tick=fake_tick, max_reads=max_reads,
                   backoff_ns=backoff_ns)
    return float(applied[0]), int(reads[0]), int(clk[1])


def expected_applied(delay, cap_us, tick_ns):
    clamped = 0.0 if not delay == delay else min(max(delay, 0.0), cap_us)
    reads = math.ceil(np.float32(clamped) * 1000 / tick_ns) if clamped > 0 else 0
    return reads * tick_ns / 1000, reads


@pytest.mark.parametrize("delay", [float("nan"), -5.0, -math.inf, 0.0, 0.25, 3.0, 7.5, 10.0,
                                   11.0, 1e9, math.inf])
def test_spin_clamps_whatever_the_buffer_holds(k, delay):
    applied, reads, end = spin_once(k, delay, cap_us=10.0, fake_tick=1000)
    want, want_reads = expected_applied(delay, 10.0, 1000)
    assert applied == pytest.approx(want)
    assert reads == want_reads
    assert end == 5_000 + want_reads * 1000  # the virtual clock advanced by what was applied


@pytest.mark.parametrize("delay", [float("nan"), -5.0, 0.25, 3.0, 1e9])
def test_spin_with_backoff_keeps_the_clamp_and_bookkeeping(k, delay):
    # The sleep between reads is nothing on the clock-free path: the loop around it (its
    # guard, the clamp, the bound) must give what the tight loop gives.
    got = spin_once(k, delay, cap_us=10.0, fake_tick=1000, backoff_ns=256)
    assert got == spin_once(k, delay, cap_us=10.0, fake_tick=1000)
    assert got[:2] == pytest.approx(expected_applied(delay, 10.0, 1000))


@pytest.mark.parametrize("backoff", [-1, 1_000_001, 256.5, True])
def test_spin_refuses_a_backoff_nanosleep_cannot_take(k, backoff):
    with pytest.raises(ValueError, match=f"backoff_ns must be an integer in \\[0, 1000000\\], "
                                         f"got {backoff!r}"):
        spin_once(k, 1.0, cap_us=10.0, backoff_ns=backoff)


def test_spin_hard_cap_beats_a_huge_cap(k):
    # cap_us far above the kernel's hard cap, delay infinite: the hard cap (1 s) applies.
    tick = 20_000_000  # 20 ms per virtual read keeps the interpreter fast
    want = int(k["spin"].HARD_CAP_US * 1000 / tick)
    # a read bound past it, so that a spin without the hard cap stops there and fails fast
    # (it ran until the test's timeout)
    applied, reads, _ = spin_once(k, math.inf, cap_us=1e12, fake_tick=tick, max_reads=2 * want)
    assert applied == pytest.approx(k["spin"].HARD_CAP_US)
    assert reads == want


@pytest.mark.parametrize("cap", [float("nan"), -1.0, 0.0])
def test_spin_bad_cap_means_no_delay(k, cap):
    assert spin_once(k, 50.0, cap_us=cap) == (0.0, 0, 5_000)


def test_spin_cannot_spin_forever_on_a_stuck_clock(k):
    applied, reads, _ = spin_once(k, 5.0, cap_us=10.0, fake_tick=0, max_reads=17)
    assert (applied, reads) == (0.0, 17)
    assert spin_once(k, 5.0, cap_us=10.0, fake_tick=0, max_reads=-3)[1] == 0


def test_spin_stops_when_the_clock_runs_backwards(k):
    applied, reads, _ = spin_once(k, 5.0, cap_us=10.0, fake_tick=-1000, max_reads=1000)
    assert reads == 1
    assert applied == pytest.approx(-1.0)  # the kernel reports what the clock said


def test_skew_spins_end_at_the_common_start_plus_each_skew(k):
    """Three ranks' stand-ins launched one after another, their virtual clocks apart as host
    launches would leave them: each ends at the first one's start + its skew, or at once when
    it started past that (the clock-free path: each rank's clock is its clk[1])."""
    start = torch.tensor([torch.iinfo(torch.int64).max], dtype=torch.int64)
    ends = []
    for began, skew_us in ((1_000, 10.0), (5_000, 10.0), (20_000, 10.0)):
        applied = torch.full((1,), -1.0)
        reads = torch.full((1,), -1, dtype=torch.int32)
        clk = torch.tensor([0, began], dtype=torch.int64)
        k["spin"].skew_spin(torch.tensor([skew_us]), start, applied, reads, clk, cap_us=100.0)
        ends.append((int(clk[1]), float(applied[0]), int(reads[0])))
    assert int(start[0]) == 1_000  # the first rank's start
    assert [(end, reads) for end, _, reads in ends] == [(11_000, 10), (11_000, 6), (20_000, 0)]
    assert [applied for _, applied, _ in ends] == pytest.approx([10.0, 6.0, 0.0])
    with pytest.raises(ValueError, match="start must be one int64 value"):
        k["spin"].skew_spin(torch.tensor([1.0]), torch.zeros(1), applied, reads, clk, cap_us=1.0)


def test_max_reads_bound_covers_the_cap(k):
    s = k["spin"]
    assert s.max_reads_for(10.0) >= 10.0 * 1000 / s.MIN_READ_NS
    assert s.max_reads_for(float("nan")) == s.max_reads_for(0.0)
    assert s.max_reads_for(1e15) == s.max_reads_for(s.HARD_CAP_US)


@pytest.mark.parametrize("m", [1, 3, 7])
def test_enter_and_exit_bookkeeping(k, m):
    row, stamps, clk = buffers(m)
    usual = torch.full((m,), float("nan"))
    delay = torch.zeros(3, m)  # three ranks; this rank is 1
    delay[1] = torch.arange(m, dtype=torch.float32) * 2.0 + 1.0  # 1, 3, 5 ... us
    t = 1_000_000
    for site in range(m):
        k["spin"].enter(delay, usual, row, stamps, clk, site, delay_offset=m, cap_us=100.0)
        d_ns = int(delay[1, site] * 1000)
        assert stamps[site, 0] == t and stamps[site, 1] == t + d_ns
        assert row[2 + m + site] == pytest.approx(delay[1, site].item())
        t += d_ns + 250_000 + 1000 * site  # the collective takes 250 us + site ms-ish
        clk[1] = t
        k["stamp"].exit_stamp(row, stamps, clk, site)
        assert stamps[site, 2] == t
        assert row[2 + site] == 0.0  # marked exited; the waits come with the row, once a step
        assert torch.isnan(row[3 + site:2 + m]).all()
    k["stamp"].finish_row(row, stamps, clk)
    assert row[0] == m
    for site in range(m):
        assert row[2 + site] == pytest.approx(250.0 + site)
    assert math.isnan(row[1])  # first step: no previous exit of site 0
    first_exit = int(stamps[0, 2])
    assert clk[0] == first_exit
    row[2:2 + m] = float("nan")  # the update kernel's reset
    clk[1] = first_exit + 3_000_000  # next step: site 0 exits 3 ms after the last time
    k["spin"].enter(torch.zeros(3, m), usual, row, stamps, clk, 0, delay_offset=m, cap_us=100.0)
    k["stamp"].exit_stamp(row, stamps, clk, 0)
    k["stamp"].finish_row(row, stamps, clk)
    assert row[1] == pytest.approx(3000.0)
    assert row[0] == 1
    assert row[2] == pytest.approx(0.0) and torch.isnan(row[3:2 + m]).all()  # site 0 alone
    assert float(usual[0]) == pytest.approx(3000.0, rel=1e-6)  # the first known arrival
    assert usual[1:].isnan().all()
    # A step with no site (step() alone, an eval loop's): the next step's time would span
    # both, from the exit before it; unknown instead, as on the host.
    row[2:2 + m] = float("nan")
    k["stamp"].finish_row(row, stamps, clk)
    assert row[0] == 0 and clk[0] == 0
    row[1:2 + m] = float("nan")
    clk[1] = int(clk[1]) + 6_000_000
    k["spin"].enter(torch.zeros(3, m), usual, row, stamps, clk, 0, delay_offset=m, cap_us=100.0)
    k["stamp"].exit_stamp(row, stamps, clk, 0)
    k["stamp"].finish_row(row, stamps, clk)
    assert math.isnan(row[1]) and clk[0] == stamps[0, 2]


def test_the_row_counts_every_site_exited_whatever_order_the_exits_ran_in(k):
    """An async site's exit runs on the pacing stream, a later sync site's on the current one:
    the later may run first. The count is the last site exited, not the last exit to run; a
    site whose exit never ran (its collective outlived the step) keeps a NaN wait."""
    m = 4
    row, stamps, clk = buffers(m)  # a step's start: waits NaN, as the update leaves them
    for site in range(m):
        k["spin"].enter(torch.zeros(m), torch.full((m,), float("nan")), row, stamps, clk, site,
                        cap_us=100.0)
    for site in (2, 0, 1):  # site 3 never exits
        clk[1] = int(clk[1]) + 100_000
        k["stamp"].exit_stamp(row, stamps, clk, site)
    k["stamp"].finish_row(row, stamps, clk)
    assert row[0] == 3
    waits = (stamps[:3, 2] - stamps[:3, 1]).double() / 1e3
    np.testing.assert_allclose(row[2:5].double().numpy(), waits.numpy())
    assert math.isnan(row[5])


@pytest.mark.parametrize("arrivals", [[1000.0, 1000.0, 1100.0, 1300.0, 900.0, 1600.0],
                                      [1000.0, 1000.0, 60e6, 1250.0, 1350.0, 1175.0]])
def test_enter_applies_the_delay_as_a_deadline_like_the_policy(k, arrivals):
    """A rank that arrives later than usual spins that much less (gpupace.policy.deadline_delay),
    and never more than planned; the running mean of its arrivals follows, by at most itself
    a step: one arrival a minute late (a checkpoint) lifts it 25% here, not 15 s."""
    row, stamps, clk = buffers(1)
    usual = torch.full((1,), float("nan"))
    delay = torch.tensor([400.0])
    ref, mean = None, math.nan
    for step, arrival_us in enumerate(arrivals):
        clk[1] = (ref or 5_000_000) + int(arrival_us * 1000)
        t0 = int(clk[1])
        k["spin"].enter(delay, usual, row, stamps, clk, 0, cap_us=1000.0, rate=0.25)
        want, mean = policy.deadline_delay(400.0, arrival_us if ref else math.nan, mean, 0.25)
        assert row[2 + 1] == pytest.approx(want, abs=1e-3), step
        assert float(usual[0]) == pytest.approx(mean, rel=1e-6, nan_ok=True), step
        assert stamps[0, 1] - t0 == round(want * 1000)
        clk[1] = int(clk[1]) + 50_000
        k["stamp"].exit_stamp(row, stamps, clk, 0)
        k["stamp"].finish_row(row, stamps, clk)
        ref = int(clk[0])
    assert mean == pytest.approx(1100.0, abs=200)  # it followed the arrivals


def test_launchers_reject_bad_sites(k):
    row, stamps, clk = buffers(2)
    with pytest.raises(ValueError, match="site"):
        k["spin"].enter(torch.zeros(2), torch.zeros(2), row, stamps, clk, 2, cap_us=1.0)
    with pytest.raises(ValueError, match="site"):
        k["stamp"].exit_stamp(row, stamps, clk, -1)
    with pytest.raises(ValueError, match="slot"):
        k["stamp"].stamp(torch.zeros(2, dtype=torch.int64), 5, clk)
    for offset in (-1, 3):  # a rank's two sites must lie inside the [2, 2] delay matrix
        with pytest.raises(ValueError, match="delay_offset"):
            k["spin"].enter(torch.zeros(2, 2), torch.zeros(2), row, stamps, clk, 0,
                            delay_offset=offset, cap_us=1.0)
    launch = k["stamp"].exit_stamper(row, stamps, clk)  # the engine's hot path checks too
    with pytest.raises(ValueError, match="site"):
        launch(2)
    with pytest.raises(ValueError, match="row must hold 2 \\+ 2 x 2"):  # another layout's row
        k["stamp"].finish_row(torch.zeros(5), stamps, clk)


def test_stamp_writes_the_clock_into_its_slot(k):
    out = torch.full((5,), -7, dtype=torch.int64)
    clk = torch.tensor([0, 123_456], dtype=torch.int64)
    k["stamp"].stamp(out, 3, clk)
    assert out.tolist() == [-7, -7, -7, 123_456, -7]


def test_clock_free_reads_and_tick(k):
    out = torch.zeros(9, dtype=torch.int64)
    out[0] = 100
    k["clock"].read_clock(out, fake_tick=32)
    assert out.tolist() == [100 + 32 * (i + 1) for i in range(9)]
    assert k["clock"].tick_from_reads(out.numpy()) == 32.0
    assert math.isnan(k["clock"].tick_from_reads([5, 5, 5]))  # a clock that never moved
    # a coarse timer: many equal reads between steps of 1 us
    assert k["clock"].tick_from_reads([0, 0, 0, 1000, 1000, 2000, 2000, 2000, 3000]) == 1000.0
    assert not k["clock"].use_clock(True)  # the interpreter never reads %globaltimer


def test_sm_offsets_never_wait_for_a_program_that_is_not_running(k):
    """The interpreter runs programs one after another: program 0's pings go unanswered
    while it waits, so every poll must give up (max_polls) and say so (NaN), not hang."""
    got = k["clock"].sm_offsets(3, rounds=2, max_polls=5, device="cpu")
    assert got["sm"].tolist() == [-1, -1, -1]  # no %smid on the clock-free path
    assert got["offset_ns"][0] == 0.0 and np.isnan(got["offset_ns"][1:]).all()
    assert np.isnan(got["round_trip_ns"][1:]).all()
    for programs in (1, 1025):
        with pytest.raises(ValueError, match="need 2 <= programs <= 1024"):
            k["clock"].sm_offsets(programs, device="cpu")


def test_sm_offsets_from_ping_and_answer_take_the_shortest_round_trip(k):
    # program 1's clock runs 300 ns ahead; round trips of 900 (skewed: the ping took 700 of
    # it) and 400 ns (even); program 2 never answered. The clock counts ns since 1970: as
    # float64 such stamps are multiples of 256 ns, so the differences must come first.
    t = 1_764_547_200_123_456_789
    out = np.zeros((3, 2, 3), dtype=np.int64)
    out[1, 0] = [t + 1000, t + 1000 + 700 + 300, t + 1900]
    out[1, 1] = [t + 5000, t + 5000 + 200 + 300, t + 5400]
    out[2, :, 0] = [t + 7000, t + 8000]
    offset, trip = k["clock"].offsets_from(out)
    assert offset[:2].tolist() == [0.0, 300.0] and trip[:2].tolist() == [0.0, 400.0]
    assert np.isnan(offset[2]) and np.isnan(trip[2])


# -- the reduction's NumPy twin against the policy ---------------------------------------------

quarter_us = st.integers(0, 400_000).map(lambda q: q / 4.0)  # exact in float32, sums too
bad = st.sampled_from([float("nan"), -1.0, float("inf"), 2e9])


@st.composite
def gathered_rows(draw, max_ranks=9, max_sites=4):
    n = draw(st.integers(1, max_ranks))
    m = draw(st.integers(1, max_sites))
    n_sites = draw(st.integers(1, m))
    w = np.array([[draw(quarter_us) for _ in range(n_sites)] for _ in range(n)])
    d = np.array([[draw(quarter_us) / 8 for _ in range(n_sites)] for _ in range(n)])
    for _ in range(draw(st.integers(0, 2))):  # corrupt a few entries
        i, s = draw(st.integers(0, n - 1)), draw(st.integers(0, n_sites - 1))
        (w if draw(st.booleans()) else d)[i, s] = draw(bad)
    steps = np.array([draw(st.one_of(quarter_us, bad)) for _ in range(n)])
    g = np.full((n, 2 + 2 * m), np.nan, dtype=np.float32)
    g[:, 0] = n_sites
    g[:, 1] = steps
    g[:, 2 + m:] = 0.0
    g[:, 2:2 + n_sites] = w
    g[:, 2 + m:2 + m + n_sites] = d
    return g, w, d, steps, n_sites


@settings(max_examples=120, deadline=None)
@given(data=gathered_rows())
def test_reduce_reference_agrees_with_policy(k, data):
    g, w, d, steps, n_sites = data
    n = w.shape[0]
    out = k["reduce"].reduce_reference(g, n_sites)
    params = policy.PolicyParams.from_config(PaceConfig(), n)
    _, stats = policy.update_reference(params, policy.init_state(n, n_sites), w, d, steps)
    np.testing.assert_array_equal(out["valid"].astype(bool), stats.valid)
    assert out["n_valid"][0] == stats.valid.sum()
    site = out["site"][:, :n_sites]
    np.testing.assert_allclose(site[1], stats.spread, rtol=1e-6, atol=1e-3, equal_nan=True)
    np.testing.assert_allclose(site[2], stats.transfer, rtol=1e-6, atol=1e-3, equal_nan=True)
    np.testing.assert_allclose(site[3], stats.residual, rtol=1e-6, atol=1e-3, equal_nan=True)
    np.testing.assert_array_equal(out["straggler"][:n_sites], stats.straggler)
    if stats.valid.sum() >= 2:
        mean_e = stats.earliness()[stats.valid].mean(axis=0)
        np.testing.assert_allclose(site[4], mean_e, rtol=1e-5, atol=2e-2)
    assert np.isnan(out["site"][:, n_sites:]).all() and (out["straggler"][n_sites:] == -1).all()
    with np.errstate(invalid="ignore"):
        known = steps[np.isfinite(steps) & (steps > 0) & (steps < policy.ABSURD_US)]
    want = np.median(known) if known.size else np.nan
    np.testing.assert_allclose(out["median"][0], want, rtol=1e-6, equal_nan=True)
    # what the telemetry record takes per rank: waits and delays summed, NaNs skipped
    np.testing.assert_allclose(out["sums"], [np.nansum(w, axis=1), np.nansum(d, axis=1)],
                               rtol=1e-6)
    assert out["counts"].tolist() == [n_sites, n_sites]


def test_reduce_reference_reads_the_site_counts_as_cuda_casts_them(k):
    g = np.zeros((4, 4), dtype=np.float32)
    g[:, 0] = [2.7, np.nan, 3e9, -np.inf]  # truncated, -1 if not finite, saturated
    assert k["reduce"].reduce_reference(g, 1)["counts"].tolist() == [-1, 2**31 - 1]
    g[:, 0] = [2.7, 1.0, 2.0, 2.0]
    assert k["reduce"].reduce_reference(g, 1)["counts"].tolist() == [1, 2]


def test_reduce_reference_sums_left_to_right_in_float32_as_the_kernel(k):
    """1e8 then fifteen 3.0s: each 3.0 is lost to float32 rounding one at a time, as in the
    kernel's loop; a pairwise sum (NumPy's nansum) keeps 40 of them."""
    m = 16
    g = np.zeros((1, 2 + 2 * m), dtype=np.float32)
    g[0, 0], g[0, 2], g[0, 3:2 + m] = m, 1e8, 3.0
    assert k["reduce"].reduce_reference(g, m)["sums"][0, 0] == np.float32(1e8)


def test_the_reductions_copy_of_the_policys_bound_is_the_policys():
    """kernels/reduce.py keeps ABSURD_US without importing the library (numba): the same value."""
    from gpupace import policy_fast
    from gpupace.kernels import reduce

    assert reduce.ABSURD_US == policy.ABSURD_US == policy_fast.ABSURD_US


def test_the_spins_hard_cap_is_the_largest_max_delay_a_config_takes():
    from gpupace.config import MAX_DELAY_LIMIT_US
    from gpupace.kernels import spin

    assert spin.HARD_CAP_US == MAX_DELAY_LIMIT_US
    PaceConfig(max_delay_us=MAX_DELAY_LIMIT_US)
