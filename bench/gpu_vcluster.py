"""GPU benchmark of the virtual cluster (`gpupace.vcluster.VirtualCluster`: N streams in one
process as N ranks, a device-side barrier for the collective, all stamps on one clock): what
pacing costs there, and what it does to the spread.

Two clusters run the same injected skew, step by step interleaved: one in `observe` mode (the
pacing kernels run, delays stay zero) and one in `pace` mode. Rank i computes for
`BASE_US + i * OFFSET_US` plus a little noise, so the arrival spread sits above the pacing
threshold and the policy engages after its warm-up. BASE_US outlasts the host's launches of a
whole step (4 kernels a rank, tens of us each): with less, the ranks would arrive and leave when
the host launched their kernels, not when their compute ended, and the estimator's w (exit -
entry) would measure launch order. Per step: the wall time (host launch included,
`synchronize` after each step: the virtual cluster is eager only), paced minus observed pair by
pair; and from the shared clock, the true arrival spread, the entry spread
after pacing and the estimator's error, over the second half of the steps.
"""

from __future__ import annotations

import numpy as np

from . import gpu_common as gc
from .harness import Harness, interleave

N_RANKS = 8
BASE_US, OFFSET_US, NOISE_US = 2000.0, 60.0, 20.0


def bench_vcluster(h: Harness) -> None:
    why = gc.missing("cuda", "triton", "cupy", "gpupace.vcluster:VirtualCluster")
    if why:
        h.skip("vcluster", why)
        return
    import torch

    from gpupace import PaceConfig
    from gpupace.vcluster import VirtualCluster

    steps = 60 if h.quick else 300
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = min(N_RANKS, (sms - 1) // 2)  # VirtualCluster needs n * (ctas + 1) < SMs
    rng = np.random.default_rng(0)
    skew = BASE_US + OFFSET_US * np.arange(n) + rng.uniform(0, NOISE_US, size=(steps + 8, n))
    skew_dev = torch.tensor(skew, dtype=torch.float32, device="cuda")
    clusters = {
        mode: VirtualCluster(n, PaceConfig(mode=mode), n_sites=1, ctas=1, max_steps=steps + 8)
        for mode in ("observe", "pace")
    }
    k = {mode: 0 for mode in clusters}

    def stepper(mode: str):
        def run() -> None:
            clusters[mode].step(skew_dev[k[mode]])
            k[mode] += 1

        return run

    wall = interleave(
        {m: stepper(m) for m in clusters}, warmup=4, repeats=steps, sync=torch.cuda.synchronize
    )
    case = {
        "ranks": n,
        "sites": 1,
        "ctas": 1,
        "skew": f"{BASE_US:g}+{OFFSET_US:g}*rank+U(0,{NOISE_US:g}) us",
    }
    for mode, x in wall.items():
        h.record("vcluster", {**case, "mode": mode, "what": "step wall time"}, x)
    h.record(
        "vcluster",
        {**case, "what": "pace - observe, step wall time"},
        wall["pace"] - wall["observe"],
        metric="overhead",
    )
    half = slice(4 + steps // 2, None)  # past warm-up and the policy's ramp
    ran = clusters["observe"].steps  # step j of either cluster ran skew row j
    # What the true arrival spread should come to, the compute stand-ins ending at a common
    # start + their skews (before 2026-12-01 they started as the host launched them: 724 us
    # p50 true spread against these 400-440 us at 8 ranks on the H200)
    h.record("vcluster", {**case, "steps": f"last {steps - steps // 2}",
                          "what": "injected skew spread"}, np.ptp(skew[:ran], axis=1)[half])
    facts = {}
    for mode, vc in clusters.items():
        r = vc.results()
        c = {**case, "mode": mode, "steps": f"last {steps - steps // 2}"}
        h.record("vcluster", {**c, "what": "true arrival spread"}, r.true_spread[half].ravel())
        h.record(
            "vcluster",
            {**c, "what": "true entry spread (after pacing)"},
            r.true_entry_spread[half].ravel(),
        )
        h.record(
            "vcluster",
            {**c, "what": "estimated - true spread"},
            (r.est_spread - r.true_spread)[half].ravel(),
        )
        h.record(
            "vcluster",
            {**c, "what": "delay applied, mean over ranks"},
            r.delay[half].mean(axis=1).ravel(),
        )
        facts[mode] = {"timed_out": r.timed_out}
        if r.timed_out:
            h.progress(f"vcluster {mode}: a barrier timed out; its figures are suspect")
    h.extras["vcluster"] = facts
