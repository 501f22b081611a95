"""`simulate`: runs one scenario under one policy and returns per-step, per-rank results.

Policies:
  none     no delay.
  gpupace  the real control law, `gpupace.policy.update`, fed each step with the clock-free
           inputs a real pacer measures: every rank's wait w and applied delay d per site and
           its step time; its next delays are applied at the next step.
  oracle   perfect foresight, `gpupace.policy.oracle_delays` on the true natural arrivals of
           each bucket (no guard, no cap; inlined in `engine.oracle_step` for speed, tested
           equal): the upper bound pacing is judged against. It delays nobody where the
           scenario's pacing spin costs compute at least what a waiting collective does
           (paced_coupling >= coupling): there a delay cannot gain.
Both paced policies pay pacing's own cost, delay or none: `Scenario.pacing_site_us` at every
collective, before its entry, and `pacing_step_us` a step, before the next step's forward
(its exchange, reduction and update run on the compute stream after the optimizer).
The simulated collectives end at the same instant on every rank, so the clock-free earliness
the policy estimates equals the true one here; a real fabric adds a few us of exit skew.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import policy as pol
from ..config import PaceConfig
from . import engine
from .draws import CHUNK_FLOATS, Draws, input_offsets_us, locality_offsets_us
from .scenario import Scenario

POLICIES = ("none", "gpupace", "oracle")
STAMPED = ("stream", "hook")  # where arrivals are stamped: see `simulate`
MAX_STEPS = 10_000_000
# Keep per-site arrays [steps, ranks, sites] (two float64 arrays) only up to this many entries:
# 64 MB each.
KEEP_SITES_LIMIT = 8_000_000
# A run is refused up front when it would take more than this share of the machine's memory
# (10,000,000 steps of 4096 ranks asked for 1.2 TiB, and failed only then): its per-step
# results, the random draws' chunk arrays and the [ranks, buckets] state beside them
# (tracemalloc's peak less the results: 35.6 MB at 512 ranks x 10 buckets, 507-541 MB at
# 65,536 x 64, which the 16 arrays of a rank and bucket here cover).
MEMORY_SHARE = 0.8
WORKING_BYTES = 4 * CHUNK_FLOATS * 8
STATE_ARRAYS = 16


@dataclass(slots=True)
class SimResult:
    """One simulated run. Times in us; step 0 has no step time (NaN), as in real telemetry."""

    scenario: Scenario
    policy: str
    config: PaceConfig
    seed: int
    step_us: np.ndarray  # [steps] exit-to-exit interval of site 0 (the same on every rank)
    spread_us: np.ndarray  # [steps, sites] true arrival spread, max a - min a
    active: np.ndarray  # [steps, sites] bool: pacing engaged (gpupace) / delays given (oracle)
    earliness_us: np.ndarray  # [steps, ranks] float32, at the site of largest spread
    delay_us: np.ndarray  # [steps, ranks] float32, applied, summed over sites
    regime: np.ndarray  # [steps] int8, 1 = communication-bound regime
    contention: np.ndarray  # [steps] inter-node transfer slowdown from switch load
    slow_ranks: list[int]  # ranks with a fixed handicap (locality, input), slowest first
    site_wait_us: np.ndarray | None = None  # [steps, ranks, sites] when kept
    site_delay_us: np.ndarray | None = None  # [steps, ranks, sites] when kept
    elapsed_s: float = 0.0  # wall time of the run, compile excluded
    policy_s: float = 0.0  # of which in gpupace.policy.update (the oracle runs inside the engine)
    stamped: str = "stream"  # where its arrivals are measured (`simulate`)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.step_us.size)

    @property
    def ranks(self) -> int:
        return self.scenario.ranks

    def summary(self, skip: int | None = None) -> dict[str, Any]:
        """Steady-state figures over steps `skip..` (default: the second half). Throughput in
        samples/s. The policy delays a rank only after its warm-up and the holdoff (5 steps
        for each rank that has been last at the site, up to 5 per rank: `policy_start_step`);
        a run of at most that many steps shows none of its delays, and one of fewer than twice
        that many shows them in part of its second half only."""
        skip = self.steps // 2 if skip is None else skip
        st = self.step_us[skip:]
        st = st[np.isfinite(st)]
        if st.size < 2:
            raise ValueError(f"need at least 2 measured steps after skip={skip}, got {st.size}")
        mean = float(st.mean())
        return {
            "throughput": self.scenario.samples_per_rank * self.ranks * 1e6 / mean,
            "step_time_mean": mean,
            "step_time_cv": float(st.std() / mean),
            "step_time_p99": float(np.percentile(st, 99)),
            "spread_mean": float(np.nanmean(self.spread_us[skip:].max(axis=1))),
            "active_fraction": float(self.active[skip:].any(axis=1).mean()),
            "delay_mean": float(self.delay_us[skip:].mean()),
        }


def result_bytes(steps: int, ranks: int, buckets: int, keep_sites: bool) -> int:
    """What one run's per-step results take: per rank, earliness and delay (float32); per
    bucket, spread (float64) and activity; the step time, contention and regime; with
    `keep_sites`, per rank and bucket a wait and a delay (float64)."""
    per_step = 8 * ranks + 9 * buckets + 17 + (16 * ranks * buckets if keep_sites else 0)
    return steps * per_step


def machine_memory() -> int | None:
    """The memory this process may use, in bytes: the machine's, or the lowest limit of its
    cgroup (a container's, a batch job's; v1 or v2) when lower; None where nothing says."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        total = pages * size if pages > 0 and size > 0 else None  # -1: indeterminate
    except (AttributeError, OSError, ValueError):
        total = None
    known = [m for m in (total, *map(_limit, _cgroup_limit_files())) if m is not None]
    return min(known) if known else None


def _cgroup_limit_files() -> list[Path]:
    """Where a memory limit on this process may be: its cgroup and every cgroup above it, as
    /proc/self/cgroup names it (v2: '0::/path', memory.max; v1: 'N:memory:/path',
    memory.limit_in_bytes), from the namespace's root (a container's) down; a batch job's limit
    is often on a parent (Slurm's job_N above the step's task)."""
    root = Path("/sys/fs/cgroup")
    chains = [(root, "memory.max"), (root / "memory", "memory.limit_in_bytes")]  # the roots
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        chains += [(base.joinpath(*parts[:k]), name) for k in range(1, len(parts) + 1)]
    return list(dict.fromkeys(folder / name for folder, name in chains))


def _limit(path: Path) -> int | None:
    """A cgroup memory limit file's bytes; None when absent or unlimited ('max')."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def keeps_sites(steps: int, scenario: Scenario) -> bool:
    """Whether a run keeps its per-site arrays by default: up to KEEP_SITES_LIMIT entries."""
    return steps * scenario.ranks * scenario.buckets <= KEEP_SITES_LIMIT


def check_memory(steps: int, scenario: Scenario, keep_sites: bool | None = None,
                 kept: int = 0) -> None:
    """ValueError, before anything runs, when a run would not fit in memory beside `kept`
    results held already (`keep_sites` None: as `simulate` decides by default)."""
    keep = keeps_sites(steps, scenario) if keep_sites is None else keep_sites
    one = result_bytes(steps, scenario.ranks, scenario.buckets, keep)
    working = WORKING_BYTES + STATE_ARRAYS * 8 * scenario.ranks * scenario.buckets
    need, have = (1 + kept) * one + working, machine_memory()
    if have is not None and need > MEMORY_SHARE * have:
        raise ValueError(
            f"{steps:,} steps x {scenario.ranks:,} ranks need {need / 2**30:,.1f} GiB (the "
            f"per-step results and the arrays beside them), more than {MEMORY_SHARE:.0%} of "
            f"the {have / 2**30:,.1f} GiB this process may use; use fewer steps or ranks")


def policy_start_step(config: PaceConfig, n_ranks: int, n_last: np.ndarray | None = None) -> int:
    """The first step at which the gpupace policy can delay a rank of `n_ranks`: past its
    warm-up, once pacing has switched on (on-steps) and the rank has been on time for the
    holdoff, which run side by side: the holdoff of the ranks never last, with `n_last` ranks
    counted last at each site (a gpupace run's `extra["n_last"]`, at its end; the longest of
    the sites), else the longest it can grow to (`gpupace.policy.holdoff`)."""
    p = pol.PolicyParams.from_config(config, n_ranks)
    hold = p.holdoff_steps if n_last is None else int(pol.holdoff(p, n_last).max())
    return int(p.warmup_steps + max(p.on_steps, hold))


def simulate(
    scenario: Scenario,
    policy: str = "none",
    config: PaceConfig | None = None,
    steps: int = 2000,
    seed: int = 0,
    *,
    keep_sites: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    stamped: str = "stream",
) -> SimResult:
    """Simulates `steps` steps of `scenario` under `policy` ("none", "gpupace" or "oracle").
    `config` is the PaceConfig of the gpupace policy (default: PaceConfig(mode="pace")).
    `keep_sites`: keep [steps, ranks, sites] wait and delay arrays (needed to write telemetry);
    default: when they hold at most 8 M entries. `progress(done, total)` is called now and
    then. `stamped`: where the result measures arrivals (its spread, earliness and per-site
    waits), as a pacer stamps them: "stream" (the device backend, on the collective's stream:
    after the collective before it) or "hook" (the host backend, when DDP's hook fires: as
    soon as the gradient is ready). The run, and the gpupace policy's inputs, stay the
    stream's.
    Raises ValueError naming any bad argument."""
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a gpupace.sim.Scenario, got {type(scenario).__name__}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 2 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer in [2, {MAX_STEPS}], got {steps!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if stamped not in STAMPED:
        raise ValueError(f"stamped must be one of {STAMPED}, got {stamped!r}")
    cfg = config if config is not None else PaceConfig(mode="pace")
    if not isinstance(cfg, PaceConfig):
        raise ValueError(f"config must be a PaceConfig, got {type(cfg).__name__}")
    engine.warmup()  # compile outside the timed loop

    sc = scenario
    n, nb = sc.ranks, sc.buckets
    if keep_sites is None:
        keep_sites = keeps_sites(steps, sc)
    check_memory(steps, sc, keep_sites)
    draws = Draws(sc, seed)
    params = pol.PolicyParams.from_config(cfg, n)
    state = pol.init_state(n, nb)
    kp, kc = float(sc.paced_coupling), float(sc.coupling)
    paced = policy != "none"
    site_cost = float(sc.pacing_site_us) if paced else 0.0
    step_cost = float(sc.pacing_step_us) if paced else 0.0

    ready, a, e, w, d = (np.zeros((n, nb)) for _ in range(5))
    s, x = np.zeros(nb), np.zeros(nb)
    zeros = np.zeros((n, nb))
    early, delay_sum = np.zeros(n), np.zeros(n)
    expect = np.full((n, nb), np.nan)  # the deadline's usual arrivals (see engine.run_step)
    last_exit = np.full(nb, np.nan)
    out_step = np.full(steps, np.nan)
    out_spread = np.zeros((steps, nb))
    out_active = np.zeros((steps, nb), dtype=bool)
    out_early = np.zeros((steps, n), dtype=np.float32)
    out_delay = np.zeros((steps, n), dtype=np.float32)
    out_regime = np.zeros(steps, dtype=np.int8)
    out_cont = np.ones(steps)
    site_w = np.zeros((steps, n, nb)) if keep_sites else None
    site_d = np.zeros((steps, n, nb)) if keep_sites else None

    origin, prev_x0 = 0.0, math.nan
    t_policy = 0.0
    t0 = last_report = time.perf_counter()
    k = 0
    while k < steps:
        c = min(draws.chunk_steps, steps - k)
        ch = draws.next(c)
        start = ch.opt + step_cost  # the next step's forward waits for the pacing step's work
        out_regime[k:k + c] = ch.regime
        out_cont[k:k + c] = ch.contention
        for j in range(c):
            if policy == "oracle":
                engine.oracle_step(start[j], ch.fwd[j], ch.work[j], ch.xfer[j], site_cost, kp,
                                   kc, ready, a, e, s, x, w, d)
                out_active[k] = d.max(axis=0) > 0
            else:
                delay = state.delay if policy == "gpupace" else zeros
                engine.run_step(start[j], ch.fwd[j], ch.work[j], ch.xfer[j], delay, site_cost,
                                kp, kc, ready, a, e, s, x, w, d, expect, origin - last_exit,
                                pol.ARRIVAL_RATE)
                last_exit[:] = origin + x
            x0 = origin + x[0]
            step_us = x0 - prev_x0
            out_step[k] = step_us
            prev_x0 = x0
            origin += x[nb - 1]
            engine.step_stats(a if stamped == "stream" else ready, d, out_spread[k], early,
                              delay_sum)
            out_early[k] = early
            out_delay[k] = delay_sum
            if keep_sites:
                site_w[k] = w if stamped == "stream" else w + (a - ready)  # from the hook
                site_d[k] = d
            if policy == "gpupace":
                tq = time.perf_counter()
                stats = pol.update_in_place(params, state, w, d, np.full(n, step_us))
                t_policy += time.perf_counter() - tq
                out_active[k] = stats.active
            k += 1
        now = time.perf_counter()
        if progress is not None and (now - last_report > 0.5 or k == steps):
            progress(k, steps)
            last_report = now

    offsets = locality_offsets_us(sc) + input_offsets_us(sc)
    slow = [int(r) for r in np.argsort(-offsets, kind="stable") if offsets[r] > 0]
    return SimResult(
        scenario=sc, policy=policy, config=cfg, seed=seed, step_us=out_step,
        spread_us=out_spread, active=out_active, earliness_us=out_early, delay_us=out_delay,
        regime=out_regime, contention=out_cont, slow_ranks=slow, site_wait_us=site_w,
        site_delay_us=site_d, elapsed_s=time.perf_counter() - t0, policy_s=t_policy,
        stamped=stamped,
        extra={"n_last": state.n_last.copy()} if policy == "gpupace" else {},
    )
