"""Simulator: the properties issue 5 asks for, at sizes that run in seconds on 2 cores."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from gpupace.config import PaceConfig
from gpupace.policy import oracle_delays
from gpupace.sim import Scenario, engine, presets, simulate
from gpupace.sim.scenario import MAX_BUCKETS, SPIN_COUPLING
from gpupace.sim.simulate import policy_start_step, result_bytes

pytestmark = pytest.mark.timeout(120)


def gain_pct(a, b) -> float:
    return 100.0 * (a.summary()["throughput"] / b.summary()["throughput"] - 1.0)


def costless(sc: Scenario) -> Scenario:
    """`sc` with pacing's own kernels free: what the control law's decisions gain or lose,
    below the 0.01% a step that its kernels cost (tested on its own)."""
    return sc.replace(pacing_site_us=0.0, pacing_step_us=0.0)


def test_quiet_has_zero_cv_and_pacing_never_switches_on():
    sc = presets.quiet(2)
    none = simulate(sc, "none", steps=200)
    paced = simulate(sc, "gpupace", steps=200)
    for res in (none, paced):
        assert res.summary()["step_time_cv"] < 1e-9
        assert not res.active.any()
        assert np.all(res.delay_us == 0)
        assert np.all(res.spread_us < 1e-6)
    # pacing's own cost, delay or none: the backward hides every collective's kernels but the
    # last one's, and the step's own work comes on top
    np.testing.assert_allclose(paced.step_us[1:] - none.step_us[1:],
                               sc.pacing_site_us + sc.pacing_step_us, atol=1e-6)
    np.testing.assert_array_equal(simulate(costless(sc), "gpupace", steps=200).step_us,
                                  none.step_us)


def test_pacing_costs_more_where_the_collectives_follow_each_other():
    """With transfers longer than a bucket's compute each collective waits for the one before,
    so every collective's kernels count: 10 sites' worth and the step's, on the policy and on
    the oracle alike, and what the quiet job costs in sites is not what this one does."""
    sc = presets.quiet(2).replace(nic_gbps=10.0)
    none = simulate(sc, "none", steps=50)
    np.testing.assert_array_equal(simulate(costless(sc), "none", steps=50).step_us, none.step_us)
    for policy in ("gpupace", "oracle"):
        got = simulate(sc, policy, steps=50).step_us[1:] - none.step_us[1:]
        np.testing.assert_allclose(got, sc.buckets * sc.pacing_site_us + sc.pacing_step_us,
                                   rtol=1e-9)


@pytest.mark.parametrize("name", ["jitter", "locality", "fabric", "paper"])
def test_no_coupling_gpupace_loses_at_most_half_a_percent(name):
    # pure bulk-synchronous timing: no coupling, and the pacing spin free as well
    sc = presets.get_preset(name, 2).replace(coupling=0.0, paced_coupling=0.0)
    none = simulate(sc, "none", steps=600, seed=3)
    paced = simulate(sc, "gpupace", steps=600, seed=3)
    assert gain_pct(paced, none) >= -0.5


@pytest.mark.parametrize("gain,guard", [(1.0, 0.0), (0.9, 20.0)])
def test_persistent_straggler_delays_converge_to_earliness(gain, guard):
    sc = Scenario(nodes=1, gpus_per_node=6, locality_pattern_us=(0, 0, 0, 0, 0, 9_000.0))
    cfg = PaceConfig(mode="pace", gain=gain, guard_us=guard)
    res = simulate(sc, "gpupace", config=cfg, steps=400, keep_sites=True)
    w, d = res.site_wait_us[-1], res.site_delay_us[-1]
    early = (w + d) - (w + d).min(axis=0)  # the clock-free earliness, per rank and site
    assert res.active[-1].all()
    assert np.all(d[5] == 0)  # the straggler waits for nobody
    want = np.clip(gain * early[:5] - guard, 0, None)
    np.testing.assert_allclose(d[:5], want, rtol=0.01)
    assert early[:5].min() > 1000.0  # fast ranks really are early


@pytest.mark.parametrize("name", ["amplification", "mixed", "paper"])
def test_coupled_presets_oracle_bounds_gpupace_and_gains(name):
    sc = costless(presets.get_preset(name, 2))
    res = {p: simulate(sc, p, steps=800, seed=1) for p in ("none", "gpupace", "oracle")}
    thr = {p: r.summary()["throughput"] for p, r in res.items()}
    # With the coupling measured on an H200 the policy ties no pacing, within 0.01% (paper,
    # 16-64 nodes: -0.002%); it must not lose more
    assert thr["oracle"] >= thr["gpupace"] >= thr["none"] * (1 - 1e-4), thr
    # the coupling is there to be removed, weak as measured: the oracle gained 0.015% (paper),
    # 0.022% (mixed) and 0.30% (amplification, a persistent matmul's coupling) here
    assert thr["oracle"] > thr["none"] * 1.0001, thr


def phased_stragglers(noise_sigma: float = 0.0) -> Scenario:
    """The amplification the design describes: rank 0 is late from the forward on (input
    pipeline), rank 1 carries a backward handicap, so rank 1 waits for rank 0 on the first
    buckets (slowed by the coupling) and is the last one at the end of the step. The coupling,
    0.2, is strong enough to show the mechanism; the ones measured on an H200 are 0.052 and
    0.344 (`scenario.NCCL_COUPLING`, `PERSISTENT_NCCL_COUPLING`)."""
    return presets.quiet(1).replace(
        name="phased", input_pattern_us=(3000.0,) + (0.0,) * 7,
        locality_pattern_us=(0.0, 4000.0) + (0.0,) * 6, coupling=0.2,
        paced_coupling=SPIN_COUPLING, noise_sigma=noise_sigma)


def test_coupled_persistent_stragglers_oracle_ge_gpupace_ge_none():
    sc = phased_stragglers()
    res = {p: simulate(sc, p, steps=600, seed=1) for p in ("none", "gpupace", "oracle")}
    thr = {p: r.summary()["throughput"] for p, r in res.items()}
    assert thr["oracle"] >= thr["gpupace"] > thr["none"], thr
    assert gain_pct(res["gpupace"], res["none"]) > 0.5 * gain_pct(res["oracle"], res["none"])


def test_coupled_noisy_preset_gpupace_costs_nothing_and_stays_below_the_oracle():
    """On `mixed`, noise dominates: nobody is reliably early, so the policy's bound (below the
    floor and below mean - z sigma) keeps delays small, and a rank that arrives late applies
    its delay as a deadline (shortened by its lateness), so pacing never makes it the
    straggler. Measured at 2 nodes, 800 steps, seeds 1-3: gpupace +0.0002..+0.004%, oracle
    +0.23..+0.28%: it costs nothing but captures almost none of the oracle's gain (issue 5)."""
    sc = costless(presets.mixed(2))
    res = {p: simulate(sc, p, steps=800, seed=1) for p in ("none", "gpupace", "oracle")}
    gain = gain_pct(res["gpupace"], res["none"])
    assert 0.0 <= gain <= gain_pct(res["oracle"], res["none"])


def test_oracle_delays_every_rank_to_the_last_arrival():
    res = simulate(presets.amplification(1), "oracle", steps=60, seed=4, keep_sites=True)
    w, d = res.site_wait_us, res.site_delay_us
    early = (w + d) - (w + d).min(axis=1, keepdims=True)  # true earliness per step and site
    np.testing.assert_allclose(d, early, atol=1e-6)
    np.testing.assert_allclose(w.min(axis=1), w.max(axis=1))  # everyone enters together


def test_same_seed_same_result_and_other_seed_differs():
    sc = presets.mixed(1)
    a = simulate(sc, "gpupace", steps=150, seed=7)
    b = simulate(sc, "gpupace", steps=150, seed=7)
    c = simulate(sc, "gpupace", steps=150, seed=8)
    np.testing.assert_array_equal(a.step_us, b.step_us)
    np.testing.assert_array_equal(a.delay_us, b.delay_us)
    assert not np.array_equal(a.step_us[1:], c.step_us[1:])


@pytest.mark.parametrize("make,words", [
    (lambda: Scenario(nodes=0), ["nodes", "0", "[1, 4096]"]),
    (lambda: Scenario(coupling=1.5), ["coupling", "1.5"]),
    (lambda: Scenario(noise_sigma=float("nan")), ["noise_sigma", "nan"]),
    (lambda: Scenario(grad_mb=1000, bucket_mb=1), ["buckets", str(MAX_BUCKETS)]),
    (lambda: Scenario(locality_pattern_us=(0, -5)), ["locality_pattern_us", "-5"]),
    (lambda: Scenario().replace(colour=1), ["unknown", "colour"]),
    (lambda: simulate(presets.quiet(1), "magic"), ["policy", "magic"]),
    (lambda: simulate(presets.quiet(1), steps=1), ["steps", "1"]),
    (lambda: simulate(presets.quiet(1), seed=-1), ["seed", "-1"]),
    (lambda: presets.get_preset("nope", 4), ["preset", "nope", "paper"]),
])
def test_bad_parameters_raise_a_clear_error(make, words):
    with pytest.raises(ValueError) as e:
        make()
    for w in words:
        assert w in str(e.value)


def test_single_mode_presets_label_one_mode_each():
    assert presets.quiet(4).failure_modes() == []
    for name in ("jitter", "locality", "fabric", "amplification"):
        modes = presets.get_preset(name, 32).failure_modes()
        assert modes == [name] if name != "amplification" else "amplification" in modes, modes
    assert set(presets.paper(32).failure_modes()) == {"jitter", "locality", "fabric",
                                                       "amplification"}


def test_locality_names_slow_ranks_and_fabric_keeps_arrivals_calm():
    loc = simulate(presets.locality(2), "none", steps=50)
    assert loc.slow_ranks == [6, 7, 14, 15]
    assert set(np.argmin(loc.earliness_us[1:], axis=1)) <= {6, 7, 14, 15}
    fab = simulate(presets.fabric(32), "none", steps=300)
    assert np.all(fab.spread_us < 1e-6)  # every rank arrives together
    assert fab.summary()["step_time_cv"] > 0.01  # yet the step time varies


def test_amplification_costs_more_per_rank_at_larger_world_size():
    small = simulate(presets.amplification(1), "none", steps=300).summary()
    big = simulate(presets.amplification(16), "none", steps=300).summary()
    assert big["throughput"] / 16 < small["throughput"] * 0.99


def test_spin_coupling_slows_the_early_rank_by_coupling_times_its_wait():
    # two ranks, two buckets, no noise: rank 0 is 1000 us early at bucket 0 and waits inside
    # the collective (coupling 0.2), so its bucket-1 compute loses 0.2 x 1000 us of progress
    n, nb, kc = 2, 2, 0.2
    start, fwd = np.zeros(n), np.array([0.0, 1000.0])
    work = np.full((n, nb), 5000.0)
    xfer = np.array([100.0, 100.0])
    ready, a, e, w, d = (np.zeros((n, nb)) for _ in range(5))
    s, x = np.zeros(nb), np.zeros(nb)
    engine.run_step(start, fwd, work, xfer, np.zeros((n, nb)), 0.0, 0.0, kc, ready, a, e, s, x, w, d,
                    np.full((n, nb), np.nan), np.full(nb, np.nan), 0.05)
    assert x[0] == 6100.0  # last arrival 6000 + transfer
    # rank 0: bucket 1 from 5000; 1100 us in the collective at 0.8 speed, then full speed
    assert ready[0, 1] == pytest.approx(5000 + 1100 + (5000 - 1100 * 0.8))
    # rank 1: from 6000; 100 us at 0.8, then full speed
    assert ready[1, 1] == pytest.approx(6000 + 100 + (5000 - 100 * 0.8))
    np.testing.assert_allclose(w[:, 0], [1100.0, 100.0])


def test_paper_baseline_stays_calibrated():
    # the fit behind presets.PAPER_SCALE: baseline CV ~0.22 at 64 nodes, per-node throughput
    # falling with node count; a model change that moves these must refit the preset
    per_node = []
    for nodes in (4, 16):
        s = simulate(presets.paper(nodes), "none", steps=300, seed=0).summary(skip=0)
        per_node.append(s["throughput"] / nodes)
    assert per_node[1] < 0.97 * per_node[0]
    big = simulate(presets.paper(64), "none", steps=3000, seed=0).summary(skip=0)
    assert 0.17 < big["step_time_cv"] < 0.27
    assert 7000 < big["throughput"] < 9500  # the study's baseline: 8200 samples/s


def test_inlined_oracle_equals_policy_oracle_delays():
    res = simulate(presets.mixed(1), "oracle", steps=40, seed=2, keep_sites=True)
    w, d = res.site_wait_us, res.site_delay_us  # [steps, ranks, sites]
    natural = w + d  # time from natural arrival to the common exit
    for k in range(natural.shape[0]):
        for b in range(natural.shape[2]):
            want = oracle_delays(natural[k, :, b].max() - natural[k, :, b])
            np.testing.assert_allclose(d[k, :, b], want, atol=1e-6)


@pytest.mark.parametrize("kc,kp", [(0.0, 0.2), (0.1, 0.3), (0.2, 0.2)])
def test_oracle_delays_nobody_where_a_spin_costs_what_waiting_does(kc, kp):
    """Foresight gains nothing by a delay when the pacing spin slows compute at least as much as
    a waiting collective: the oracle ties no pacing there, and so stays above the policy (it
    delayed every rank to the last arrival, and fell 0.17% below no pacing at kc 0, kp 0.2)."""
    sc = costless(presets.paper(1).replace(coupling=kc, paced_coupling=kp))
    res = {p: simulate(sc, p, steps=300, seed=0) for p in ("none", "gpupace", "oracle")}
    assert not res["oracle"].active.any() and not res["oracle"].delay_us.any()
    np.testing.assert_array_equal(res["oracle"].step_us, res["none"].step_us)
    thr = {p: r.summary()["throughput"] for p, r in res.items()}
    assert thr["oracle"] >= thr["gpupace"], thr


@pytest.mark.timeout(300)
def test_random_stragglers_cost_no_throughput_at_512_ranks():
    """DESIGN: random stragglers must not cost throughput. A rank is delayed only after 5N steps
    on time; a bound of 1000 on that holdoff (the default until 2026-12-01) let e^(-1000/512),
    14%, of 512 ranks through by chance: -0.033% on `jitter` at 64 nodes (6,000 steps, seed
    0), now -0.0017%. Pacing's kernels cost 0.012% more (`costless`)."""
    sc = costless(presets.jitter(64))
    skip = policy_start_step(PaceConfig(mode="pace"), sc.ranks)
    assert skip == 5 + 5 * sc.ranks  # warm-up, holdoff
    steps = skip + 1500
    none, paced = (simulate(sc, p, steps=steps, seed=0).summary(skip=skip)
                   for p in ("none", "gpupace"))
    assert paced["throughput"] >= none["throughput"] * (1 - 1e-4), (paced, none)


def test_a_persistent_stragglers_peers_are_paced_within_tens_of_steps_at_512_ranks():
    """The holdoff counts the ranks that have been last (`policy.holdoff`): with one node's
    GPUs always last (`locality`), one rank per site, 5 steps. Under the rule before
    2026-12-01, 5 steps a rank of the job, no rank of 512 could be delayed before step 2568."""
    sc = presets.locality(64)
    res = simulate(sc, "gpupace", steps=60, seed=0)
    assert res.extra["n_last"].tolist() == [1] * sc.buckets
    delayed = res.delay_us > 0
    first = int(np.flatnonzero(delayed.any(axis=1))[0])
    assert first <= 20 and delayed[-10:].any(axis=0).mean() > 0.5, (first, delayed.mean())
    assert policy_start_step(PaceConfig(mode="pace"), sc.ranks, res.extra["n_last"]) == 5 + 5


def test_a_run_that_cannot_fit_in_memory_is_refused_before_it_starts():
    sc = presets.quiet(4096)
    with pytest.raises(ValueError, match=r"10,000,000 steps x 32,768 ranks need 2,442.5 GiB"):
        simulate(sc, steps=10_000_000)
    # what the check counts: two float32 values a rank a step, the kept site arrays on top
    assert result_bytes(10, 4, 2, keep_sites=False) == 10 * (8 * 4 + 9 * 2 + 17)
    assert result_bytes(10, 4, 2, keep_sites=True) == 10 * (8 * 4 + 9 * 2 + 17 + 16 * 4 * 2)


def test_memory_the_os_cannot_tell_refuses_nothing(monkeypatch):
    """os.sysconf may answer -1 (indeterminate) rather than raise: every run was refused,
    "more than 80% of this machine's -0.0 GiB"."""
    import os

    sim_module = importlib.import_module("gpupace.sim.simulate")  # the module, not the function
    monkeypatch.setattr(os, "sysconf", lambda name: -1)
    monkeypatch.setattr(sim_module, "_cgroup_limit_files", lambda: [Path("/nonexistent/max")])
    assert sim_module.machine_memory() is None
    sim_module.check_memory(10_000_000, presets.quiet(4096))  # nothing known: nothing refused


def test_a_cgroup_limit_below_the_machine_is_the_memory(monkeypatch, tmp_path):
    sim_module = importlib.import_module("gpupace.sim.simulate")

    limit, unlimited = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    limit.write_text("1073741824\n")  # 1 GiB, as a container's
    unlimited.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    monkeypatch.setattr(sim_module, "_cgroup_limit_files", lambda: [unlimited, limit])
    assert sim_module.machine_memory() == 2**30
    with pytest.raises(ValueError, match="of the 1.0 GiB this process may use"):
        sim_module.check_memory(200_000, presets.quiet(64))  # 0.8 GiB of results
    limit.write_text("max\n")  # no limit: the machine's memory
    assert sim_module.machine_memory() > 2**30


def test_the_cgroup_files_read_are_those_proc_names(monkeypatch, tmp_path):
    """v2 ('0::/path') and v1 ('N:memory:/path'), each folder from the namespace's root down:
    a batch job's limit is often on a parent (Slurm's job_N above the task), which went
    unread."""
    sim_module = importlib.import_module("gpupace.sim.simulate")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job/42\n0::/user.slice/job.scope\n3:cpuset:/\n")
    real = Path

    def fake(p):
        return proc if p == "/proc/self/cgroup" else real(p)

    monkeypatch.setattr(sim_module, "Path", fake)
    assert [str(p) for p in sim_module._cgroup_limit_files()] == [
        "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/job/42/memory.limit_in_bytes",
        "/sys/fs/cgroup/user.slice/memory.max",
        "/sys/fs/cgroup/user.slice/job.scope/memory.max"]


def test_a_scaling_table_stays_within_the_footprint_the_memory_check_counts():
    """check_memory counts one result and the draws' working arrays; the table held the last
    policy's result while the next one ran (2 results + 35.6 MB at 512 ranks, by tracemalloc)."""
    import tracemalloc

    from gpupace.sim.simulate import STATE_ARRAYS, WORKING_BYTES
    from gpupace.sim.table import scaling_table

    sc, steps = presets.quiet(64), 8000
    for policy in ("none", "gpupace", "oracle"):
        simulate(sc, policy, steps=10)  # compiled (or read from the cache) before the count
    tracemalloc.start()
    try:
        scaling_table(presets.quiet, [64], steps=steps)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one = result_bytes(steps, sc.ranks, sc.buckets, keep_sites=False)
    working = WORKING_BYTES + STATE_ARRAYS * 8 * sc.ranks * sc.buckets  # as check_memory counts
    assert one > working / 2  # large enough that a second result would show
    assert peak < one + working, (peak, one)


def test_a_step_keeps_the_order_of_its_collectives_and_their_arithmetic():
    """One step of the engine on random inputs: a rank arrives at bucket b no earlier than
    bucket b-1's collective ended (a bucket that started before it went unseen but by the
    calibration's check), enters at its arrival plus its delay and the pacing kernels' time,
    the collective starts at the last entry and ends a transfer later, and each rank's wait is
    from its entry to that end."""
    rng = np.random.default_rng(3)
    n, nb = 6, 5
    start, fwd = rng.uniform(0, 500, n), rng.uniform(1000, 2000, n)
    work, xfer = rng.uniform(100, 3000, (n, nb)), rng.uniform(200, 800, nb)
    delay = rng.uniform(0, 300, (n, nb))
    ready, a, e, w, d = (np.zeros((n, nb)) for _ in range(5))
    s, x = np.zeros(nb), np.zeros(nb)
    expect, ref = np.full((n, nb), np.nan), np.full(nb, np.nan)  # first step: plans as given
    cost = 1.5  # the pacing kernels', after the delay
    engine.run_step(start, fwd, work, xfer, delay, cost, 0.05, 0.1, ready, a, e, s, x, w, d,
                    expect, ref, 0.1)
    assert (a[:, 1:] >= x[None, :-1]).all() and (a >= ready - 1e-9).all()
    np.testing.assert_allclose(d, delay)
    np.testing.assert_allclose(e, a + d + cost)
    np.testing.assert_allclose(s, e.max(axis=0))
    np.testing.assert_allclose(x, s + xfer)
    np.testing.assert_allclose(w, x[None, :] - e)
    assert (w >= 0).all()


def test_arrivals_stamped_at_the_hook_keep_the_lateness_the_stream_hides():
    """One rank 5 ms late from its input, transfers longer than a bucket's compute: on the
    stream (the device backend) the early ranks' arrivals wait for the collective before, and
    the spread after the first site is 0; at DDP's hook (the host backend), when each gradient
    is ready, the rank is 5 ms late at every site."""
    sc = costless(presets.quiet(1).replace(nvlink_gbs=20.0,
                                           input_pattern_us=(0.0,) * 7 + (5000.0,)))
    stream, hook = (simulate(sc, "none", steps=20, stamped=s) for s in ("stream", "hook"))
    np.testing.assert_allclose(hook.spread_us[1:], 5000.0)
    np.testing.assert_allclose(stream.spread_us[1:, 0], 5000.0)
    np.testing.assert_allclose(stream.spread_us[1:, 1:], 0.0, atol=1e-6)
    np.testing.assert_array_equal(stream.step_us, hook.step_us)  # the same run, seen apart
    with pytest.raises(ValueError, match="stamped must be one of"):
        simulate(sc, "none", steps=20, stamped="host")
