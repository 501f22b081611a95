"""The clock-free estimator, the control law and the oracle: the one NumPy reference.

Every rank runs `update` on the same gathered matrix and so reaches the same decision; the
device kernels (`gpupace.kernels.update`) and the simulator (`gpupace.sim`) must agree with it.

Inputs per step, rank i, site s, on rank i's own clock only (microseconds):
  wait[i, s]   w = exit - entry, time spent inside the collective
  delay[i, s]  d = the delay the rank really applied before entering
  step_us[i]   exit-to-exit interval of the rank's first site (NaN while unknown)
All ranks leave a collective within microseconds of each other, so `w + d` measures how long
before the common exit the rank arrived: earliness E_i = (w_i + d_i) - min_j (w_j + d_j).
Raw timestamps are never compared across ranks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from .config import PaceConfig
from .policy_fast import ABSURD_US, OUTLIER_Z, WHOLE, compile_fused, fused_update

MODE_OFF, MODE_OBSERVE, MODE_PACE = 0, 1, 2
FUSED_MIN_ELEMENTS = 256
# Rate of each rank's running mean arrival per site, the deadline `deadline_delay` measures
# lateness against: ~20 steps of memory, quick to follow a drift, slow to follow one spike.
ARRIVAL_RATE = 0.05


class PolicyParams(NamedTuple):
    """The scalars of `PaceConfig` that the control law reads; also the device kernel's arguments."""

    mode: int
    threshold_us: float
    release_us: float
    on_steps: int
    off_steps: int
    gain: float
    guard_us: float
    max_delay_us: float
    cap_fraction: float
    floor_rise: float
    floor_fall: float
    holdoff_steps: int
    safety_z: float
    warmup_steps: int
    holdoff_factor: float  # the holdoff per rank that has been last at the site (`holdoff`)

    @classmethod
    def from_config(cls, cfg: PaceConfig, n_ranks: int) -> PolicyParams:
        return cls(
            mode={"off": MODE_OFF, "observe": MODE_OBSERVE, "pace": MODE_PACE}[cfg.mode],
            threshold_us=float(cfg.threshold_us),
            release_us=float(cfg.release_us),
            on_steps=int(cfg.on_steps),
            off_steps=int(cfg.off_steps),
            gain=float(cfg.gain),
            guard_us=float(cfg.guard_us),
            max_delay_us=float(cfg.max_delay_us),
            cap_fraction=float(cfg.cap_fraction),
            floor_rise=float(cfg.floor_rise),
            floor_fall=float(cfg.floor_fall),
            holdoff_steps=min(int(cfg.holdoff_max),
                              int(whole_steps(cfg.holdoff_factor * n_ranks))),
            safety_z=safety_z(cfg.overshoot_risk, n_ranks),
            warmup_steps=int(cfg.warmup_steps),
            holdoff_factor=float(cfg.holdoff_factor),
        )


@dataclass(slots=True)
class PolicyState:
    """Everything the control law carries from one step to the next."""

    floor: np.ndarray  # [N, S] conservative earliness floor per rank and site (us)
    calm: np.ndarray  # [N, S] steps since the rank was last late at the site
    mean: np.ndarray  # [N, S] running mean of earliness (us)
    var: np.ndarray  # [N, S] running variance of earliness (us^2); -1: no sample yet
    delay: np.ndarray  # [N, S] delays to apply at the next step (us)
    active: np.ndarray  # [S] bool, pacing engaged at the site
    above: np.ndarray  # [S] consecutive steps with spread above threshold
    below: np.ndarray  # [S] consecutive steps with spread below release
    last_seen: np.ndarray  # [N, S] bool, the rank has been the site's straggler (`holdoff`)
    n_last: np.ndarray  # [S] ranks that have been the site's straggler (since start or load)
    step: int  # updates done
    # The fused kernel's arguments and output buffers for this state (see `_Plan`).
    plan: _Plan | None = field(default=None, repr=False, compare=False)
    # `update_leading`'s last view of the first sites, with the arrays it views, kept so that
    # its plan is made once (made each step, a step of one site fewer cost 13 us more).
    leading: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.floor.shape

    def copy(self) -> PolicyState:
        """A deep copy that keeps each array's memory order (without the output buffers)."""
        values = (getattr(self, f.name) for f in fields(self)
                  if f.name not in ("plan", "leading"))
        return PolicyState(*(v.copy(order="K") if isinstance(v, np.ndarray) else v for v in values))


@dataclass(slots=True)
class StepStats:
    """What one update measured and decided. Per-site arrays are [S]; per-rank ones [N, S]."""

    spread: np.ndarray  # [S] arrival spread max E (NaN with fewer than 2 valid ranks)
    residual: np.ndarray  # [S] entry spread after pacing, max w - min w
    straggler: np.ndarray  # [S] int, last natural arrival, argmin (w + d); -1 if unknown
    transfer: np.ndarray  # [S] transfer estimate, min w
    valid: np.ndarray  # [N] bool, rank's row was usable
    cap_us: float  # bound on one delay at this step
    delay: np.ndarray  # [N, S] next delays (same array as the new state's)
    active: np.ndarray  # [S] bool
    lowest: np.ndarray  # [S] min (w + d) over the valid ranks, the last arrival's; NaN if none
    wait: np.ndarray  # [N, S] the measurements the update read (the caller's arrays or views)
    applied: np.ndarray  # [N, S] the delays they were taken with (`delay` of `update`)

    def earliness(self, site: int | None = None) -> np.ndarray:
        """E_i = w_i + d_i - lowest, [N, S] or, for one site, [N]; NaN for invalid ranks.
        Computed here, on demand, from the update's inputs (read them before they change):
        the update itself needs only the ranks it updates, and a telemetry record one site."""
        cols = slice(None) if site is None else site
        with np.errstate(invalid="ignore"):
            e = self.wait[:, cols] + self.applied[:, cols]
            e -= self.lowest[cols]
        if not self.valid.all():
            e[~self.valid] = np.nan
        return e


def safety_z(overshoot_risk: float, n_ranks: int) -> float:
    """Standard deviations kept between a rank's mean earliness and its delay, so that the N
    ranks together overshoot the last arrival with probability about `overshoot_risk` if
    earliness is Gaussian: the (1 - risk/N) quantile of the normal law. 1.96 at 4 ranks,
    3.0 at 64, 4.1 at 4096 for a risk of 0.1."""
    return NormalDist().inv_cdf(1.0 - min(0.5, overshoot_risk / max(n_ranks, 1)))


def holdoff(params: PolicyParams, n_last: np.ndarray) -> np.ndarray:
    """Calm steps a rank that has never been the site's straggler needs before its floor may
    rise, int [S]: `holdoff_factor` steps for each rank that has been (one at least), at most
    `holdoff_steps` (factor x N, within holdoff_max); a rank that has been the straggler needs
    `holdoff_steps` (`update_reference`). The holdoff keeps a rank that is only sometimes early
    from being delayed into the straggler: if the last arrival is random over k ranks, each is
    last about once in k steps, and 5k calm steps leave ~e^-5 of them past it at any step, as
    5N did when k was taken to be N. With one persistent straggler, or k slow GPUs taking
    turns, the others are paced after 5 or 5k steps (bench/sim_holdoff.py: 2 slow GPUs a node
    with 1% compute noise, 128 at 512 ranks, first delay at step 645), where 5N meant 2,560
    at 512 ranks and 20,480 at 4096; a rank that is last now and then beside a persistent
    straggler (2% of steps) has been last, so it keeps 5N: with 5k for it too, it was delayed
    on 79% of the steps (a review's closed-loop run, 64 ranks).
    Flags never clear: one rank late once, by a hiccup, counts for the rest of the job. With
    random stragglers over all N ranks, k after t steps is about N (1 - e^(-t/N)) and 5k stays
    above t, so above every calm counter, until t is 4.97N: the ranks never last pass about when
    they did with 5N (bench/sim_holdoff.py, `jitter` at 512 ranks: the first delay at step 2557,
    against 2565 with 5N; throughput -0.0016% against no pacing with either, at noise level: the
    5N figures from one-off runs of the code of 60917ff, 2026-12-01). Clearing flags after W =
    `holdoff_steps` steps or more would change little (reasoning, not measured): a holdoff is at
    most W, and it matters only in the steps after the rank's calm counter was reset, by
    arriving within guard_us of the last arrival; forgetting ranks last W or more steps ago
    would shorten the wait of a rank reset since, near the last without being it, in a job where
    many ranks were last long ago and few lately. One persistent straggler later than guard_us
    resets no other rank's calm, and random stalls keep about N ranks counted in any window of
    5N steps. In float64, which the device kernel's table is made of
    (`kernels.update.holdoff_table`; float32 put 0.3 x 50 past 15), rounded up (`whole_steps`)."""
    hold = np.minimum(float(params.holdoff_steps),
                      params.holdoff_factor * np.maximum(n_last, 1).astype(np.float64))
    return whole_steps(hold)


def whole_steps(x) -> np.ndarray:
    """`x` steps rounded up to whole ones, int64, less float64's representation error: 1.1 x
    100 is 110.00000000000001, which a plain ceil took to 111 (`policy_fast.WHOLE`)."""
    return np.ceil(np.asarray(x, dtype=np.float64) * WHOLE).astype(np.int64)


def init_state(n_ranks: int, n_sites: int) -> PolicyState:
    if n_ranks < 1 or n_sites < 1:
        raise ValueError(f"need at least one rank and one site, got {n_ranks} ranks, {n_sites} sites")
    # Fortran order: the fused kernel reads these as site-major [S, N] without a copy.
    shape = (n_ranks, n_sites)
    return PolicyState(
        floor=np.zeros(shape, order="F"),
        calm=np.zeros(shape, dtype=np.int64, order="F"),
        mean=np.zeros(shape, order="F"),
        var=np.full(shape, -1.0, order="F"),
        delay=np.zeros(shape, order="F"),
        active=np.zeros(n_sites, dtype=bool),
        above=np.zeros(n_sites, dtype=np.int64),
        below=np.zeros(n_sites, dtype=np.int64),
        last_seen=np.zeros(shape, dtype=bool, order="F"),
        n_last=np.zeros(n_sites, dtype=np.int64),
        step=0,
    )


LEARNT = ("floor", "calm", "mean", "var", "delay", "active", "above", "below", "last_seen",
          "n_last")
_VIEWED = tuple(name for name in LEARNT if name != "delay")  # an update replaces `delay`


def to_fused_layout(state: PolicyState) -> None:
    """Gives `state` the fused kernel's layout in place: Fortran-ordered [N, S] arrays (read
    as [S, N] without a copy), int64 counters and a bool `last_seen`. Arrays already so are
    kept as they are."""
    for name in ("floor", "calm", "mean", "var", "last_seen"):
        setattr(state, name, np.asfortranarray(getattr(state, name)))
    state.calm = state.calm.astype(np.int64, copy=False)
    state.last_seen = state.last_seen.astype(bool, copy=False)
    state.n_last = state.n_last.astype(np.int64, copy=False)


def resize_state(state: PolicyState, n_sites: int) -> PolicyState:
    """`state` for another number of sites: the first sites keep what they learnt (and the
    step count, so that no warm-up restarts), sites past the old ones start afresh. A step with
    one more paced collective (a logged loss every 20 steps) used to restart the policy twice,
    warm-up and holdoff, and left pacing off most of the time."""
    n_ranks, old = state.shape
    new = init_state(n_ranks, n_sites)
    keep = min(old, n_sites)
    for name in _VIEWED:
        getattr(new, name)[..., :keep] = getattr(state, name)[..., :keep]
    new.step = state.step
    return new


def update_leading(params: PolicyParams, state: PolicyState, wait: np.ndarray,
                   delay: np.ndarray, step_us: np.ndarray, *,
                   rank: int | None = None) -> StepStats:
    """`update_in_place` for a step of n sites (the columns of `wait`), at most the state's: its
    first n sites learn, the others keep what they learnt until they come back. A DDP model's
    first step has one bucket: a state loaded from a checkpoint, or learnt, kept its first
    site's alone. (Grow a state for more sites with `resize_state`.) As `update_in_place`'s,
    the returned arrays are buffers the next such update overwrites."""
    n = np.shape(wait)[1] if np.ndim(wait) == 2 else state.shape[1]
    if n >= state.shape[1]:
        return update_in_place(params, state, wait, delay, step_us, rank=rank)
    if np.may_share_memory(delay, state.delay):  # the last delays given back as applied ones
        delay = np.array(delay)  # the copy-back below would change them under the stats
    arrays = tuple(getattr(state, name) for name in _VIEWED)
    kept = state.leading
    if kept is not None and kept[0] == n and all(a is b for a, b in zip(kept[1], arrays,
                                                                         strict=True)):
        lead = kept[2]
        lead.step = state.step
    else:
        # The fused kernel's layout first, so that the views are what it updates in place: it
        # converts an array of another layout to a copy.
        to_fused_layout(state)
        lead = leading_sites(state, n)
        state.leading = (n, tuple(getattr(state, name) for name in _VIEWED), lead)
    stats = update_in_place(params, lead, wait, delay, step_us, rank=rank)
    if state.plan is not None and state.plan.rank != rank:
        state.plan = None  # its delay buffer holds one rank's rows alone; the copy below may not
    if np.may_share_memory(lead.floor, state.floor):  # the fused path: the views in place
        state.delay[:, :n] = lead.delay  # its output buffer
    else:  # the reference path: new arrays, and the view is one no more
        for name in LEARNT:
            getattr(state, name)[..., :n] = getattr(lead, name)
        state.leading = None
    state.step = lead.step
    return stats


def leading_sites(state: PolicyState, n_sites: int) -> PolicyState:
    """The first `n_sites` sites of `state`, as views of its arrays, with its step count."""
    return PolicyState(*(getattr(state, name)[..., :n_sites] for name in LEARNT),
                       step=state.step)


def update(
    params: PolicyParams,
    state: PolicyState,
    wait: np.ndarray,
    delay: np.ndarray,
    step_us: np.ndarray,
    *,
    fused: bool | None = None,
    rank: int | None = None,
) -> tuple[PolicyState, StepStats]:
    """One step of estimator and control law. Pure: `state` is not modified. Never raises on
    bad measurements: a rank with a non-finite, negative or absurd value gets its state reset
    and zero delay. Raises ValueError only for shapes that do not match the state.
    `fused` (default: from 256 ranks x sites on, or at any size once `prepare_fused` has
    run) runs the Numba kernel of `policy_fast`; otherwise the NumPy `update_reference`, the
    same arithmetic, which spares a small job that never asked for the kernel Numba's compile
    (~8 s on a first run on a machine). `rank`: update the state and next delays of
    that rank alone, all a pacer needs of them (the per-site statistics are computed in full
    either way); the other ranks' state rows keep their old
    values and their delays are 0. The returned `StepStats.earliness()` reads `wait` and
    `delay` when it is called: call it before changing them."""
    if not (_fused_by_default(state) if fused is None else fused):
        return update_reference(params, state, wait, delay, step_us, rank=rank)
    new_state = state.copy()
    return new_state, _update_fused(params, new_state, wait, delay, step_us, rank)


def update_in_place(
    params: PolicyParams,
    state: PolicyState,
    wait: np.ndarray,
    delay: np.ndarray,
    step_us: np.ndarray,
    *,
    rank: int | None = None,
) -> StepStats:
    """`update` that overwrites `state` instead of copying it: what the host backend (with its
    `rank`) and the simulator (every rank) call every step, so that large jobs pay no copies.
    The returned arrays are buffers kept on `state` (`PolicyState.plan`): the next
    `update_in_place` on it overwrites them. Copy what must outlive the step."""
    if _fused_by_default(state):
        return _update_fused(params, state, wait, delay, step_us, rank)
    new_state, stats = update_reference(params, state, wait, delay, step_us, rank=rank)
    for f in fields(PolicyState):
        setattr(state, f.name, getattr(new_state, f.name))
    return stats


_fused_ready = False  # set by `prepare_fused`


def prepare_fused() -> float:
    """Makes the fused kernel ready in this process: compiles it (7.9 s on the 2-core VM, the
    first time on a machine; Numba caches it on disk) or loads it from that cache (~0.5 s).
    From then on every update takes it, whatever the size: at 8 ranks x 4 sites an update
    falls from ~0.4 ms (NumPy) to ~0.03-0.05 ms. The host backend calls it when it starts, so
    that no compile lands inside the step loop. Returns the seconds it took (0 once ready)."""
    global _fused_ready
    if _fused_ready:
        return 0.0
    t0 = time.perf_counter()
    compile_fused()
    _fused_ready = True
    return time.perf_counter() - t0


def _fused_by_default(state: PolicyState) -> bool:
    return _fused_ready or state.floor.size >= FUSED_MIN_ELEMENTS


def _update_fused(params: PolicyParams, state: PolicyState, wait, delay, step_us,
                  rank: int | None) -> StepStats:
    # Once a training step, on a cold cache, every line of Python here costs ~0.5-1 us: the
    # usual step only tests that the plan still fits (same params, rank and state arrays) and
    # that the inputs are arrays of the state's shape, then calls the kernel with the plan's
    # arguments. At 4096 x 4 on the 2-core VM, all this Python around the kernel's call cost
    # 23-26 us in three interleaved cold rounds. Dtypes are left to the kernel's one
    # signature: a TypeError sends other ones through the conversion below.
    if not _fused_ready:
        prepare_fused()
    plan = state.plan
    if not (plan is not None and plan.params is params and type(plan.rank) is type(rank)
            and plan.rank == rank and plan.floor is state.floor and plan.calm is state.calm
            and plan.mean is state.mean and plan.var is state.var
            and plan.active is state.active and plan.above is state.above
            and plan.below is state.below and plan.last_seen is state.last_seen
            and plan.n_last is state.n_last):
        plan = state.plan = _Plan.make(params, state, rank)
    if not (type(wait) is type(delay) is type(step_us) is np.ndarray
            and wait.shape == delay.shape == plan.shape and step_us.shape == plan.ranks):
        wait, delay, step_us = _inputs(state, wait, delay, step_us)
    if delay.base is plan.tail[0] or delay is plan.tail[0]:
        # The last update's delays given back as applied ones (`state.delay`): the kernel
        # overwrites that buffer, and `StepStats.earliness` must still read what was applied.
        delay = delay.copy()
    try:
        cap, state.step = fused_update(*plan.head, state.step, wait, delay, step_us, *plan.tail)
    except TypeError:  # other dtypes, read-only or unaligned inputs: the signature has none
        wait, delay, step_us = (np.array(a, dtype=np.float64) for a in (wait, delay, step_us))
        cap, state.step = fused_update(*plan.head, state.step, wait, delay, step_us, *plan.tail)
    per_site = plan.per_site
    state.delay = plan.delay
    return StepStats(per_site[0], per_site[1], plan.straggler, per_site[2], plan.valid,
                     float(cap), plan.delay, state.active.copy(), per_site[3], wait, delay)


@dataclass(slots=True, eq=False)
class _Plan:
    """The fused kernel's arguments for one state and `rank`, made once and reused while they
    fit: the state arrays it was made for (Fortran-ordered [N, S], which the kernel reads as
    [S, N] transposes, in `head`) and the output buffers, reused by every update (not copied:
    at 4096 x 4 a fresh 256 KB of outputs a step cost ~11 us on a cold cache). `delay` [N, S]
    is a view of the kernel's [S, N] buffer; spread, residual, transfer and lowest are the
    rows of `per_site` [4, S]. With a `rank`, the kernel writes that rank's delays alone and
    every other delay stays 0."""

    params: PolicyParams
    rank: int | None
    floor: np.ndarray
    calm: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    active: np.ndarray
    above: np.ndarray
    below: np.ndarray
    last_seen: np.ndarray
    n_last: np.ndarray
    shape: tuple[int, int]  # (N, S) of the inputs
    ranks: tuple[int]  # (N,) of the step times
    head: tuple  # the kernel's arguments before the step count
    tail: tuple  # its arguments after the inputs: outputs and the rank
    delay: np.ndarray
    per_site: np.ndarray
    valid: np.ndarray
    straggler: np.ndarray

    @classmethod
    def make(cls, params: PolicyParams, state: PolicyState, rank: int | None) -> _Plan:
        n, s = state.floor.shape
        _check_rank(rank, n)
        # The kernel does not check bounds: a state array of another size would have it write
        # past the end of it.
        per_rank = ("calm", "mean", "var", "last_seen")
        sizes = {name: getattr(state, name).shape
                 for name in (*per_rank, "active", "above", "below", "n_last")}
        if any(shape != ((n, s) if name in per_rank else (s,)) for name, shape in sizes.items()):
            raise ValueError(f"a policy state of {n} ranks x {s} sites (its floor) needs "
                             f"{', '.join(per_rank)} of {(n, s)} and active, above, below and "
                             f"n_last of {(s,)}; got {sizes}")
        to_fused_layout(state)
        delay = np.zeros((s, n))
        per_site, valid = np.empty((4, s)), np.empty(n, dtype=bool)
        straggler = np.empty(s, dtype=np.int64)
        head = (np.array(params, dtype=np.float64), state.floor.T, state.calm.T, state.mean.T,
                state.var.T, state.active, state.above, state.below, state.last_seen.T,
                state.n_last)
        tail = (delay, valid, per_site, straggler, -1 if rank is None else int(rank))
        return cls(params, rank, state.floor, state.calm, state.mean, state.var, state.active,
                   state.above, state.below, state.last_seen, state.n_last, (n, s), (n,), head,
                   tail, delay.T, per_site, valid, straggler)


def _check_rank(rank: int | None, n_ranks: int) -> None:
    if rank is not None and not (isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
                                 and 0 <= rank < n_ranks):
        raise ValueError(f"rank must be None or an integer in [0, {n_ranks}), got {rank!r}")


def _inputs(state: PolicyState, wait, delay,
            step_us) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N, S] wait and delay and [N] step times as C-contiguous float64 (the arrays given,
    when they already are)."""
    n, s = state.shape
    if np.size(wait) != n * s or np.size(delay) != n * s or np.size(step_us) != n:
        raise ValueError(
            f"expected wait and delay of {n}x{s} and step_us of {n}, got sizes "
            f"{np.size(wait)}, {np.size(delay)}, {np.size(step_us)}"
        )
    def as2d(a):
        if (type(a) is np.ndarray and a.dtype == np.float64 and a.shape == (n, s)
                and a.flags.c_contiguous):
            return a  # the usual case, without NumPy's conversions
        return np.ascontiguousarray(np.asarray(a, dtype=np.float64).reshape(n, s))

    return as2d(wait), as2d(delay), np.ascontiguousarray(step_us, dtype=np.float64).reshape(n)


def update_reference(
    params: PolicyParams,
    state: PolicyState,
    wait: np.ndarray,
    delay: np.ndarray,
    step_us: np.ndarray,
    *,
    rank: int | None = None,
) -> tuple[PolicyState, StepStats]:
    """The reference: `update` written in NumPy, for reading and for tests."""
    n, s = state.shape
    w, d, step_us = _inputs(state, wait, delay, step_us)
    _check_rank(rank, n)

    with np.errstate(invalid="ignore"):  # NaN and opposite infinities: invalid, and quietly so
        ok = np.isfinite(w) & np.isfinite(d) & (w >= 0) & (d >= 0) & (w < ABSURD_US) & (d < ABSURD_US)
        arrival = np.where(ok, w + d, np.inf)  # time from natural arrival to exit
    valid = ok.all(axis=1)
    n_valid = int(valid.sum())
    arrival[~valid] = np.inf
    if n_valid >= 2:
        lowest = arrival.min(axis=0)  # min_j (w_j + d_j)
        earliness = np.where(valid[:, None], arrival - lowest, 0.0)
        spread = earliness.max(axis=0)
        straggler = arrival.argmin(axis=0)
        w_valid = np.where(valid[:, None], w, np.nan)
        residual = np.nanmax(w_valid, axis=0) - np.nanmin(w_valid, axis=0)
        transfer = np.nanmin(w_valid, axis=0)
    else:
        earliness = np.zeros((n, s))
        lowest = arrival.min(axis=0) if n_valid else np.full(s, np.nan)
        spread = np.full(s, np.nan)
        straggler = np.full(s, -1, dtype=np.int64)
        residual = np.full(s, np.nan)
        transfer = np.nanmin(np.where(valid[:, None], w, np.nan), axis=0) if n_valid \
            else np.full(s, np.nan)

    step_count = state.step + 1
    warming = step_count <= params.warmup_steps
    floor, calm, active = state.floor.copy(), state.calm.copy(), state.active.copy()
    mean, var = state.mean.copy(), state.var.copy()
    above, below = state.above.copy(), state.below.copy()
    last_seen, n_last = state.last_seen.copy(), state.n_last.copy()
    if not warming and n_valid >= 2:
        # Fast down; up only for a rank that has not been late for the holdoff, so that a rank
        # which is only sometimes early is never delayed into being the straggler.
        calm = np.where(earliness <= params.guard_us, 0, calm + 1)
        sites = np.arange(s)
        n_last += ~last_seen[straggler, sites]
        last_seen[straggler, sites] = True
        # What the estimates learn from: earliness at most OUTLIER_Z standard deviations (and
        # the guard) above the rank's mean. One step in which every other rank waited for a
        # paused one (a checkpoint: earliness 30 s) would otherwise swell the variance, and
        # switch the delays off, for hundreds of steps.
        first = var < 0
        sd = np.sqrt(np.maximum(var, 0.0))
        e = np.where(first, earliness, np.minimum(earliness, mean + OUTLIER_Z * sd + params.guard_us))
        hold = np.where(last_seen, params.holdoff_steps, holdoff(params, n_last))
        rise = np.where(calm >= hold, params.floor_rise, 0.0)
        rate = np.where(e < floor, params.floor_fall, rise)
        floor = floor + rate * (e - floor)
        # Exponentially weighted mean and variance, started at the first sample.
        diff = np.where(first, 0.0, e - mean)
        mean = np.where(first, e, mean + params.floor_rise * diff)
        var = (1.0 - params.floor_rise) * (np.maximum(var, 0.0) + params.floor_rise * diff * diff)
        above = np.where(spread > params.threshold_us, above + 1, 0)
        below = np.where(spread < params.release_us, below + 1, 0)
        if params.mode == MODE_PACE:
            turn_on = ~active & (above >= params.on_steps)
            turn_off = active & (below >= params.off_steps)
            active = (active | turn_on) & ~turn_off
    floor[~valid] = 0.0
    calm[~valid] = 0
    mean[~valid] = 0.0
    var[~valid] = -1.0
    if params.mode != MODE_PACE:
        active[:] = False

    with np.errstate(invalid="ignore"):
        known = step_us[np.isfinite(step_us) & (step_us > 0) & (step_us < ABSURD_US)]
    cap = min(params.max_delay_us, params.cap_fraction * float(np.median(known))) if known.size else 0.0

    # Below the floor (fast down after a late step) and below mean - z sigma (noise would
    # otherwise push some rank past the last arrival on most steps of a large job).
    bound = np.minimum(floor, mean - params.safety_z * np.sqrt(np.maximum(var, 0.0)))
    next_delay = np.clip(params.gain * bound - params.guard_us, 0.0, cap)
    next_delay[:, ~active] = 0.0
    next_delay[~valid] = 0.0
    has_straggler = straggler >= 0
    next_delay[straggler[has_straggler], np.flatnonzero(has_straggler)] = 0.0  # the last arrival waits for nobody
    row_total = next_delay.sum(axis=1)
    over = row_total > cap
    if over.any():  # one rank's delays over all sites must not exceed the cap either
        next_delay[over] *= (cap / row_total[over])[:, None]
    if warming or params.mode != MODE_PACE or n_valid < 2:
        next_delay[:] = 0.0
    if rank is not None:  # one rank's rows only: the others keep their state, get no delay
        others = np.arange(n) != rank
        for new, old in ((floor, state.floor), (calm, state.calm), (mean, state.mean),
                         (var, state.var)):
            new[others] = old[others]
        next_delay[others] = 0.0

    new_state = PolicyState(
        floor=floor, calm=calm, mean=mean, var=var, delay=next_delay, active=active, above=above,
        below=below, last_seen=last_seen, n_last=n_last, step=step_count
    )
    stats = StepStats(
        spread=spread,
        residual=residual,
        straggler=straggler,
        transfer=transfer,
        valid=valid,
        cap_us=cap,
        delay=next_delay,
        active=active,
        lowest=lowest,
        wait=w,
        applied=d,
    )
    return new_state, stats


class Controller:
    """Stateful convenience wrapper over `update` for one rank count and site count."""

    def __init__(self, config: PaceConfig, n_ranks: int, n_sites: int):
        self.params = PolicyParams.from_config(config, n_ranks)
        self.state = init_state(n_ranks, n_sites)

    def update(self, wait: np.ndarray, delay: np.ndarray, step_us: np.ndarray) -> StepStats:
        self.state, stats = update(self.params, self.state, wait, delay, step_us)
        return stats


def deadline_delay(planned_us, arrival_us, usual_us, rate):
    """Applies a planned delay as a deadline: shortened by how much later than usual the rank
    arrived, never lengthened. The policy plans d from past steps; a rank whose own compute ran
    late this step (a spike) would otherwise enter d after a late arrival and become the
    straggler that pacing was meant to avoid. `arrival_us` is the rank's arrival on its own
    clock since it left the same site one step before (NaN when unknown: all ranks leave a
    site together, so that exit is a common reference), `usual_us` its running mean (NaN
    before the first sample), updated at `rate` by at most the mean itself: one arrival a
    minute late (a checkpoint) would otherwise lift it so far that later spikes went unseen
    for ~100 steps. Returns (delay to apply, new running mean).
    Plain Python on scalars: the host backend calls it per site, the simulator compiles it."""
    if math.isnan(arrival_us):  # unknown arrival: the plan as it is
        return max(planned_us, 0.0), usual_us
    if math.isnan(usual_us):  # first sample
        return max(planned_us, 0.0), arrival_us
    late = arrival_us - usual_us
    learn = min(late, usual_us) if usual_us > 0.0 else late
    return max(0.0, planned_us - max(late, 0.0)), usual_us + rate * learn


def oracle_delays(arrival_us: np.ndarray, guard_us: float = 0.0, cap_us: float = np.inf) -> np.ndarray:
    """Perfect foresight, for evaluation only: with true arrivals on one clock, delay every rank
    up to the last arrival less the guard, d_i = max_j a_j - a_i - guard, within [0, cap].
    `arrival_us` is [N] or [N, S]; ranks are along the first axis."""
    a = np.asarray(arrival_us, dtype=np.float64)
    # In-place maximum/minimum rather than np.clip: the simulator calls this once per bucket
    # and step, where np.clip's overhead on small arrays was most of the simulator's time.
    d = (a.max() - guard_us) - a if a.ndim == 1 else a.max(axis=0, keepdims=True) - guard_us - a
    np.maximum(d, 0.0, out=d)
    if cap_us < np.inf:
        np.minimum(d, cap_us, out=d)
    return d
