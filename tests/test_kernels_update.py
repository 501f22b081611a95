"""The fused Triton update kernel against `gpupace.policy.update_reference` (the NumPy reference
itself: `policy.update` takes the Numba kernel in a process where a test or a host pacer made it
ready, and a straggler-rule bug in the reference then went unseen here), on the CPU under
TRITON_INTERPRET=1 (set for this module only, see test_kernels.py): random rows, parameters and
step sequences (hypothesis), odd rank and site counts, corrupted rows, disagreeing site counts,
a new site layout, the telemetry record and the row reset.

Inputs are multiples of 0.25 us so that sums and the hysteresis comparisons are exact in
float32 as in float64; floors and delays then agree to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from gpupace import PaceConfig, policy


class DeviceSide:
    """The kernel's buffers on the CPU, fed the way the device engine feeds them: the state of
    every rank (one program each, rank 0 first), or of `rank` alone (`alone`, as a pacer's)."""

    def __init__(self, k, n: int, m: int, rank: int = 0, ring_len: int = 8, alone: bool = False):
        self.k, self.n, self.m, self.rank = k, n, m, rank if alone else 0
        self.state = k["update"].new_state(1 if alone else n, m, world_size=n)
        self.ring = torch.full((ring_len, k["update"].record_len(n, m)), float("nan"))
        self.ring_step = torch.full((ring_len,), -1, dtype=torch.int64)
        self.row = torch.zeros(2 + 2 * m)

    def step(self, g: np.ndarray, n_sites: int, params) -> np.ndarray:
        red = {key: torch.from_numpy(v) for key, v in
               self.k["reduce"].reduce_reference(g, n_sites).items()}
        self.k["update"].update(torch.from_numpy(g), self.row, red, self.state, self.ring,
                                self.ring_step, params, n_sites=n_sites, rank=self.rank)
        step = int(self.state["counter"][0, 0]) - 1
        return self.ring[step % self.ring.shape[0]].numpy()


def make_rows(w, d, steps, m, counts=None):
    n, n_sites = w.shape
    g = np.full((n, 2 + 2 * m), np.nan, dtype=np.float32)
    g[:, 0] = n_sites if counts is None else counts
    g[:, 1] = steps
    g[:, 2 + m:] = 0.0
    g[:, 2:2 + n_sites] = w
    g[:, 2 + m:2 + m + n_sites] = d
    return g


def compare(dev: DeviceSide, state: policy.PolicyState, n_sites: int):
    s, r = dev.state, slice(dev.rank, dev.rank + dev.state["floor"].shape[0])
    np.testing.assert_allclose(s["floor"][:, :n_sites].numpy(), state.floor[r], rtol=1e-4, atol=2e-3)
    np.testing.assert_array_equal(s["calm"][:, :n_sites].numpy(), state.calm[r])
    for key in ("mean", "var"):  # policies with a running mean and variance of earliness
        if hasattr(state, key):
            np.testing.assert_allclose(s[key][:, :n_sites].numpy(), getattr(state, key)[r],
                                       rtol=1e-4, atol=2e-2)
    np.testing.assert_allclose(s["delay"][:, :n_sites].numpy(), state.delay[r], rtol=1e-4, atol=2e-3)
    for key in ("active", "above", "below", "n_last"):  # each program's copy of the site's
        got = s[key][:, :n_sites].numpy()
        np.testing.assert_array_equal(got.astype(bool) if key == "active" else got,
                                      np.broadcast_to(getattr(state, key), got.shape))
    seen = s["last_seen"][:, :n_sites].numpy().astype(bool)  # [programs, sites, ranks]
    np.testing.assert_array_equal(seen, np.broadcast_to(state.last_seen.T, seen.shape))
    assert (s["counter"][:, 1] == state.step).all()
    assert (s["delay"][:, n_sites:] == 0).all()


quarter = st.integers(0, 40_000).map(lambda q: q / 4.0)  # 0 to 10 ms
bad = st.sampled_from([float("nan"), -1.0, float("inf"), 2e9])


@st.composite
def configs(draw):
    threshold = draw(st.integers(1, 400)) / 4.0
    return PaceConfig(
        mode=draw(st.sampled_from(["pace", "pace", "observe"])),
        threshold_us=threshold,
        release_us=draw(st.integers(0, int(threshold * 4))) / 4.0,
        on_steps=draw(st.integers(1, 2)),
        off_steps=draw(st.integers(1, 3)),
        gain=draw(st.sampled_from([0.0, 0.5, 0.9, 1.0])),
        guard_us=draw(st.integers(0, 200)) / 4.0,
        max_delay_us=draw(st.sampled_from([5.0, 200.0, 50_000.0])),
        cap_fraction=draw(st.sampled_from([0.05, 0.5, 1.0])),
        floor_rise=draw(st.sampled_from([0.05, 0.25, 1.0])),
        floor_fall=draw(st.sampled_from([0.5, 1.0])),
        holdoff_factor=draw(st.sampled_from([0.0, 0.3, 0.5, 1.0])),
        warmup_steps=draw(st.integers(0, 2)),
    )


@st.composite
def scenarios(draw):
    n = draw(st.sampled_from([1, 2, 3, 5, 17]))
    m = draw(st.integers(1, 4))
    n_sites = draw(st.integers(1, m))
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        early = np.array([draw(quarter) for _ in range(n)])  # per-rank persistent earliness
        w = np.array([[float(early[i] + draw(st.integers(0, 40)) / 4) for _ in range(n_sites)]
                      for i in range(n)])
        d = np.array([[draw(st.integers(0, 80)) / 4 for _ in range(n_sites)] for _ in range(n)])
        if draw(st.integers(0, 4)) == 0:
            i, s = draw(st.integers(0, n - 1)), draw(st.integers(0, n_sites - 1))
            (w if draw(st.booleans()) else d)[i, s] = draw(bad)
        st_us = np.array([draw(st.one_of(st.integers(400, 80_000).map(lambda q: q / 4.0), bad))
                          for _ in range(n)])
        steps.append((w, d, st_us))
    return draw(configs()), n, m, n_sites, steps


# No shrinking: under the interpreter it takes minutes; a failure shows the example as drawn.
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(sc=scenarios())
def test_update_kernel_agrees_with_policy(k, sc):
    cfg, n, m, n_sites, steps = sc
    params = policy.PolicyParams.from_config(cfg, n)
    dev = DeviceSide(k, n, m)  # every rank, one program each
    alone = DeviceSide(k, n, m, rank=n - 1, alone=True)  # a pacer's: its own rank
    state = policy.init_state(n, n_sites)
    U = k["update"]
    for w, d, st_us in steps:
        rec = dev.step(make_rows(w, d, st_us, m), n_sites, params)
        rec_alone = alone.step(make_rows(w, d, st_us, m), n_sites, params)
        state, stats = policy.update_reference(params, state, w, d, st_us)
        compare(dev, state, n_sites)
        compare(alone, state, n_sites)
        # the same record but for the step time, the recording rank's
        same = np.arange(rec.size) != U.REC_STEP_TIME
        np.testing.assert_array_equal(rec_alone[same], rec[same])
        np.testing.assert_array_equal(rec_alone[U.REC_STEP_TIME], np.float32(st_us[n - 1]))
        np.testing.assert_array_equal(rec[U.REC_STEP_TIME], np.float32(st_us[0]))
        assert rec[U.REC_OK] == 1.0
        assert rec[U.REC_CAP] == pytest.approx(stats.cap_us, rel=1e-6, abs=1e-6)
        sp = np.nan_to_num(stats.spread, nan=-1.0)
        s_best = int(np.argmax(sp))
        assert rec[U.REC_SITE] == s_best
        np.testing.assert_allclose(rec[U.REC_SPREAD], stats.spread[s_best], atol=1e-3,
                                   equal_nan=True)
        assert rec[U.REC_STRAGGLER] == stats.straggler[s_best]
        assert bool(rec[U.REC_ACTIVE]) == bool(stats.active.any())
        h = U.REC_HEAD
        # NaN for invalid rows, as the host's make_record writes them
        np.testing.assert_allclose(rec[h:h + n],
                                   stats.earliness(s_best),
                                   atol=1e-3)
        np.testing.assert_allclose(rec[h + n:h + 2 * n], np.nansum(w, axis=1), rtol=1e-6)
        np.testing.assert_allclose(rec[h + 2 * n:h + 3 * n], np.nansum(d, axis=1), rtol=1e-6)
        np.testing.assert_allclose(rec[h + 3 * n:h + 4 * n], st_us.astype(np.float32))
        np.testing.assert_allclose(rec[h + 4 * n:h + 4 * n + n_sites], stats.spread, atol=1e-3,
                                   equal_nan=True)
        # this rank's row is empty again for the next step
        assert dev.row[0] == 0 and math.isnan(dev.row[1])
        assert torch.isnan(dev.row[2:2 + m]).all() and (dev.row[2 + m:] == 0).all()
    assert (dev.state["counter"][:, 0] == len(steps)).all()
    assert alone.row[0] == 0 and torch.isnan(alone.row[2:2 + m]).all()


@pytest.mark.parametrize("factor", [0.3, 0.7, 1.1, 2.5, 5.0])
def test_the_kernels_holdoff_table_is_the_policys(k, factor):
    """The kernel reads the holdoff of the ranks never last from a table made on the host, at
    k = 0..N ranks last: the reference's, to the step (1.1 x 100 is 110, not 111)."""
    n = 300
    params = policy.PolicyParams.from_config(PaceConfig(holdoff_factor=factor), n)
    table = k["update"].holdoff_table(params, n).numpy()
    np.testing.assert_array_equal(table, policy.holdoff(params, np.arange(n + 1)))
    if factor == 1.1:
        assert table[100] == 110 and params.holdoff_steps == 330


@pytest.mark.parametrize("alone", [False, True])
def test_a_rank_that_has_been_last_keeps_the_whole_holdoff_as_in_the_policy(k, alone):
    """6 ranks, holdoff_factor 1: rank 5 last at every step but the 3rd, where rank 1 is. The
    ranks never last need 2 calm steps (two ranks have been last), rank 1 needs 6, as the
    reference holds them (`policy.holdoff`), in every program and in rank 1's alone."""
    n, m = 6, 2
    cfg = PaceConfig(mode="pace", warmup_steps=0, on_steps=1, holdoff_factor=1.0,
                     threshold_us=50.0, release_us=10.0, guard_us=0.0)
    params = policy.PolicyParams.from_config(cfg, n)
    dev = DeviceSide(k, n, m, rank=1, alone=alone)
    state = policy.init_state(n, 1)
    rank1 = []
    for step in range(12):
        w = np.array([[400.0], [300.0], [350.0], [250.0], [450.0], [0.0]])
        if step == 2:
            w[1, 0], w[5, 0] = 0.0, 20.0
        dev.step(make_rows(w, np.zeros((n, 1)), np.full(n, 1e4), m), 1, params)
        state, _ = policy.update_reference(params, state, w, np.zeros((n, 1)), np.full(n, 1e4))
        compare(dev, state, 1)
        rank1.append(bool(state.delay[1, 0] > 0))
    assert state.last_seen[[1, 5], 0].all() and state.n_last.tolist() == [2]
    # Paced from its first calm step (one rank had been last), not after its late step, the
    # 3rd, until its 6th calm one
    assert rank1 == [True] * 2 + [False] * 6 + [True] * 4, rank1
    assert (state.delay[[0, 2, 3, 4], 0] > 0).all()


@pytest.mark.parametrize("alone", [False, True])
def test_noisy_early_ranks_get_delays_bounded_by_the_safety_margin_and_the_cap(k, alone):
    """Delays that three rules shape, kernel against policy at every step: noisy arrivals (so
    the mean - z sd margin is below the floor: the hypothesis examples, as CI draws them,
    never gave a delay above zero) and a cap that one rank's delays over its sites reach.
    Removing either rule from the kernel passed every CPU test before this one."""
    n, m = 5, 3
    cfg = PaceConfig(mode="pace", warmup_steps=0, on_steps=1, holdoff_factor=0.0,
                     threshold_us=50.0, release_us=10.0, gain=0.9, guard_us=0.0,
                     cap_fraction=0.1, floor_rise=0.25)
    params = policy.PolicyParams.from_config(cfg, n)
    dev = DeviceSide(k, n, m, rank=0, alone=alone)
    state = policy.init_state(n, m)
    rng = np.random.default_rng(0)
    early = np.array([1000.0, 600.0, 300.0, 100.0, 0.0])
    margin_bound = capped = 0
    for _ in range(12):
        noise = rng.normal(0.0, 120.0, (n, m)).clip(-300.0, 300.0)
        w = np.round((early[:, None] + noise + 300.0) * 4) / 4  # multiples of 0.25 us
        d, st_us = np.zeros((n, m)), np.full(n, 10_000.0)
        dev.step(make_rows(w, d, st_us, m), m, params)
        state, stats = policy.update_reference(params, state, w, d, st_us)
        compare(dev, state, m)
        margin = state.mean - params.safety_z * np.sqrt(np.maximum(state.var, 0.0))
        margin_bound += int(((margin < state.floor) & (state.delay > 0)).sum())
        capped += int(np.isclose(state.delay.sum(axis=1), stats.cap_us).sum())
    assert margin_bound > 0 and capped > 0, (margin_bound, capped)  # both rules were at work


def paced(n=3, m=2):
    cfg = PaceConfig(mode="pace", warmup_steps=0, on_steps=1, holdoff_factor=0.0,
                     threshold_us=10.0, release_us=5.0, gain=1.0, guard_us=0.0)
    return policy.PolicyParams.from_config(cfg, n)


def skewed(n=3, n_sites=2):
    w = np.tile(np.arange(n, dtype=float)[::-1, None] * 100.0, (1, n_sites))  # rank 0 earliest
    return w, np.zeros((n, n_sites)), np.full(n, 10_000.0)


def test_disagreeing_site_counts_learn_nothing_and_zero_every_delay(k):
    params, (w, d, st_us) = paced(), skewed()
    dev = DeviceSide(k, 3, 2)
    for _ in range(3):
        dev.step(make_rows(w, d, st_us, 2), 2, params)
    assert dev.state["delay"][0, 0] > 0  # paced: rank 0 arrives 200 us early
    before = {key: v.clone() for key, v in dev.state.items()}
    rec = dev.step(make_rows(w, d, st_us, 2, counts=np.array([2, 2, 1])), 2, params)
    assert rec[k["update"].REC_OK] == 0.0
    assert (dev.state["delay"] == 0).all()
    for key in ("floor", "calm", "active", "above", "below"):
        assert torch.equal(dev.state[key], before[key]), key
    assert torch.equal(dev.state["counter"][:, 1], before["counter"][:, 1])  # no policy step
    assert torch.equal(dev.state["counter"][:, 0], before["counter"][:, 0] + 1)  # a step done


def test_no_sites_is_a_disagreement(k):
    dev = DeviceSide(k, 2, 2)
    rec = dev.step(make_rows(*skewed(2, 1), 2, counts=np.array([0, 0])), 0, paced(2))
    assert rec[k["update"].REC_OK] == 0.0 and (dev.state["delay"] == 0).all()


@pytest.mark.parametrize("alone", [False, True])
def test_another_site_count_keeps_the_first_sites(k, alone):
    """As the host engine: a step with one more paced collective (a logged loss) keeps what the
    first sites learnt and the step count (`policy.resize_state`); the new site starts afresh;
    back to the old count, the site that went keeps what it learnt (`policy.update_leading`),
    and takes it up again when it comes back (it started afresh, and a DDP model's first step
    of one bucket left a state loaded from a checkpoint with its first site's alone)."""
    params = paced()
    dev = DeviceSide(k, 3, 3, rank=1, alone=alone)
    state = policy.init_state(3, 2)
    for n_sites, steps in ((2, 3), (3, 2), (2, 2), (3, 1)):
        if n_sites > state.shape[1]:
            state = policy.resize_state(state, n_sites)
        for _ in range(steps):
            w, d, st_us = skewed(3, n_sites)
            w[1] += 40.0 * n_sites  # the site count shows in what rank 1 learns
            dev.step(make_rows(w, d, st_us, 3), n_sites, params)
            policy.update_leading(params, state, w, d, st_us)
        compare(dev, policy.leading_sites(state, n_sites), n_sites)
    assert state.step == 8 and (dev.state["counter"][:, 1] == 8).all()
    assert (dev.state["calm"][:, 2] == state.calm[dev.rank:dev.rank + dev.state["calm"].shape[0],
                                                  2]).all()
    assert state.calm[0, 2] == 3  # site 2: two steps, two without it, one more: calm 3


def test_sites_that_went_forget_their_deadline(k):
    """As the host engine: a site past a new, smaller count loses its mean arrival and its
    last exit, so that when it comes back its first arrival is not timed from an exit steps
    old; the sites kept keep theirs; a step with the same count, or a disagreement, resets
    nothing."""
    params = paced()
    dev = DeviceSide(k, 3, 4)  # room for 4 sites, 3 used
    w, d, st_us = skewed(3, 3)
    dev.step(make_rows(w, d, st_us, 4), 3, params)
    usual, stamps = dev.state["usual"], dev.state["stamps"]
    usual.fill_(500.0)
    stamps[:, :, 2] = 123
    dev.step(make_rows(w, d, st_us, 4), 3, params)  # the same count: the 4th is left alone
    assert (usual == 500.0).all() and (stamps[:, :, 2] == 123).all()
    w2, d2, st2 = skewed(3, 2)
    dev.step(make_rows(w2, d2, st2, 4, counts=np.array([2, 2, 1])), 2, params)  # disagreement
    assert (usual == 500.0).all() and (stamps[:, :, 2] == 123).all()
    dev.step(make_rows(w2, d2, st2, 4), 2, params)  # two sites now
    assert (usual[:, :2] == 500.0).all() and torch.isnan(usual[:, 2:]).all()
    assert (stamps[:, :2, 2] == 123).all() and (stamps[:, 2:, 2] == 0).all()


@pytest.mark.parametrize("alone", [False, True])
def test_the_straggler_is_never_delayed_even_with_a_floor(k, alone):
    # Rank 1 is early for four steps and builds a floor; then it is last. With a slow fall and
    # a slow mean its bound stays positive (42 us), and only the straggler rule keeps its
    # delay at zero, whether the kernel updates every rank or rank 1 alone (its program 0).
    cfg = PaceConfig(mode="pace", warmup_steps=0, on_steps=1, holdoff_factor=0.0,
                     threshold_us=10.0, release_us=5.0, gain=1.0, guard_us=0.0,
                     floor_fall=0.25, floor_rise=0.05)
    params = policy.PolicyParams.from_config(cfg, 3)
    dev, state = DeviceSide(k, 3, 1, rank=1, alone=alone), policy.init_state(3, 1)
    early = np.array([[100.0], [300.0], [0.0]])
    late = np.array([[290.0], [0.0], [280.0]])
    for w in (early,) * 4 + (late,):
        d, st_us = np.zeros((3, 1)), np.full(3, 10_000.0)
        dev.step(make_rows(w, d, st_us, 1), 1, params)
        state, stats = policy.update_reference(params, state, w, d, st_us)
    bound = min(state.floor[1, 0], state.mean[1, 0] - params.safety_z * state.var[1, 0] ** 0.5)
    assert stats.straggler[0] == 1 and bound > 40.0
    compare(dev, state, 1)
    assert dev.state["delay"][1 - dev.rank, 0] == 0


def test_update_launcher_checks_arguments(k):
    dev = DeviceSide(k, 2, 2)
    g = torch.from_numpy(make_rows(*skewed(2, 1), 2))
    red = {key: torch.from_numpy(v) for key, v in k["reduce"].reduce_reference(g.numpy(), 1).items()}
    with pytest.raises(ValueError, match="n_sites"):
        k["update"].update(g, dev.row, red, dev.state, dev.ring, dev.ring_step, paced(2),
                           n_sites=3, rank=0)
    with pytest.raises(ValueError, match="rank"):  # two ranks' state from rank 1: past N
        k["update"].update(g, dev.row, red, dev.state, dev.ring, dev.ring_step, paced(2),
                           n_sites=1, rank=1)
    bad = {**dev.state, "counter": torch.zeros(k["update"].COUNTER_LEN, dtype=torch.int64)}
    with pytest.raises(ValueError, match="counter"):  # the old one-rank layout
        k["update"].update(g, dev.row, red, bad, dev.ring, dev.ring_step, paced(2),
                           n_sites=1, rank=0)


def test_the_calm_counter_stops_at_calm_max_instead_of_wrapping(k):
    """int32: one more than 2^31 - 1 steps calm wrapped negative, and the floor never rose
    again. From CALM_MAX it stays there; a late step still resets it."""
    params, (w, d, st_us) = paced(), skewed()
    dev = DeviceSide(k, 3, 2)
    top = k["update"].CALM_MAX
    dev.state["calm"][:, :] = top
    dev.state["counter"][:, 2] = 2  # a state of 2 sites: not fresh ones
    dev.step(make_rows(w, d, st_us, 2), 2, params)
    # ranks 0 and 1 arrive early at both sites, rank 2 last
    assert dev.state["calm"][:2].tolist() == [[top, top], [top, top]]
    assert dev.state["calm"][2].tolist() == [0, 0]
