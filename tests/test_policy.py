"""Properties of the NumPy policy: bounds, who is delayed, hysteresis, robustness."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gpupace import PaceConfig
from gpupace.policy import (
    Controller,
    PolicyParams,
    deadline_delay,
    holdoff,
    init_state,
    oracle_delays,
    resize_state,
    update,
    update_in_place,
    update_reference,
)
from gpupace.policy_fast import median_known

PACE = PaceConfig(mode="pace", warmup_steps=0, on_steps=1, off_steps=3, holdoff_factor=0.0,
                  threshold_us=100.0, release_us=50.0)


def run(cfg, waits, delays=None, step_us=10_000.0):
    """Feeds a sequence of [N, S] wait matrices; returns the list of StepStats."""
    n, s = waits[0].shape
    ctl = Controller(cfg, n, s)
    out = []
    for k, w in enumerate(waits):
        d = np.zeros((n, s)) if delays is None else delays[k]
        out.append(ctl.update(w, d, np.full(n, step_us)))
    return out


def got(stats, name):
    """A `StepStats` output by name; earliness, which is computed on demand, in full."""
    return stats.earliness() if name == "earliness" else getattr(stats, name)


finite_us = st.floats(0.0, 1e5, allow_nan=False)
matrices = st.integers(2, 9).flatmap(
    lambda n: st.integers(1, 4).flatmap(
        lambda s: st.lists(arrays(np.float64, (n, s), elements=finite_us), min_size=1, max_size=12)
    )
)


@settings(max_examples=150, deadline=None)
@given(waits=matrices, step_us=st.floats(1.0, 1e6))
def test_delays_within_zero_and_cap(waits, step_us):
    for stats in run(PACE, waits, step_us=step_us):
        cap = min(PACE.max_delay_us, PACE.cap_fraction * step_us)
        assert stats.cap_us == pytest.approx(cap)
        assert (stats.delay >= 0).all()
        assert (stats.delay <= cap + 1e-9).all()
        assert (stats.delay.sum(axis=1) <= cap * (1 + 1e-9)).all()


@settings(max_examples=150, deadline=None)
@given(waits=matrices)
def test_last_arrival_is_never_delayed(waits):
    for stats in run(PACE, waits):
        for s, j in enumerate(stats.straggler):
            assert stats.delay[j, s] == 0.0


@settings(max_examples=100, deadline=None)
@given(waits=matrices)
def test_observe_and_off_never_delay(waits):
    for mode in ("observe", "off"):
        for stats in run(PACE.replace(mode=mode), waits):
            assert not stats.delay.any()
            assert not stats.active.any()


bad_values = st.sampled_from([np.nan, np.inf, -np.inf, -1.0, -1e-3, 1e12])


@settings(max_examples=150, deadline=None)
@given(waits=matrices, bad=bad_values, data=st.data())
def test_bad_input_gives_zero_delay_and_no_exception(waits, bad, data):
    n, s = waits[0].shape
    ctl = Controller(PACE, n, s)
    victim = data.draw(st.integers(0, n - 1))
    for w in waits:
        w = w.copy()
        w[victim, data.draw(st.integers(0, s - 1))] = bad
        stats = ctl.update(w, np.zeros((n, s)), np.full(n, 10_000.0))
        assert not stats.delay[victim].any()
        assert not stats.valid[victim]
        assert not ctl.state.floor[victim].any()  # its state was reset
        assert np.isfinite(stats.delay).all()


def test_bad_step_time_means_no_cap_and_no_delay():
    w = np.array([[5000.0], [0.0]])
    stats = None
    for step in (np.nan, -5.0, np.inf):
        ctl = Controller(PACE, 2, 1)
        for _ in range(5):
            stats = ctl.update(w, np.zeros((2, 1)), np.full(2, step))
        assert stats.cap_us == 0.0 and not stats.delay.any()


def test_shape_mismatch_raises():
    ctl = Controller(PACE, 3, 2)
    with pytest.raises(ValueError, match="3x2"):
        ctl.update(np.zeros((2, 2)), np.zeros((3, 2)), np.zeros(3))


def earliness_matrix(early_us, transfer=100.0):
    """Waits of ranks that arrived `early_us` before the last one, with no delay applied."""
    return (np.asarray(early_us, dtype=float) + transfer)[:, None]


def test_hysteresis_on_after_k_steps_off_after_m_steps():
    cfg = PACE.replace(on_steps=3, off_steps=4, threshold_us=1000.0, release_us=500.0)
    high = earliness_matrix([2000.0, 0.0])
    mid = earliness_matrix([700.0, 0.0])  # between release and threshold: no change
    low = earliness_matrix([100.0, 0.0])
    seq = [high] * 3 + [mid] * 2 + [low] * 4 + [high] * 2
    active = [bool(s.active[0]) for s in run(cfg, seq)]
    assert active == [False, False, True, True, True, True, True, True, False, False, False]


def test_interrupted_run_above_threshold_does_not_switch_on():
    cfg = PACE.replace(on_steps=3, threshold_us=1000.0, release_us=500.0)
    high, low = earliness_matrix([2000.0, 0.0]), earliness_matrix([0.0, 0.0])
    active = [bool(s.active[0]) for s in run(cfg, [high, high, low, high, high, low])]
    assert not any(active)


def test_warmup_steps_are_measured_but_not_paced():
    cfg = PACE.replace(warmup_steps=4)
    stats = run(cfg, [earliness_matrix([5000.0, 0.0])] * 8)
    assert all(not s.delay.any() for s in stats[:4])
    assert all(s.spread[0] == pytest.approx(5000.0) for s in stats)
    assert stats[-1].delay[0, 0] > 0


def test_persistent_straggler_delays_converge_to_earliness():
    rng = np.random.default_rng(0)
    early = np.array([3000.0, 1500.0, 0.0, 2200.0])  # rank 2 is always last
    cfg = PaceConfig(mode="pace", warmup_steps=2)
    ctl = Controller(cfg, 4, 1)
    delay = np.zeros((4, 1))
    for _ in range(400):
        natural = early + rng.uniform(0, 50, 4)  # small noise
        # The rank enters `delay` later, so it waits that much less inside the collective.
        wait = natural[:, None] + 100.0 - delay
        stats = ctl.update(wait, delay, np.full(4, 20_000.0))
        delay = stats.delay.copy()
    want = np.clip(cfg.gain * early - cfg.guard_us, 0, None)
    np.testing.assert_allclose(delay[:, 0], want, atol=80.0)
    assert delay[2, 0] == 0.0
    # the estimate is unchanged by the delays applied
    np.testing.assert_allclose(stats.earliness(0), early + 25.0, atol=60.0)


@pytest.mark.parametrize("n", [4, 16, 64])
def test_random_stragglers_yield_near_zero_delays(n):
    """i.i.d. spikes on random ranks: nobody is reliably early, so pacing must cost nothing.
    Measured (1500 steps): the delays add 0.03/0.2/0.8% of the mean spread to the step at
    4/16/64 ranks."""
    rng = np.random.default_rng(n)
    cfg = PaceConfig(mode="pace", warmup_steps=5)
    ctl = Controller(cfg, n, 1)
    delay = np.zeros((n, 1))
    delays, spreads, cost = [], [], []
    for _ in range(600):
        arrival = rng.normal(0, 100, n)
        arrival[rng.integers(n)] += rng.pareto(1.5) * 2000 + 1000  # a random straggler
        entry = arrival + delay[:, 0]
        cost.append(entry.max() - arrival.max())  # what the delays added to the step
        wait = (entry.max() + 100.0 - entry)[:, None]
        stats = ctl.update(wait, delay, np.full(n, 50_000.0))
        delay = stats.delay.copy()
        delays.append(delay.mean())
        spreads.append(stats.spread[0])
    assert np.mean(delays[50:]) < 0.02 * np.mean(spreads[50:])
    assert np.mean(cost[50:]) < 0.02 * np.mean(spreads[50:])


def test_estimator_stats():
    w = np.array([[900.0, 50.0], [100.0, 400.0], [500.0, 60.0]])
    d = np.array([[0.0, 0.0], [0.0, 0.0], [200.0, 0.0]])
    state, stats = update(PolicyParams.from_config(PACE, 3), init_state(3, 2), w, d, np.full(3, 1e4))
    np.testing.assert_allclose(stats.earliness(), [[800, 0], [0, 350], [600, 10]])
    np.testing.assert_allclose(stats.spread, [800, 350])
    np.testing.assert_array_equal(stats.straggler, [1, 0])
    np.testing.assert_allclose(stats.residual, [800, 350])
    np.testing.assert_allclose(stats.transfer, [100, 50])
    assert state.step == 1


def test_update_is_pure_and_deterministic():
    params = PolicyParams.from_config(PACE, 3)
    state = init_state(3, 1)
    w = earliness_matrix([900.0, 0.0, 300.0])
    a = update(params, state, w, np.zeros((3, 1)), np.full(3, 1e4))
    b = update(params, state, w, np.zeros((3, 1)), np.full(3, 1e4))
    assert state.step == 0 and not state.floor.any()
    np.testing.assert_array_equal(a[0].floor, b[0].floor)
    np.testing.assert_array_equal(a[1].delay, b[1].delay)


def test_one_rank_has_nothing_to_pace():
    stats = run(PACE, [np.array([[123.0, 5.0]])] * 5)
    assert all(not s.delay.any() and np.isnan(s.spread).all() for s in stats)


def test_oracle():
    a = np.array([0.0, 300.0, 1000.0])
    np.testing.assert_allclose(oracle_delays(a, guard_us=10.0), [990.0, 690.0, 0.0])
    np.testing.assert_allclose(oracle_delays(a, cap_us=500.0), [500.0, 500.0, 0.0])


def test_update_takes_the_fused_path_for_large_jobs_with_the_same_result():
    rng = np.random.default_rng(0)
    params = PolicyParams.from_config(PACE, 128)
    w, d = rng.uniform(0, 3000, (128, 4)), np.zeros((128, 4))
    a = update(params, init_state(128, 4), w, d, np.full(128, 1e4))  # 512 elements: fused
    b = update_reference(params, init_state(128, 4), w, d, np.full(128, 1e4))
    assert a[0].plan is not None and b[0].plan is None  # the kernel ran: not the reference twice
    np.testing.assert_allclose(a[1].spread, b[1].spread)
    np.testing.assert_allclose(a[0].floor, b[0].floor)


def test_prepare_fused_puts_small_jobs_on_the_fused_kernel(monkeypatch):
    """Small updates use the NumPy reference until `prepare_fused` (which the host backend
    calls when it starts) has the kernel ready, then the kernel: same numbers. Only the
    kernel keeps its output buffers on the state: that tells the paths apart."""
    import gpupace.policy as pol

    monkeypatch.setattr(pol, "_fused_ready", False)
    rng = np.random.default_rng(4)
    params = PolicyParams.from_config(PACE, 8)
    w, d, steps = rng.uniform(0, 3000, (8, 3)), np.zeros((8, 3)), np.full(8, 1e4)
    state, before = update(params, init_state(8, 3), w, d, steps)
    assert state.plan is None
    assert pol.prepare_fused() >= 0.0 and pol.prepare_fused() == 0.0  # the second: ready
    state, after = update(params, init_state(8, 3), w, d, steps)
    assert state.plan is not None
    for name in ("earliness", "lowest", "spread", "straggler", "delay", "valid"):
        np.testing.assert_array_equal(got(before, name), got(after, name), err_msg=name)


any_us = st.one_of(finite_us, st.sampled_from([np.nan, np.inf, -1.0, 2e9, 0.0]))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 7), s=st.integers(1, 3), steps=st.integers(1, 15), data=st.data(),
       mode=st.sampled_from(["pace", "observe", "off"]), warmup=st.integers(0, 3),
       holdoff=st.sampled_from([0.0, 0.3, 0.5, 1.0, 5.0]),
       fall=st.sampled_from([0.25, 0.5, 1.0]), rise=st.sampled_from([0.05, 0.5]),
       gain=st.sampled_from([0.5, 1.0]), guard=st.sampled_from([0.0, 20.0]))
def test_fused_update_equals_the_numpy_reference(n, s, steps, data, mode, warmup, holdoff,
                                                 fall, rise, gain, guard):
    """The fused Numba loop, in place on one state as the host backend and the simulator run
    it (its plan reused from step to step, or remade when the updated rank changes), against
    the NumPy reference. Some steps give the last delays back as the applied ones
    (`state.delay`, the buffer the kernel writes). The control law's rates and margins vary
    too: with the default floor_fall of 1 a straggler's floor is 0, and the kernel's straggler
    rule and floor fall could be broken unseen (mutations of a review survived)."""
    import gpupace.policy as pol

    pol.prepare_fused()  # every size on the kernel
    cfg = PaceConfig(mode=mode, warmup_steps=warmup, holdoff_factor=holdoff, on_steps=1,
                     off_steps=2, threshold_us=100.0, release_us=50.0, floor_fall=fall,
                     floor_rise=rise, gain=gain, guard_us=guard)
    params = PolicyParams.from_config(cfg, n)
    fast, ref = init_state(n, s), init_state(n, s)
    ranks = st.one_of(st.none(), st.integers(0, n - 1))  # a pacer updates its own
    rank = data.draw(ranks)
    for _ in range(steps):
        if data.draw(st.booleans()):  # another rank, or every rank, from this step on
            rank = data.draw(ranks)
        w = data.draw(arrays(np.float64, (n, s), elements=any_us))
        d = data.draw(arrays(np.float64, (n, s), elements=st.one_of(st.just(0.0), finite_us)))
        step = data.draw(arrays(np.float64, n, elements=st.one_of(finite_us, st.just(np.nan))))
        given_back = data.draw(st.booleans())
        ref, b = update_reference(params, ref, w, ref.delay if given_back else d, step, rank=rank)
        a = update_in_place(params, fast, w, fast.delay if given_back else d, step, rank=rank)
        for name in ("earliness", "lowest", "spread", "residual", "straggler", "transfer", "valid",
                     "delay", "active"):
            np.testing.assert_allclose(got(a, name), got(b, name), rtol=1e-12,
                                       atol=1e-9, err_msg=name)
        assert a.cap_us == pytest.approx(b.cap_us)
        for name in ("floor", "calm", "mean", "var", "above", "below", "last_seen", "n_last",
                     "step"):
            np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-12,
                                       err_msg=name)
        # Earliness from the inputs against the kernel's own extremes: the spread is its max.
        known = a.spread == a.spread
        np.testing.assert_allclose(np.nanmax(a.earliness()[:, known], axis=0, initial=0.0),
                                   a.spread[known], rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 1000, 4096, 4097])
def test_fused_median_is_numpys_over_the_known_values(n):
    """`policy_fast.median_known` takes a histogram path from 64 known values on; it must stay
    exact, and leave out what is not a step time (NaN, 0, negative, absurd)."""
    rng = np.random.default_rng(n)
    broken = np.r_[np.nan, 0.0, -3.0, 2e9, np.inf][: max(0, n - 1)]
    for x in (rng.normal(2e4, 500, n), np.full(n, 7.0), rng.exponential(1.0, n) ** 6,
              rng.integers(1, 4, n).astype(float), np.r_[rng.normal(2e4, 5, n - 1), 1e8]):
        assert median_known(x) == np.median(x)
        x[rng.permutation(n)[: broken.size]] = broken
        known = x[(x > 0) & (x < 1e9)]
        assert median_known(x) == np.median(known)
    assert np.isnan(median_known(np.full(n, np.nan)))


def test_update_in_place_matches_update_with_broken_ranks():
    """Large enough for the fused kernel, with NaN, negative and absurd rows among them."""
    rng = np.random.default_rng(3)
    n, s = 300, 3
    params = PolicyParams.from_config(PACE, n)
    pure, mine = init_state(n, s), init_state(n, s)
    for step in range(40):
        w = 200.0 + rng.exponential(500.0, (n, s))
        w[rng.integers(0, n, 3), rng.integers(0, s, 3)] = [np.nan, -5.0, 2e9]
        d = np.where(pure.delay > 0, pure.delay, 0.0)
        steps = rng.normal(2e4, 300, n)
        steps[step % n] = np.nan
        pure, a = update(params, pure, w, d, steps)
        b = update_in_place(params, mine, w, d, steps)
        for name in ("earliness", "lowest", "spread", "delay", "valid", "straggler", "active"):
            np.testing.assert_array_equal(got(a, name), got(b, name), err_msg=name)
        for name in ("floor", "calm", "mean", "var"):
            np.testing.assert_array_equal(getattr(pure, name), getattr(mine, name), err_msg=name)
    assert mine.step == 40 and (mine.delay > 0).any()
    _, c = update_reference(params, mine.copy(), w, d, steps)
    np.testing.assert_allclose(c.delay, update(params, mine, w, d, steps)[1].delay, rtol=1e-12)


@pytest.mark.parametrize("bad", ["none", "sum_over_bound", "d_inf", "d_nan", "d_negative",
                                 "w_minus_inf", "inf_minus_inf"])
def test_fused_validity_shortcut_agrees_with_the_exact_test(bad):
    """The fused kernel proves every rank valid from its extremes and runs the exact per-rank
    test only when that proof fails: each way of failing it must give the reference's answer
    (w + d over the bound with both under it is valid)."""
    rng = np.random.default_rng(5)
    n, s = 40, 3
    w, d = 100.0 + rng.exponential(300.0, (n, s)), rng.uniform(0, 50, (n, s))
    pairs = {"sum_over_bound": (6e8, 6e8), "d_inf": (10.0, np.inf), "d_nan": (10.0, np.nan),
             "d_negative": (10.0, -1.0), "w_minus_inf": (-np.inf, 0.0),
             "inf_minus_inf": (np.inf, -np.inf)}
    if bad in pairs:
        w[7, 1], d[7, 1] = pairs[bad]
    params = PolicyParams.from_config(PACE, n)
    fast, ref = init_state(n, s), init_state(n, s)
    for _ in range(params.warmup_steps + 3):
        fast, a = update(params, fast, w, d, np.full(n, 1e4), fused=True)
        ref, b = update_reference(params, ref, w, d, np.full(n, 1e4))
    assert a.valid.sum() == (n - 1 if bad in pairs and bad != "sum_over_bound" else n)
    for name in ("earliness", "lowest", "spread", "residual", "straggler", "transfer", "valid", "delay"):
        np.testing.assert_array_equal(got(a, name), got(b, name), err_msg=name)


@pytest.mark.parametrize("rank", [None, 0, 299])
def test_fused_update_equals_the_reference_at_scale_with_broken_rows(rank):
    """The hypothesis test above draws up to 7 ranks; this one runs 300 (the median's histogram
    path, the validity shortcut over many rows) through 25 steps with broken values in some
    steps and a whole matrix of NaN in others, comparing every output and the whole state."""
    rng = np.random.default_rng(7 if rank is None else rank)
    n, s = 300, 3
    params = PolicyParams.from_config(PaceConfig(mode="pace", warmup_steps=1, on_steps=1,
                                                 holdoff_factor=0.2, threshold_us=50.0,
                                                 release_us=10.0), n)
    fast, ref = init_state(n, s), init_state(n, s)
    paced = False
    for step in range(25):
        w, d = 100 + rng.exponential(500, (n, s)), rng.uniform(0, 50, (n, s))
        if step % 3 == 1:
            w[rng.integers(0, n, 3), rng.integers(0, s, 3)] = [np.nan, -3.0, 2e9]
        if step == 17:
            w[:] = np.nan
        steps = rng.normal(2e4, 300, n)
        steps[rng.integers(0, n, 3)] = np.nan
        fast, a = update(params, fast, w, d, steps, fused=True, rank=rank)
        ref, b = update_reference(params, ref, w, d, steps, rank=rank)
        for name in ("earliness", "lowest", "spread", "residual", "straggler", "transfer", "valid",
                     "delay", "active"):
            np.testing.assert_allclose(got(a, name), got(b, name), rtol=1e-12,
                                       atol=1e-9, err_msg=f"{name}, step {step}")
        assert a.cap_us == pytest.approx(b.cap_us)
        for name in ("floor", "calm", "mean", "var", "above", "below", "last_seen", "n_last",
                     "step"):
            np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-12,
                                       err_msg=f"{name}, step {step}")
        paced |= bool((b.delay > 0).any())
    if rank is None:
        assert paced  # the delay path ran, not only the statistics
    else:  # its own rank's state learned, every other row as it started
        others = np.arange(n) != rank
        assert (ref.var[rank] >= 0).all() and (ref.var[others] == -1).all()
        assert not ref.floor[others].any()


def test_deadline_delay_shortens_by_lateness_and_never_lengthens():
    nan = float("nan")
    assert deadline_delay(300.0, nan, 7.0, 0.1) == (300.0, 7.0)  # arrival unknown: the plan
    assert deadline_delay(300.0, 1000.0, nan, 0.1) == (300.0, 1000.0)  # first sample
    assert deadline_delay(300.0, 1100.0, 1000.0, 0.1) == (200.0, 1010.0)  # 100 us late
    assert deadline_delay(300.0, 900.0, 1000.0, 0.1) == (300.0, 990.0)  # early: the plan
    assert deadline_delay(300.0, 1500.0, 1000.0, 0.1)[0] == 0.0  # later than the plan: none
    assert deadline_delay(-5.0, 1000.0, 1000.0, 0.1)[0] == 0.0
    # a minute late (a checkpoint): the mean learns by at most itself, 1000 + 0.1 x 1000
    assert deadline_delay(0.0, 60e6, 1000.0, 0.1) == (0.0, 1100.0)


def test_host_engine_applies_its_delay_as_a_deadline():
    """World size 1, driven by hand: after 40 steps of ~1 ms, a site planned at 30 ms that
    arrives ~20 ms later than usual spins clearly less than planned (~10-12 ms idle: the usual
    arrival still carries some of the first steps' start-up cost; less, down to none, when a
    loaded machine oversleeps the 21 ms). The arithmetic is tested exactly above."""
    from gpupace.backends.host import HostEngine

    eng = HostEngine(PaceConfig(mode="pace"), None, 0, 1)
    for step in range(41):
        time.sleep(0.021 if step == 40 else 0.001)  # the step's compute
        eng._next_delay[0] = 30_000.0 if step == 40 else 0.0
        t0 = time.perf_counter_ns()
        ticket = eng.arrive()
        waited = (time.perf_counter_ns() - t0) * 1e-3
        applied = eng.delay_us[0]
        eng.exit(ticket)
        eng.end_step(step, 0.0)
    assert 0.0 <= applied < 25_000.0, applied
    assert waited >= applied, (waited, applied)  # waited out, not only recorded


def test_an_exit_stamp_still_running_on_another_thread_when_step_comes_is_waited_for():
    """A work's future runs its callbacks on the thread that completes it (gloo's), and DDP
    waits on another callback of it: step() may come while the exit stamp is still running
    there (one step of the README's loop in ~3000 went unmeasured, with a warning that told a
    DDP user to wait on work they never issued). Here the stamp takes 0.3 s on that thread."""
    import threading
    import warnings

    import torch

    from gpupace.backends.host import HostEngine

    eng = HostEngine(PaceConfig(mode="observe"), None, 0, 1)
    stamp = eng.exit

    def slow_exit(ticket):
        time.sleep(0.3)
        stamp(ticket)

    eng.exit = slow_exit
    done = torch.futures.Future()

    class Work:  # what `leave` takes of a c10d Work: its future
        def get_future(self):
            return done

    eng.leave(eng.arrive(), Work())
    threading.Thread(target=done.set_result, args=(None,)).start()  # completes, then stamps
    while not done.done():
        time.sleep(0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the "had not completed" warning fails the test
        eng.end_step(0, 0.0)
    assert eng._last_exit_ns[0] > 0 and eng._prev_exit0 is not None  # stamped in that step
    # What it keeps for step() is bounded when step() never comes (each entry holds its
    # collective's result): the sites past max_sites are timed for nobody anyway
    eng.exit = stamp
    for _ in range(3 * eng.max_sites):
        done = torch.futures.Future()
        done.set_result(torch.zeros(1))
        eng.leave(eng.arrive(), Work())
    assert len(eng._stamping) == eng.max_sites


@pytest.mark.parametrize("delay_us", [0.0, 150.0, 5_000.0])
def test_sleep_then_spin_waits_at_least_the_delay_and_says_how_long(delay_us):
    """150 us is spun alone (under SPIN_TAIL_US); 5 ms sleeps first, then spins the tail."""
    from gpupace.backends.host import sleep_then_spin

    t0 = time.perf_counter_ns()
    applied = sleep_then_spin(delay_us)
    waited = (time.perf_counter_ns() - t0) * 1e-3
    assert delay_us <= applied <= waited, (delay_us, applied, waited)
    if delay_us == 0.0:
        assert applied == 0.0


def test_one_rank_update_gives_that_rank_the_full_updates_delays():
    """What the host backend runs: its own rank's rows only, the same delays for that rank as
    the full update, and the same per-site statistics and earliness for everyone."""
    rng = np.random.default_rng(5)
    n, s = 200, 2
    params = PolicyParams.from_config(PACE, n)
    full, own = init_state(n, s), init_state(n, s)
    for _ in range(30):
        w = 200.0 + rng.exponential(500.0, (n, s))
        w[7] = np.nan  # a broken rank among them
        w[3] = 8000.0 + rng.uniform(0, 10, s)  # reliably early: it waits longest
        a = update_in_place(params, full, w, np.zeros((n, s)), np.full(n, 2e4))
        b = update_in_place(params, own, w, np.zeros((n, s)), np.full(n, 2e4), rank=3)
        np.testing.assert_array_equal(a.delay[3], b.delay[3])
        assert not np.delete(b.delay, 3, axis=0).any()
        for name in ("earliness", "lowest", "spread", "straggler", "residual", "valid", "active"):
            np.testing.assert_array_equal(got(a, name), got(b, name), err_msg=name)
    assert (a.delay[3] > 0).any()
    assert not own.floor[4:].any() and own.floor[3].any()  # the other rows were left alone
    for bad in (-1, n, 1.5, True, 3.0, np.array([3])):  # also after rank=3, on its plan
        with pytest.raises(ValueError, match="rank"):
            update_in_place(params, own, w, np.zeros((n, s)), np.full(n, 2e4), rank=bad)


def test_delays_given_back_as_applied_ones_are_read_as_they_were_applied():
    """A loop may pass `state.delay` back as the applied delays: the kernel overwrites that
    buffer with the next ones, and the step's earliness must still come from the applied."""
    import gpupace.policy as pol

    pol.prepare_fused()  # the kernel at this size too, as the host backend has it
    rng = np.random.default_rng(3)
    n, s = 16, 2
    params = PolicyParams.from_config(PACE, n)
    fast, ref = init_state(n, s), init_state(n, s)
    pol_steps = np.full(n, 2e4)
    for step in range(40):
        w = 200.0 + rng.exponential(300.0, (n, s)) + 4000.0 * (np.arange(n) % 4 == 0)[:, None]
        ref, want = update_reference(params, ref, w, ref.delay, pol_steps, rank=0)
        stats = update_in_place(params, fast, w, fast.delay, pol_steps, rank=0)
        np.testing.assert_array_equal(stats.earliness(), want.earliness(), err_msg=f"step {step}")
    assert (fast.delay > 0).any()  # delays were given back, not zeros


def test_a_state_with_arrays_of_another_size_is_refused_before_the_kernel_runs():
    """The kernel does not check bounds: a per-site array of one value where a state of 3
    sites needs 3 made it write past its end (a corrupted heap)."""
    params = PolicyParams.from_config(PACE, 8)
    state = init_state(8, 3)
    state.active = np.zeros(1, dtype=bool)
    with pytest.raises(ValueError, match=r"active, above, below and n_last of \(3,\)"):
        update_in_place(params, state, np.ones((8, 3)), np.zeros((8, 3)), np.full(8, 2e4),
                        rank=0)


def test_in_place_updates_reuse_outputs_without_leaking_other_ranks_delays():
    """`update_in_place` writes into buffers kept on the state, and for one `rank` the kernel
    writes that rank's delays alone: after every-rank updates (many delays > 0), or another
    rank's, the other ranks' delays must read 0, and they must match a fresh update's."""
    rng = np.random.default_rng(8)
    n, s = 300, 2
    params = PolicyParams.from_config(PACE, n)
    mine = init_state(n, s)
    for step, rank in enumerate([None] * 30 + [3, 3, 9, None, 9]):
        w = 200.0 + rng.exponential(500.0, (n, s))
        w[3] += 6000.0
        w[9] += 5000.0
        pure, want = update(params, mine, w, np.zeros((n, s)), np.full(n, 2e4), rank=rank)
        got = update_in_place(params, mine, w, np.zeros((n, s)), np.full(n, 2e4), rank=rank)
        np.testing.assert_array_equal(got.delay, want.delay, err_msg=f"step {step}")
        if rank is None:
            assert step < 29 or (got.delay > 0).sum() > 2
        else:
            assert got.delay[rank].any() and not np.delete(got.delay, rank, axis=0).any()
    assert mine.plan is not None and pure.plan is not mine.plan


def test_fused_update_reads_the_gathered_matrix_in_place():
    """The host backend passes columns of its gathered [N, 2 + 2 S] matrix: the kernel takes
    those strided views as they are (one compiled signature, no copy), and read-only or
    float32 inputs too, all with the same numbers as contiguous copies."""
    import gpupace.policy_fast as fast

    rng = np.random.default_rng(11)
    n, s = 64, 3
    rows = np.empty((n, 2 + 2 * s))
    rows[:, 1] = rng.normal(2e4, 300, n)
    rows[:, 2:2 + s] = 100 + rng.exponential(500, (n, s))
    rows[:, 2 + s:] = rng.uniform(0, 50, (n, s))
    w, d, steps = rows[:, 2:2 + s], rows[:, 2 + s:], rows[:, 1]
    params = PolicyParams.from_config(PaceConfig(mode="pace", warmup_steps=0), n)
    copies = [np.ascontiguousarray(a) for a in (w, d, steps)]
    frozen = [a.copy() for a in copies]
    for a in frozen:
        a.flags.writeable = False
    narrow = [a.astype(np.float32) for a in copies]
    want = update(params, init_state(n, s), *copies, fused=True, rank=5)
    for inputs in ((w, d, steps), frozen, narrow):
        out = update(params, init_state(n, s), *inputs, fused=True, rank=5)
        tol = 1e-4 if inputs is narrow else 0.0
        for name in ("earliness", "lowest", "spread", "straggler", "delay"):
            np.testing.assert_allclose(got(out[1], name), got(want[1], name), rtol=tol,
                                       atol=tol, err_msg=name)
        np.testing.assert_allclose(out[0].floor, want[0].floor, rtol=tol, atol=tol)
    assert len(fast.fused_update.signatures) == 1  # every call took the one compiled kernel


def test_one_paused_step_does_not_switch_the_delays_off():
    """A checkpoint: rank 0 is 30 s late once, so every other rank is 30 s early at that step.
    The state learns from earliness clipped at mean + OUTLIER_Z sd (+ guard): the early ranks'
    delays are back within a few steps (385 steps before the clip), and a real change of the
    straggler's lateness (5 -> 10 ms) is still followed."""
    n, s = 64, 4
    rng = np.random.default_rng(0)
    params = PolicyParams.from_config(PaceConfig(mode="pace"), n)
    state = init_state(n, s)

    def step(late_us=5000.0, pause_us=0.0):
        arrival = rng.normal(0, 200, (n, s))
        arrival[n - 1] += late_us  # a persistent straggler
        arrival[0] += pause_us
        w = arrival.max(axis=0) - arrival + 300
        stats = update_in_place(params, state, w, np.zeros((n, s)), np.full(n, 1e5))
        return stats.delay[1:n - 1, 0].mean()

    for _ in range(1500):
        before = step()
    assert before > 3000
    step(pause_us=30e6)
    after = [step() for _ in range(5)]
    assert after[-1] > 0.9 * before, after
    for _ in range(300):
        later = step(late_us=10_000.0)
    assert later > 1.8 * before  # followed the straggler's new lateness


def test_another_site_count_keeps_what_the_first_sites_learnt():
    """A step with one more paced site (a logged loss), then the usual count again: the first
    sites keep floors, means, hysteresis and the step count (no new warm-up), a new site
    starts afresh, and the resized state updates as any other."""
    params = PolicyParams.from_config(PaceConfig(warmup_steps=0, on_steps=1), 4)
    state = init_state(4, 2)
    rng = np.random.default_rng(0)
    def early(sites):
        w = rng.uniform(0.0, 100.0, (4, sites))
        w[3] += 5000.0  # rank 3 early at every site
        return w

    for _ in range(60):
        update_in_place(params, state, early(2), np.zeros((4, 2)), np.full(4, 1e5))
    assert state.floor[3].min() > 1000.0
    grown = resize_state(state, 3)
    assert grown.shape == (4, 3) and grown.step == state.step == 60
    for name in ("floor", "calm", "mean", "var"):
        np.testing.assert_array_equal(getattr(grown, name)[:, :2], getattr(state, name))
    np.testing.assert_array_equal(grown.var[:, 2], -1.0)  # no sample yet
    assert grown.active[:2].all() and not grown.active[2]
    shrunk = resize_state(grown, 2)
    np.testing.assert_array_equal(shrunk.floor, state.floor)
    stats = update_in_place(params, shrunk, early(2), np.zeros((4, 2)), np.full(4, 1e5),
                            rank=3)
    assert shrunk.step == 61 and stats.delay[3].sum() > 0  # pacing goes on, no warm-up


@pytest.mark.parametrize("fused", [False, True, "from the 6th step"])
def test_a_step_of_fewer_sites_updates_those_and_keeps_the_others(fused, monkeypatch):
    """`update_leading`, as the host engine calls it for a step with fewer sites than the state
    holds (a DDP model's first step has one bucket): the first sites update as a state of that
    many would, the others keep every learnt value, the step count goes on; on both of the
    policy's paths, and with its cached view of the first sites across full-width steps (and
    across the switch from one path to the other, as `prepare_fused` makes it)."""
    import gpupace.policy as pol

    if fused:
        pol.prepare_fused()
    monkeypatch.setattr(pol, "_fused_ready", fused is True)  # the reference path: small states
    params = PolicyParams.from_config(PaceConfig(warmup_steps=0, on_steps=1,
                                                 holdoff_factor=0.0), 4)
    state = init_state(4, 3)
    rng = np.random.default_rng(2)

    def rows(sites):
        w = rng.uniform(0.0, 100.0, (4, sites))
        w[3] += 5000.0  # rank 3 early at every site
        return w, np.zeros((4, sites)), np.full(4, 1e5)

    for k, n in enumerate((3, 3, 3, 3, 1, 1, 3, 1, 1, 2, 3)):
        if fused == "from the 6th step" and k == 5:
            monkeypatch.setattr(pol, "_fused_ready", True)
        w, d, st_us = rows(n)
        before = state.copy()
        head = pol.PolicyState(*(getattr(before, k)[..., :n].copy() for k in pol.LEARNT),
                               step=before.step)
        want, _ = update_reference(params, head, w, d, st_us)
        pol.update_leading(params, state, w, d, st_us)
        assert state.step == before.step + 1 and state.shape == (4, 3)
        for k in ("floor", "calm", "mean", "var", "active", "above", "below", "last_seen",
                  "n_last", "delay"):
            np.testing.assert_allclose(getattr(state, k)[..., :n], getattr(want, k),
                                       rtol=1e-12, err_msg=f"{k} at {n} sites")
            if k != "delay":  # past the step's sites: untouched
                np.testing.assert_array_equal(getattr(state, k)[..., n:],
                                              getattr(before, k)[..., n:], err_msg=k)
    # Site 2 went on learning through the dips: six steps calm (one, had it started afresh)
    assert state.floor[3, 2] > 1000.0 and state.calm[3, 2] == 6


@pytest.mark.parametrize("case", ["mean C-ordered", "calm int32", "rank changes",
                                  "delays given back"])
def test_a_step_of_fewer_sites_on_a_state_of_any_layout_or_rank(case):
    """Four ways a review made `update_leading` wrong (states built by hand, or ranks changed
    between calls; the host engine meets none of them): the fused kernel converts an array of
    another layout to a private copy, whose update was lost; another rank's delays written into
    the full plan's buffer, which one rank's kernel never clears; the last delays given back as
    the applied ones changed under the stats by the copy-back."""
    import gpupace.policy as pol

    pol.prepare_fused()
    params = PolicyParams.from_config(PaceConfig(warmup_steps=0, on_steps=1,
                                                 holdoff_factor=0.0), 4)
    rng = np.random.default_rng(0)

    def rows(n):
        w = rng.uniform(0.0, 100.0, (4, n))
        w[3] += 5000.0
        return w, np.zeros((4, n)), np.full(4, 1e5)

    full_rank, lead_rank = (1, None) if case == "rank changes" else (None, None)
    state = init_state(4, 3)
    for _ in range(3):
        update_in_place(params, state, *rows(3), rank=full_rank)
    if case == "mean C-ordered":
        state.mean = np.ascontiguousarray(state.mean)
    elif case == "calm int32":
        state.calm = state.calm.astype(np.int32)
    w, d, st_us = rows(2)
    if case == "delays given back":
        d = state.delay[:, :2]  # a view: what was applied is what was planned
    applied = np.array(d)
    head = pol.PolicyState(*(np.array(getattr(state, k)[..., :2]) for k in pol.LEARNT),
                           step=state.step)
    want, want_stats = update_reference(params, head, w, applied, st_us, rank=lead_rank)
    stats = pol.update_leading(params, state, w, d, st_us, rank=lead_rank)
    for k in ("floor", "calm", "mean", "var", "active", "above", "below", "last_seen",
                  "n_last", "delay"):
        np.testing.assert_allclose(getattr(state, k)[..., :2], getattr(want, k), err_msg=k)
    np.testing.assert_allclose(stats.earliness(), want_stats.earliness())
    if case == "rank changes":  # back to rank 1 at full width: the others' delays are 0
        w, d, st_us = rows(3)
        update_in_place(params, state, w, d, st_us, rank=1)
        assert (state.delay[[0, 2, 3]] == 0).all(), state.delay


def test_safety_z_is_the_normal_quantile_of_the_risk_shared_by_the_ranks():
    from gpupace.policy import safety_z

    assert safety_z(0.1, 4) == pytest.approx(1.95996, abs=1e-4)  # 1 - 0.1/4 quantile
    assert safety_z(0.1, 64) == pytest.approx(2.95517, abs=1e-4)
    assert safety_z(0.1, 4096) == pytest.approx(4.06117, abs=1e-4)
    assert safety_z(1.0, 1) == 0.0  # the risk is capped at one half: no margin, never negative
    assert PolicyParams.from_config(PaceConfig(), 64).safety_z == pytest.approx(2.95517, abs=1e-4)


def _early_rank_zero(calm_break_at=None, steps=10):
    """Rank 0 500 us early at each step, rank 3 last; at `calm_break_at`, rank 0 is last."""
    w = np.array([[500.0], [300.0], [200.0], [0.0]])
    late = np.array([[0.0], [300.0], [200.0], [500.0]])
    return [late if k == calm_break_at else w for k in range(steps)]


@pytest.mark.parametrize("calm_break_at,delayed", [(None, list(range(2, 15))),
                                                    (2, [2, *range(11, 15)])])
def test_a_rank_is_delayed_only_after_its_holdoff_on_time(calm_break_at, delayed):
    """holdoff_factor 2: a rank never last needs 2 calm steps for each rank that has been.
    Rank 3 alone last: rank 0's floor rises (and it is delayed) from its 2nd step on time. A
    step in which rank 0 is last starts its count again, and it has been last then: it needs
    the whole holdoff, 2 x 4 ranks, 8 steps."""
    cfg = PACE.replace(holdoff_factor=2.0, guard_us=0.0)
    assert PolicyParams.from_config(cfg, 4).holdoff_steps == 8  # the bound, 2 x 4 ranks
    stats = run(cfg, _early_rank_zero(calm_break_at, steps=14))
    assert [k + 1 for k, s in enumerate(stats) if s.delay[0, 0] > 0] == delayed  # updates done


def test_the_holdoff_grows_with_the_ranks_that_take_turns_last_up_to_its_bound():
    """Per site, `n_last` counts the ranks that have been the straggler, each once; the
    holdoff is holdoff_factor steps each, within holdoff_factor x N and holdoff_max."""
    n = 6
    order = [5, 5, 4, 5, 3, 4, 2, 1, 0, 0]  # the straggler at each step, site 0; site 1: rank 5
    params = PolicyParams.from_config(PACE.replace(holdoff_factor=3.0), n)
    state = init_state(n, 2)
    counts = []
    for last in order:
        w = np.full((n, 2), 400.0)
        w[last, 0] = 0.0
        w[5, 1] = 0.0
        state, _ = update(params, state, w, np.zeros((n, 2)), np.full(n, 1e4))
        counts.append(state.n_last.tolist())
    assert [c[0] for c in counts] == [1, 1, 2, 2, 3, 3, 4, 5, 6, 6]
    assert [c[1] for c in counts] == [1] * len(order)
    assert state.last_seen[:, 1].tolist() == [False] * 5 + [True]
    assert holdoff(params, state.n_last).tolist() == [18.0, 3.0]  # 3 x 6 ranks: the bound
    capped = PolicyParams.from_config(PACE.replace(holdoff_factor=3.0, holdoff_max=10), n)
    assert holdoff(capped, state.n_last).tolist() == [10.0, 3.0]
    assert holdoff(params, np.zeros(1, dtype=np.int64)).tolist() == [3.0]  # none yet: one


@pytest.mark.parametrize("stragglers", ["persistent", "random"])
def test_the_holdoff_paces_a_persistent_stragglers_peers_at_once_and_random_ones_after_5n(
        stragglers):
    """64 ranks, one site, the last arrival rank 0 at every step or a random rank. Persistent:
    one rank counted last, a holdoff of 5 steps. Random: after t steps about N (1 - e^(-t/N))
    ranks have been last and 5 steps each stay above t, so above every calm counter, until t
    is about 5N (4.97N): no rank is delayed before about that, as with a holdoff of 5N."""
    n = 64
    params = PolicyParams.from_config(PACE.replace(holdoff_factor=5.0), n)
    rng = np.random.default_rng(0)
    state = init_state(n, 1)
    delayed = []
    for _ in range(7 * n):
        w = np.full((n, 1), 500.0)
        w[0 if stragglers == "persistent" else rng.integers(n), 0] = 0.0
        delayed.append(bool((update_in_place(params, state, w, np.zeros((n, 1)),
                                             np.full(n, 1e4)).delay > 0).any()))
    first = delayed.index(True) + 1 if any(delayed) else None  # updates done
    if stragglers == "persistent":
        assert state.n_last.tolist() == [1] and first == 5
    else:
        assert state.n_last.tolist() == [n] and (first is None or first >= 4.5 * n), first


def test_a_rank_last_now_and_then_beside_a_persistent_straggler_keeps_the_whole_holdoff():
    """64 ranks: rank 0 last at every step but the 2% in which rank 1 is. Rank 1 has been
    last, so it needs 5N calm steps, as before the holdoff counted the stragglers: with 5
    steps for each of the two ranks last, it was delayed on 79% of the steps (a review's
    closed-loop run). The ranks never last are paced after 10."""
    n = 64
    params = PolicyParams.from_config(PACE.replace(holdoff_factor=5.0), n)
    rng = np.random.default_rng(0)
    state = init_state(n, 1)
    rank1_delayed, others_delayed = [], []
    for _ in range(3000):
        w = np.full((n, 1), 500.0)
        w[:2, 0] = (10.0, 0.0) if rng.random() < 0.02 else (0.0, 300.0)  # rank 1 last, or 0
        stats = update_in_place(params, state, w, np.zeros((n, 1)), np.full(n, 1e4))
        rank1_delayed.append(stats.delay[1, 0] > 0)
        others_delayed.append((stats.delay[2:, 0] > 0).all())
    assert state.last_seen[:2, 0].all() and state.n_last.tolist() == [2]
    assert np.mean(rank1_delayed[200:]) < 0.05, np.mean(rank1_delayed[200:])
    assert all(others_delayed[20:])


def test_a_noisy_early_rank_is_delayed_no_further_than_its_mean_less_z_sd():
    """The safety margin binds where the floor alone would allow more: a rank early by 1 ms
    with 150 us of noise keeps its delay below gain x (mean - z sd) - guard."""
    cfg = PACE.replace(gain=1.0, guard_us=10.0, floor_rise=0.25)
    n, rng = 4, np.random.default_rng(1)
    ctl = Controller(cfg, n, 1)
    bound_by_margin = 0
    for _ in range(40):
        w = np.array([[1000.0], [400.0], [200.0], [0.0]]) + rng.normal(0.0, 150.0, (n, 1))
        w -= w.min()
        stats = ctl.update(w, np.zeros((n, 1)), np.full(n, 100_000.0))
        st_ = ctl.state
        margin = st_.mean - ctl.params.safety_z * np.sqrt(np.maximum(st_.var, 0.0))
        assert (stats.delay <= np.maximum(margin - cfg.guard_us, 0.0) + 1e-9).all()
        bound_by_margin += int(((margin < st_.floor) & (stats.delay > 0)).sum())
    assert bound_by_margin > 0


@pytest.mark.parametrize("fused", [False, True])
def test_the_last_arrival_gets_no_delay_even_with_a_floor_left(fused):
    """Rank 1 early for four steps builds a floor; then it is last. With a slow fall its bound
    stays positive, and only the straggler rule keeps its next delay at 0, in the reference
    and in the fused kernel (at the default floor_fall of 1 the floor falls to 0 and the rule
    went untested: mutations dropping it survived)."""
    cfg = PaceConfig(mode="pace", warmup_steps=0, on_steps=1, holdoff_factor=0.0,
                     threshold_us=10.0, release_us=5.0, gain=1.0, guard_us=0.0,
                     floor_fall=0.25, floor_rise=0.05)
    params = PolicyParams.from_config(cfg, 3)
    state = init_state(3, 1)
    early, late = np.array([[100.0], [300.0], [0.0]]), np.array([[290.0], [0.0], [280.0]])
    for w in (early,) * 4:
        state, _ = update(params, state, w, np.zeros((3, 1)), np.full(3, 1e4), fused=fused)
    floor = state.floor[1, 0]
    state, stats = update(params, state, late, np.zeros((3, 1)), np.full(3, 1e4), fused=fused)
    bound = min(state.floor[1, 0], state.mean[1, 0] - params.safety_z * state.var[1, 0] ** 0.5)
    assert stats.straggler[0] == 1 and bound > 40.0
    assert stats.delay[1, 0] == 0.0 and stats.delay[0, 0] > 0.0
    # its earliness 0: the floor falls by floor_fall of the way, not to 0
    assert state.floor[1, 0] == pytest.approx(0.75 * floor) and floor > 50.0
