"""Random inputs of the simulation, drawn in chunks of steps from one seeded generator.

Draws never depend on the policy, so `none`, `gpupace` and `oracle` runs with one seed see
the same noise, stalls, contention and regimes: their differences are the policy's alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import engine, fabric
from .scenario import Scenario

# Floats per chunk array: bounds memory (16 MB) whatever the rank count.
CHUNK_FLOATS = 2_000_000


@dataclass(slots=True)
class Chunk:
    fwd: np.ndarray  # [c, N] forward compute, us
    work: np.ndarray  # [c, N, B] backward compute per bucket, us
    opt: np.ndarray  # [c, N] optimizer time after the step's last exit, us
    xfer: np.ndarray  # [c, B] transfer time per bucket, us
    regime: np.ndarray  # [c] int8, 1 = communication-bound
    contention: np.ndarray  # [c] slowdown of inter-node transfer


def rank_compute_factor(sc: Scenario, rng: np.random.Generator) -> np.ndarray:
    """Fixed per-rank compute multiplier: chip speed and the locality handicap."""
    n = sc.ranks
    f = np.ones(n)
    if sc.rank_speed_sigma > 0:
        s = sc.rank_speed_sigma
        f *= np.exp(s * rng.standard_normal(n) - 0.5 * s * s)
    total = sc.forward_us * (1.0 + sc.backward_ratio)
    return f * (1.0 + locality_offsets_us(sc) / total)


def locality_offsets_us(sc: Scenario) -> np.ndarray:
    """Fixed extra compute per step of every rank, from `locality_pattern_us`."""
    return _tile(sc.locality_pattern_us, sc.ranks)


def input_offsets_us(sc: Scenario) -> np.ndarray:
    """Fixed extra forward time of every rank, from `input_pattern_us`."""
    return _tile(sc.input_pattern_us, sc.ranks)


def _tile(pattern: tuple[float, ...], n: int) -> np.ndarray:
    pat = np.asarray(pattern, dtype=np.float64)
    if pat.size == 0:
        return np.zeros(n)
    return pat[np.arange(n) % pat.size]


class Draws:
    """Yields `Chunk`s of consecutive steps; the stateful processes (contention, regime)
    carry over between chunks."""

    def __init__(self, sc: Scenario, seed: int):
        self.sc = sc
        self.rng = np.random.default_rng(seed)
        self.n, self.nb = sc.ranks, sc.buckets
        self.speed = rank_compute_factor(sc, self.rng)
        self.input = input_offsets_us(sc)
        self.intra, self.inter = fabric.base_transfer_us(sc)
        self.n_sw = fabric.n_switches(sc)
        self.z = self.rng.standard_normal(self.n_sw)  # stationary start
        self.regime = 0
        self.chunk_steps = max(1, CHUNK_FLOATS // (self.n * (self.nb + 1)))

    def next(self, c: int) -> Chunk:
        sc, rng, n, nb = self.sc, self.rng, self.n, self.nb
        fwd = np.broadcast_to(sc.forward_us * self.speed, (c, n)).copy()
        per_bucket = sc.forward_us * sc.backward_ratio / nb
        work = np.broadcast_to((per_bucket * self.speed)[:, None], (c, n, nb)).copy()
        if sc.noise_sigma > 0:
            # float32 normals: 3x faster than float64 and ample for a few % of noise
            s = np.float32(sc.noise_sigma)
            h = np.float32(0.5) * s * s
            fwd *= np.exp(s * rng.standard_normal((c, n), dtype=np.float32) - h)
            work *= np.exp(s * rng.standard_normal((c, n, nb), dtype=np.float32) - h)
        if sc.spike_prob > 0:
            hit = rng.random((c, n)) < sc.spike_prob
            k = int(hit.sum())
            size = sc.spike_us * np.minimum(rng.random(k) ** (-1.0 / sc.spike_alpha),
                                            sc.spike_clip)
            where = rng.integers(0, nb + 1, size=k)  # 0: the forward, b + 1: bucket b
            ts, rs = np.nonzero(hit)
            on_fwd = where == 0
            np.add.at(fwd, (ts[on_fwd], rs[on_fwd]), size[on_fwd])
            np.add.at(work, (ts[~on_fwd], rs[~on_fwd], where[~on_fwd] - 1), size[~on_fwd])
        fwd += self.input[None, :]
        opt = np.full((c, n), sc.optimizer_us)
        if self.n_sw and sc.contention_mean > 0 and sc.contention_sigma > 0:
            z = engine.ar1(self.z, rng.standard_normal((c, self.n_sw)), sc.contention_rho)
            self.z = z[-1].copy()
        else:
            z = np.zeros((c, self.n_sw))
        cont = fabric.contention_factor(sc, z)
        if sc.regime_on_prob > 0:
            regime = engine.markov2(self.regime, rng.random(c), sc.regime_on_prob,
                                    sc.regime_off_prob)
            self.regime = int(regime[-1])
        else:
            regime = np.zeros(c, dtype=np.int8)
        factor = np.where(regime == 1, sc.regime_comm_factor, 1.0)
        xfer = factor[:, None] * (self.intra[None, :] + cont[:, None] * self.inter[None, :])
        return Chunk(fwd=fwd, work=work, opt=opt, xfer=xfer, regime=regime, contention=cont)
