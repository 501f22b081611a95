"""Calibration: a scenario fitted to a recorded telemetry file, and the `paper` preset's fit.

`fit_telemetry(path)` reads a run (from `gpupace demo`, a real job or the simulator) and fits:
  compute per step   median step time less the exposed communication (median min wait);
  locality           each rank's median lateness behind the earliest rank (spread - earliness
                     at the site of largest spread), as a per-rank fixed offset;
  jitter             the robust spread (MAD) of each rank's lateness about its median, as
                     log-normal compute noise, and lateness beyond 6 robust sigmas as Pareto
                     stalls (rate and median size).
Limits, bluntly: fabric contention, regimes and the coupling are not fitted (a few ranks on
one host show none of them); the gradient size is not in the file, so buckets keep
`bucket_mb` and their number is the file's site count. Ranks past the file's world size reuse
its offsets by `rank % world_size`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..telemetry import read_telemetry
from .scenario import Scenario

SPIKE_SIGMAS = 6.0  # lateness beyond this many robust sigmas counts as a stall
PAPER_TARGET_CV = 0.22  # the study's baseline step-time CV at 64 nodes
PAPER_TARGET_THROUGHPUT = 8200.0  # the study's baseline samples/s at 64 nodes


@dataclass(slots=True)
class TelemetryFit:
    """What `fit_telemetry` measured; `scenario(nodes, gpus_per_node)` simulates it at scale."""

    source: str
    world_size: int
    sites: int
    steps: int
    compute_us: float
    exposed_comm_us: float
    offsets_us: tuple[float, ...]
    noise_sigma: float
    spike_prob: float
    spike_us: float
    notes: list[str] = field(default_factory=list)

    def scenario(self, nodes: int, gpus_per_node: int = 8) -> Scenario:
        return Scenario(
            name=f"fit:{self.source}", nodes=nodes, gpus_per_node=gpus_per_node,
            forward_us=self.compute_us / 3.0, backward_ratio=2.0, optimizer_us=0.0,
            grad_mb=25.0 * self.sites, bucket_mb=25.0,
            noise_sigma=min(self.noise_sigma, 2.0), spike_prob=self.spike_prob,
            spike_us=max(self.spike_us, 1.0),
            locality_pattern_us=self.offsets_us,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def fit_telemetry(path: str | os.PathLike) -> TelemetryFit:
    """Fits compute, locality offsets and jitter from a telemetry file (see the module doc).
    Raises ValueError when the file has too few usable steps or ranks."""
    tel = read_telemetry(path)
    recs = [r for r in tel.records if len(r.earliness_us) >= 2 and math.isfinite(r.spread_us)]
    if len(recs) < 10:
        raise ValueError(f"{path}: need at least 10 steps with 2+ ranks to fit, got {len(recs)}")
    n = len(recs[0].earliness_us)
    recs = [r for r in recs if len(r.earliness_us) == n and len(r.wait_us) == n]
    step = np.array([r.step_time_us for r in recs], dtype=np.float64)
    step = step[np.isfinite(step) & (step > 0)]
    if step.size < 5:
        raise ValueError(f"{path}: need at least 5 finite step times to fit, got {step.size}")
    wait = np.array([r.wait_us for r in recs], dtype=np.float64)  # [K, N], summed over sites
    exposed = float(np.nanmedian(np.nanmin(wait, axis=1)))
    compute = max(float(np.median(step)) - exposed, 1.0)
    spread = np.array([r.spread_us for r in recs], dtype=np.float64)
    early = np.array([r.earliness_us for r in recs], dtype=np.float64)
    late = spread[:, None] - early  # [K, N], how far behind the earliest rank
    med = np.nanmedian(late, axis=0)
    offsets = tuple(float(v) for v in np.maximum(med - med.min(), 0.0))
    resid = late - med[None, :]
    mad = float(np.nanmedian(np.abs(resid - np.nanmedian(resid))))
    sd_step = 1.4826 * mad
    sites = max(len(tel.header.get("sites") or []), len(recs[0].site_spread_us), 1)
    # a step's lateness sums 1 forward and `sites` backward buckets, each log-normal sigma
    fwd, bucket = compute / 3.0, 2.0 * compute / 3.0 / sites
    sigma = sd_step / math.sqrt(fwd ** 2 + sites * bucket ** 2)
    # a floor of 0.1% of compute, so a noise-free run does not read rounding as stalls
    big = resid > max(SPIKE_SIGMAS * sd_step, 1e-3 * compute)
    spike_prob = float(big.mean())
    # Pareto (alpha 1.5) median = scale * 2^(1/alpha)
    spike_us = float(np.median(resid[big]) / 2 ** (1 / 1.5)) if big.any() else 1000.0
    notes = [] if not tel.skipped else [f"{len(tel.skipped)} unreadable lines skipped"]
    return TelemetryFit(
        source=str(tel.header.get("label") or tel.header.get("source") or "telemetry"),
        world_size=n, sites=sites, steps=len(recs), compute_us=compute, exposed_comm_us=exposed,
        offsets_us=offsets, noise_sigma=float(sigma), spike_prob=spike_prob, spike_us=spike_us,
        notes=notes,
    )


def fit_paper(steps: int = 3000, seed: int = 0, lo: float = 0.2, hi: float = 3.0,
              iters: int = 8) -> dict[str, float]:
    """Bisects the `paper` preset's scale until the BASELINE (policy none) step-time CV at 64
    nodes is PAPER_TARGET_CV, then sets samples per rank so that its throughput is the study's
    8200 samples/s. Only the baseline is fitted. Returns the fitted figures; copy them into
    `presets.PAPER_SCALE` and `PAPER_SAMPLES`. Takes minutes."""
    from .presets import paper
    from .simulate import simulate

    def cv(scale: float) -> tuple[float, float]:
        s = simulate(paper(64, scale=scale), "none", steps=steps, seed=seed).summary(skip=0)
        return s["step_time_cv"], s["step_time_mean"]

    for _ in range(iters):  # CV rises with the scale
        mid = 0.5 * (lo + hi)
        if cv(mid)[0] < PAPER_TARGET_CV:
            lo = mid
        else:
            hi = mid
    scale = 0.5 * (lo + hi)
    got_cv, mean_us = cv(scale)
    samples = PAPER_TARGET_THROUGHPUT * mean_us / 1e6 / (64 * 8)
    return {"scale": scale, "cv": got_cv, "step_time_mean_us": mean_us,
            "samples_per_rank": samples, "steps": steps, "seed": seed}
