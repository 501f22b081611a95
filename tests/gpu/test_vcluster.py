"""On a GPU: the virtual cluster (N streams as N ranks, one shared clock) as ground truth for
the clock-free estimator, pacing in it, and the spin coupling (compute throughput next to K
spinning CTAs against one spinning warp). Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpupace import PaceConfig

# Compute every rank does before its skew, as in training (compute >> spread): the step time,
# and so the policy's cap (a fraction of it), stays well above the skews, and the GPU, not the
# host's launches (tens of us each), decides when ranks arrive and leave.
COMPUTE_US = 2000.0


def skews(n, steps, base_us, jitter_us, seed=0):
    rng = np.random.default_rng(seed)
    s = COMPUTE_US + base_us[None, :] + rng.uniform(0, jitter_us, (steps, n))
    return torch.tensor(s, dtype=torch.float32, device="cuda")


@pytest.mark.cupy
def test_estimated_spread_matches_shared_clock_truth(figures):
    from gpupace.vcluster import VirtualCluster

    n, steps = 4, 40
    vc = VirtualCluster(n, PaceConfig(mode="observe", max_sites=2), n_sites=2, ctas=1)
    sk = skews(n, steps, np.array([0.0, 40.0, 80.0, 160.0]), 20.0)
    for k in range(steps):
        vc.step(sk[k])
    r = vc.results()
    t, e, x = r.true_spread[2:], r.est_spread[2:], r.exit_spread[2:]
    err = np.abs(e - t)
    target = np.maximum(2.0, 0.05 * t)  # the issue's: within max(2 us, 5%) of the truth
    figures["vcluster_spread_error_p50_us"] = float(np.median(err))
    figures["vcluster_spread_error_max_us"] = float(err.max())
    figures["vcluster_spread_error_within_target"] = f"{int((err <= target).sum())} of {err.size}"
    # per site: the skew comes before site 0; every rank leaves site 0's barrier together,
    # so site 1's spread is launch jitter alone (a few us)
    figures["vcluster_true_spread_mean_us_by_site"] = [float(v) for v in t.mean(axis=0)]
    figures["vcluster_exit_spread_us_p50_max"] = [float(np.median(x)), float(x.max())]
    figures["vcluster_timed_out"] = r.timed_out
    assert not r.timed_out
    assert (t[:, 0] > 100).all()  # the injected skew is there
    # The estimator's own bound: it takes every rank to leave a collective at once, so it is
    # off by at most the exit spread (exit stamps launched on N streams). On the H200 of
    # 2026-11-30 site 1, all launch jitter, was estimated 3.5 us off, past 2 us. With rows
    # made of these stamps (w + d = exit - arrival) the bound is exact but for the estimate's
    # float32 rounding. Four runs exceeded it by 0.25-0.32 us, most likely because the truth
    # was computed from stamps made float64 before their differences were taken, multiples
    # of 256 ns at ~1.8e18 ns (fixed in VirtualCluster.results). If SMs disagree on the time,
    # this fails: see the SMs' clock offsets (test_device_kernels).
    full = r.n_valid[2:] == n
    figures["vcluster_steps_with_a_row_dropped"] = f"{int((~full).sum())} of {full.size}"
    figures["vcluster_bound_excess_us"] = float((err - x).max())
    assert (err <= x + 0.05).all(), (err.max(), x[np.unravel_index(err.argmax(), err.shape)])
    # Where the skew is, the error is within the max(2 us, 5%).
    assert (err[:, 0] <= target[:, 0]).all(), (err[:, 0].max(), t[err[:, 0].argmax(), 0])
    # The truth is the injected skew: the ranks' compute ends at a common start + each skew
    # (kernels.spin.skew_spin), whatever the host's launches, and site 0's arrival stamp
    # follows it on each rank's stream within a kernel's start (a few us at most).
    off = t[:, 0] - np.ptp(sk[2:steps].cpu().numpy(), axis=1)
    figures["vcluster_true_minus_injected_spread_us_p50_max"] = [float(np.median(off)),
                                                                 float(np.abs(off).max())]
    assert (np.abs(off) <= 10.0).all(), off


@pytest.mark.cupy
def test_pacing_in_the_virtual_cluster_shrinks_the_entry_spread(figures):
    from gpupace.vcluster import VirtualCluster

    n, steps = 4, 60
    cfg = PaceConfig(mode="pace", warmup_steps=2, on_steps=2, holdoff_factor=0.0,
                     threshold_us=30.0, release_us=10.0, floor_rise=0.25, guard_us=10.0,
                     max_sites=1)
    vc = VirtualCluster(n, cfg, n_sites=1, ctas=4)
    sk = skews(n, steps, np.array([0.0, 100.0, 200.0, 300.0]), 10.0, seed=1)
    for k in range(steps):
        vc.step(sk[k])
    r = vc.results()
    # before: steps 1-3, unpaced (warm-up); step 0 compiles the kernels between launches
    first, last = r.true_entry_spread[1:4].mean(), r.true_entry_spread[-10:].mean()
    figures["vcluster_entry_spread_before_after_us"] = [float(first), float(last)]
    assert not r.timed_out
    assert last < 0.5 * first, (first, last)
    assert r.delay[-1, 0, 0] > 200.0  # the earliest rank waits most


def test_spin_coupling_figure(figures):
    from gpupace.vcluster import spin_coupling

    out = spin_coupling(ctas=(1, 8, 32), size=4096, reps=20)
    figures["spin_coupling"] = out  # TFLOP/s, and 1 - with / alone: the simulator's coupling
    assert all(np.isfinite(v) and v > 0 for k, v in out.items() if k.endswith("tflops")), out
    assert all(-0.5 < v < 1.0 for k, v in out.items() if "coupling_" in k), out
    assert out["spinners_held"] and out["bmm_spinners_held"], out  # each outlasted its window
    # The premise of pacing on a GPU (README, "What if the job ran on 512 GPUs"): a paced
    # rank's one-warp spin takes less from the compute than an early NCCL kernel's 32 spinning
    # CTAs. On the batched load, which takes whatever SMs are free (a persistent matmul's
    # figure says how long a spinner holds an SM as much; it is recorded, not judged). A
    # margin of 0.05 for timing noise; a failure here is a finding against the premise.
    assert out["bmm_coupling_one_warp_spin"] <= out["bmm_coupling_32_cta_spin"] + 0.05, out
