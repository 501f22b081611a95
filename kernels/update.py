"""The policy's per-step update as one fused Triton kernel: earliness floors, hysteresis, the
delay cap, the next delays, the telemetry ring and the device step counter.

It reads the gathered timing matrix and the outputs of the CuPy reduction (`reduce.py`) and
updates the policy state in place, in preallocated device buffers, so that a captured CUDA
graph runs it at every replay with no host work. A pacer updates its own rank alone, as the
host backend does: one program, a vector over the sites (`BLOCK_M`), no loop but the pass that
copies every rank's figures into the telemetry record (`BLOCK_N` ranks at a time), so its cost
hardly grows with N. (The first version updated every rank, one program over a block of them
and a loop over sites: 7 us at 2 ranks, 622 us at 4096 x 4 sites on an H200.) Tests launch one
program per rank (`new_state(N, M)`) to compare every rank with the reference; so does the
virtual cluster.

Identical to `gpupace.policy.update` (the NumPy reference), for the ranks updated:
- validity of a rank's row, earliness E = (w + d) - min (w + d) over valid ranks, spread, the
  straggler (lowest rank on ties), transfer and residual (from the reduction);
- warm-up (steps <= warmup_steps measure but never learn or pace), the fast-down floor that
  rises only after the holdoff's calm steps (the calm counter: steps since the rank was within
  guard_us of the last arrival; the holdoff: `policy.holdoff`, from the ranks that have been
  each site's straggler, flagged in this program's own [M, N] copy), the running mean and
  variance of earliness (rate floor_rise, variance -1 until the first sample), all three
  learning from earliness clipped at mean + OUTLIER_Z * sd + guard_us, all reset for invalid
  ranks, the above/below counters and the on/off hysteresis, only with two or more valid ranks;
- the cap min(max_delay_us, cap_fraction * median of the known step times), 0 when none is known;
- next delay clamp(gain * min(floor, mean - safety_z * sd) - guard, 0, cap), zero at inactive
  sites, for invalid ranks and for each site's straggler; a rank's delays over all sites scaled
  down to sum to at most cap; all zero while warming, outside `pace` mode or with fewer than
  two valid ranks;
- the host engine's rules around the policy: when the ranks' site counts disagree (or are 0)
  nothing is learnt and every delay is 0; with another site count the first sites keep their
  state and the step count, sites past the widest count yet start afresh
  (`policy.resize_state`), sites past a smaller count keep what they learnt until they come
  back (`policy.update_leading`), and forget their mean arrival and last exit.
Deliberate differences:
- float32 throughout (NumPy uses float64): floors and delays agree to float32 rounding, and a
  spread within rounding of a threshold may flip a hysteresis count;
- the median of the known step times comes from the reduction (a bitonic sort in float32);
- the calm counter (int32) stops at CALM_MAX, 2^30 steps (the reference's int64 counts on):
  both are past any holdoff there, and an int32 that wrapped (2^31 steps, 250 days at 10 ms a
  step) would have stopped the floor from rising;
- next delays of sites past this step's count are set to 0 in the state (the host keeps them in
  an unused tail); the state's step count is `counter[p, 1]`, the steps done `counter[p, 0]`.

Telemetry ring: float32 [ring_len, record_len(N, M)], slot = step % ring_len, with the step in
the int64 `ring_step` [ring_len] written last. Record fields, in order (`REC_*` offsets): ok
(1 when the update ran), this rank's step time, spread, residual, transfer and straggler at the
site of largest spread, any site active, that site's index, the cap, the site count; then per
rank earliness at that site, wait and applied delay summed over sites, step time; then the
spread of every site (M slots, the first `n_sites` used).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from gpupace.policy import holdoff

from .launch import COMPILE_OPTIONS, Hot

MODE_PACE = 2  # gpupace.policy.MODE_PACE, for the constexpr below
OUTLIER_Z = 4.0  # gpupace.policy.OUTLIER_Z
REC_OK, REC_STEP_TIME, REC_SPREAD, REC_RESIDUAL, REC_TRANSFER, REC_STRAGGLER = range(6)
REC_ACTIVE, REC_SITE, REC_CAP, REC_N_SITES = range(6, 10)
REC_HEAD = 10
COUNTER_LEN = 3  # steps done, policy updates (state.step), the widest site count yet
CALM_MAX = 1 << 30  # where the int32 calm counter stops


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _lo(a, b):
    return tl.minimum(a, b)


@triton.jit
def _hi(a, b):
    return tl.maximum(a, b)


@triton.jit
def _pick(v, sm, s):
    """v[s] of a vector over the sites already in registers: no dependent load."""
    return tl.reduce(tl.where(sm == s, v, 0), 0, _add)


# HACK: reductions through tl.reduce with combine functions of this module, not tl.sum/min/max:
# those are @jit functions of triton.language.standard, which the interpreter can run only if
# triton itself was imported under TRITON_INTERPRET=1, and tests set it after other tests
# have imported triton.

# The kernel reads module globals only as constexprs.
_PACE = tl.constexpr(MODE_PACE)
_OUTLIER_Z = tl.constexpr(OUTLIER_Z)
_OK, _STEP_TIME, _SPREAD = tl.constexpr(REC_OK), tl.constexpr(REC_STEP_TIME), tl.constexpr(REC_SPREAD)
_RESIDUAL, _TRANSFER = tl.constexpr(REC_RESIDUAL), tl.constexpr(REC_TRANSFER)
_STRAGGLER, _ACTIVE = tl.constexpr(REC_STRAGGLER), tl.constexpr(REC_ACTIVE)
_SITE, _CAP, _N_SITES = tl.constexpr(REC_SITE), tl.constexpr(REC_CAP), tl.constexpr(REC_N_SITES)
_HEAD = tl.constexpr(REC_HEAD)
COUNTER_LEN_C = tl.constexpr(COUNTER_LEN)
_CALM_MAX = tl.constexpr(CALM_MAX)


def record_len(n_ranks: int, max_sites: int) -> int:
    return REC_HEAD + 4 * n_ranks + max_sites


@triton.jit(do_not_specialize=["n_sites", "rank"])
def _update_kernel(
    g_ptr, n_ranks, row_len, max_sites, n_sites, rank,
    valid_ptr, nvalid_ptr, site_ptr, strag_ptr, median_ptr, sums_ptr, counts_ptr,
    floor_ptr, calm_ptr, mean_ptr, var_ptr, delay_ptr, active_ptr, above_ptr, below_ptr,
    seen_ptr, n_last_ptr, hold_ptr, counter_ptr, usual_ptr, stamps_ptr, row_ptr, ring_ptr,
    ring_step_ptr, ring_len, rec_len,
    mode, threshold, release, on_steps, off_steps, gain, guard, max_delay, cap_fraction,
    rise, fall, holdoff, safety_z, warmup_steps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Program p updates rank `rank + p`, from row p of every state buffer: its own counter and
    # its own copy of the per-site switch state, so no program reads what another writes.
    p = tl.program_id(0)
    me = rank + p
    sm = tl.arange(0, BLOCK_M)
    in_m = sm < max_sites
    on = sm < n_sites
    st_off = p * max_sites + sm
    cnt = counter_ptr + p * COUNTER_LEN_C

    nv = tl.load(nvalid_ptr)
    two = nv >= 2
    valid = tl.load(valid_ptr + me) != 0
    agree = (tl.load(counts_ptr) == n_sites) & (tl.load(counts_ptr + 1) == n_sites) & (n_sites > 0)
    total = tl.load(cnt)
    n_state = tl.load(cnt + 2)
    # Another site count: the first sites keep what they learnt, and the step count (no
    # warm-up restarts); sites past the old count start afresh (policy.resize_state, as the
    # host engine does).
    fresh = sm >= n_state
    pstep = tl.load(cnt + 1) + 1
    warming = pstep <= warmup_steps
    learn = agree & (~warming) & two
    pace = mode == _PACE
    # HACK: the interpreter turns (block bool & scalar bool) into ints, which tl.store rejects
    # as a mask; a comparison gives a true bool block.
    keep_state = on & ((sm * 0 + agree.to(tl.int32)) != 0)

    # Cap: a fraction of the median known step time (from the reduction), within max_delay;
    # 0 when no step time is known (median NaN).
    med = tl.load(median_ptr)
    cap = tl.where(med == med, tl.minimum(max_delay, cap_fraction * med), 0.0)

    # This rank's earliness at every site, and the sites' statistics.
    mine = g_ptr + me.to(tl.int64) * row_len
    w = tl.load(mine + 2 + sm, mask=on, other=0.0)
    d = tl.load(mine + 2 + max_sites + sm, mask=on, other=0.0)
    earliest = tl.load(site_ptr + sm, mask=on, other=0.0)
    spread = tl.load(site_ptr + max_sites + sm, mask=on, other=float("nan"))
    strag = tl.load(strag_ptr + sm, mask=on, other=-1)
    transfer = tl.load(site_ptr + 2 * max_sites + sm, mask=on, other=float("nan"))  # record only
    residual = tl.load(site_ptr + 3 * max_sites + sm, mask=on, other=float("nan"))
    e = tl.where(valid & two, (w + d) - earliest, 0.0)

    f = tl.where(fresh, 0.0, tl.load(floor_ptr + st_off, mask=on, other=0.0))
    c = tl.where(fresh, 0, tl.load(calm_ptr + st_off, mask=on, other=0))
    mu = tl.where(fresh, 0.0, tl.load(mean_ptr + st_off, mask=on, other=0.0))
    var = tl.where(fresh, -1.0, tl.load(var_ptr + st_off, mask=on, other=-1.0))
    act = tl.where(fresh, 0, tl.load(active_ptr + st_off, mask=on, other=0)) != 0
    ab = tl.where(fresh, 0, tl.load(above_ptr + st_off, mask=on, other=0))
    be = tl.where(fresh, 0, tl.load(below_ptr + st_off, mask=on, other=0))
    # The ranks that have been each site's straggler, a flag a rank in this program's own
    # copy [M, N], read and set at the straggler alone; this rank's own flag and their count
    # set its holdoff (`policy.holdoff`, from the host's table of it: float32 put 0.3 x 50
    # past 15). Flags of sites past the widest count yet were never set.
    flags = seen_ptr + (p * max_sites + sm).to(tl.int64) * n_ranks
    look = on & (strag >= 0) & ((sm * 0 + learn.to(tl.int32)) != 0)
    new = look & (tl.load(flags + strag, mask=look, other=1) == 0)
    # (Read before the flag of this step's straggler is set: its calm is 0, below any holdoff
    # but 0, which every rank has then, so its own flag changes nothing this step.)
    seen_me = tl.load(flags + me, mask=on, other=0) != 0
    n_last = tl.where(fresh, 0, tl.load(n_last_ptr + st_off, mask=on, other=0)) + new.to(tl.int32)
    never = tl.load(hold_ptr + tl.minimum(n_last, n_ranks), mask=on, other=0)
    hold = tl.where(seen_me, holdoff, never)
    # Every state load before any store: past BLOCK_M lanes, warps hold copies of the sites
    # (4 warps, 64 sites: two copies), which load alike but store once; a copy a memory trip
    # behind would read its owner's new flag or n_last, and feed a different row total to the
    # reduction below (a review's reading of the sm_90 code; no run showed it).
    tl.debug_barrier()
    tl.store(flags + strag, new.to(tl.int8), mask=new)
    # Fast down; up only after the holdoff's steps without being late (within guard of last).
    c = tl.where(learn, tl.where(e <= guard, 0, tl.minimum(c + 1, _CALM_MAX)), c)
    # Exponentially weighted mean and variance of earliness, started at the first sample
    # (var < 0: none yet). The state learns from earliness at most OUTLIER_Z sd (and the
    # guard) above the mean, so that one paused step does not switch delays off for long.
    first = var < 0.0
    top = mu + _OUTLIER_Z * tl.sqrt(tl.maximum(var, 0.0)) + guard
    x = tl.where(first, e, tl.minimum(e, top))
    rate = tl.where(x < f, fall, tl.where(c >= hold, rise, 0.0))
    f = tl.where(learn, f + rate * (x - f), f)
    diff = tl.where(first, 0.0, x - mu)
    mu = tl.where(learn, tl.where(first, x, mu + rise * diff), mu)
    var = tl.where(learn, (1.0 - rise) * (tl.maximum(var, 0.0) + rise * diff * diff), var)
    ab = tl.where(learn, tl.where(spread > threshold, ab + 1, 0), ab)
    be = tl.where(learn, tl.where(spread < release, be + 1, 0), be)
    switched = (act | ((~act) & (ab >= on_steps))) & ~(act & (be >= off_steps))
    act = tl.where(learn & pace, switched, act) & pace
    f = tl.where(valid, f, 0.0)
    c = tl.where(valid, c, 0)
    mu = tl.where(valid, mu, 0.0)
    var = tl.where(valid, var, -1.0)
    tl.store(floor_ptr + st_off, f, mask=keep_state)
    tl.store(calm_ptr + st_off, c, mask=keep_state)
    tl.store(mean_ptr + st_off, mu, mask=keep_state)
    tl.store(var_ptr + st_off, var, mask=keep_state)
    tl.store(active_ptr + st_off, act.to(tl.int32), mask=keep_state)
    tl.store(above_ptr + st_off, ab, mask=keep_state)
    tl.store(below_ptr + st_off, be, mask=keep_state)
    tl.store(n_last_ptr + st_off, n_last, mask=keep_state)

    # Next delays: below the floor and below mean - z sigma (no rank pushed past the last),
    # none for the straggler, a rank's sum over sites within the cap.
    bound = tl.minimum(f, mu - safety_z * tl.sqrt(tl.maximum(var, 0.0)))
    nd = tl.minimum(tl.maximum(gain * bound - guard, 0.0), cap)
    nd = tl.where(act & on & valid & (strag != me), nd, 0.0)
    row_total = tl.reduce(nd, 0, _add)
    scale = tl.where(row_total > cap, cap / tl.where(row_total > 0.0, row_total, 1.0), 1.0)
    keep = agree & (~warming) & pace & two
    tl.store(delay_ptr + st_off, tl.where(keep, nd * scale, 0.0), mask=in_m)

    if p == 0:
        # This rank's row starts the next step empty: no sites, w unknown, no delay.
        tl.store(row_ptr + 2 + sm, float("nan"), mask=in_m)
        tl.store(row_ptr + 2 + max_sites + sm, 0.0, mask=in_m)
        tl.store(row_ptr, 0.0)
        tl.store(row_ptr + 1, float("nan"))

        # Telemetry record at the site of largest spread (the first, on ties); the step
        # number is written last.
        key = tl.where(on & (spread == spread), spread, -1.0)
        best = tl.reduce(key, 0, _hi)
        best_s = tl.reduce(tl.where(on & (key == best), sm, BLOCK_M), 0, _lo)
        best_s = tl.where(best_s < BLOCK_M, best_s, 0)  # no sites: site 0, as before
        any_active = tl.reduce((act & on).to(tl.int32), 0, _hi)
        slot = (total % ring_len).to(tl.int32)
        rec = ring_ptr + slot.to(tl.int64) * rec_len
        tl.store(rec + _OK, agree.to(tl.float32))
        tl.store(rec + _STEP_TIME, tl.load(mine + 1))
        tl.store(rec + _SPREAD, _pick(spread, sm, best_s))
        tl.store(rec + _RESIDUAL, _pick(residual, sm, best_s))
        tl.store(rec + _TRANSFER, _pick(transfer, sm, best_s))
        tl.store(rec + _STRAGGLER, _pick(strag, sm, best_s).to(tl.float32))
        tl.store(rec + _ACTIVE, any_active.to(tl.float32))
        tl.store(rec + _SITE, best_s.to(tl.float32))
        tl.store(rec + _CAP, cap)
        tl.store(rec + _N_SITES, n_sites.to(tl.float32))
        tl.store(rec + _HEAD + 4 * n_ranks + sm, spread, mask=on)
        # Per rank, BLOCK_N ranks at a time: earliness at that site (NaN for an invalid row,
        # as the host's make_record: 0 would tie with the last arrival), the sums of waits
        # and delays, the step time.
        use = (n_sites > 0) & two
        at_best = _pick(earliest, sm, best_s)
        for r0 in range(0, n_ranks, BLOCK_N):
            rn = r0 + tl.arange(0, BLOCK_N)
            rmask = rn < n_ranks
            grow = g_ptr + rn.to(tl.int64) * row_len
            ok = tl.load(valid_ptr + rn, mask=rmask, other=0) != 0
            wb = tl.load(grow + 2 + best_s, mask=rmask, other=0.0)
            db = tl.load(grow + 2 + max_sites + best_s, mask=rmask, other=0.0)
            eb = tl.where(use, (wb + db) - at_best, 0.0)
            tl.store(rec + _HEAD + rn, tl.where(ok, eb, float("nan")), mask=rmask)
            tl.store(rec + _HEAD + n_ranks + rn, tl.load(sums_ptr + rn, mask=rmask, other=0.0),
                     mask=rmask)
            tl.store(rec + _HEAD + 2 * n_ranks + rn,
                     tl.load(sums_ptr + n_ranks + rn, mask=rmask, other=0.0), mask=rmask)
            tl.store(rec + _HEAD + 3 * n_ranks + rn, tl.load(grow + 1, mask=rmask, other=0.0),
                     mask=rmask)
        tl.debug_barrier()
        tl.store(ring_step_ptr + slot, total)

    tl.store(cnt, total + 1)
    if agree:
        tl.store(cnt + 1, pstep.to(tl.int64))
        # The widest count yet: a step with fewer sites leaves the others' state as it was
        # (stored for the first n alone), to take up again when they come back.
        tl.store(cnt + 2, tl.maximum(n_state, n_sites.to(tl.int64)))
        # Sites past the count forget their mean arrival and last exit (the deadline's), so
        # that one coming back is not taken for a rank that arrived steps late (host rule).
        gone = (sm >= n_sites) & in_m & ((sm * 0 + (n_state != n_sites).to(tl.int32)) != 0)
        tl.store(usual_ptr + st_off, float("nan"), mask=gone)
        tl.store(stamps_ptr + 3 * st_off + 2, sm.to(tl.int64) * 0, mask=gone)


BLOCK_N = 1024  # ranks a pass of the telemetry record takes


def holdoff_table(params: Any, n_ranks: int, device: Any = None) -> torch.Tensor:
    """int32 [n_ranks + 1]: the holdoff of a rank never last at a site where k ranks have been,
    at k = 0..N, computed by `gpupace.policy.holdoff` itself (float64: float32 put 0.3 x 50
    past 15). Made once for each setting and device: `update` launches (the virtual
    cluster's, every step) would otherwise copy it from host memory each time, a copy that
    waits for the stream."""
    return _holdoff_table(int(params.holdoff_steps), float(params.holdoff_factor), n_ranks,
                          str(torch.device(device) if device is not None else "cpu"))


@functools.lru_cache(maxsize=16)
def _holdoff_table(holdoff_steps: int, factor: float, n_ranks: int,
                   device: str) -> torch.Tensor:
    params = SimpleNamespace(holdoff_steps=holdoff_steps, holdoff_factor=factor)
    hold = holdoff(params, np.arange(n_ranks + 1))
    return torch.from_numpy(hold.astype(np.int32)).to(device)


def new_state(n_ranks: int, max_sites: int, device: Any = None, *,
              world_size: int | None = None) -> dict[str, torch.Tensor]:
    """The policy state of `n_ranks` consecutive ranks (one program each; a pacer has its own
    rank alone) of `world_size` (default `n_ranks`): float32 floor, mean, var (-1: no sample
    yet) and delay, int32 calm and the per-site state active, above, below and n_last, all
    [n_ranks, max_sites]; int8 last_seen [n_ranks, max_sites, world_size]; int64 counter
    [n_ranks, COUNTER_LEN]; and the buffers of the sites' kernels (`spin.py`) that the update
    resets for sites that went: float32 usual [n_ranks, max_sites] (NaN) and int64 stamps
    [n_ranks, max_sites, 3]."""
    f32, i32 = torch.float32, torch.int32
    shape = (n_ranks, max_sites)
    world = n_ranks if world_size is None else world_size
    return {"floor": torch.zeros(shape, dtype=f32, device=device),
            "calm": torch.zeros(shape, dtype=i32, device=device),
            "mean": torch.zeros(shape, dtype=f32, device=device),
            "var": torch.full(shape, -1.0, dtype=f32, device=device),
            "delay": torch.zeros(shape, dtype=f32, device=device),
            "active": torch.zeros(shape, dtype=i32, device=device),
            "above": torch.zeros(shape, dtype=i32, device=device),
            "below": torch.zeros(shape, dtype=i32, device=device),
            "n_last": torch.zeros(shape, dtype=i32, device=device),
            "last_seen": torch.zeros(n_ranks, max_sites, world, dtype=torch.int8, device=device),
            "counter": torch.zeros(n_ranks, COUNTER_LEN, dtype=torch.int64, device=device),
            "usual": torch.full(shape, float("nan"), dtype=f32, device=device),
            "stamps": torch.zeros(n_ranks, max_sites, 3, dtype=torch.int64, device=device)}


def update(gathered: torch.Tensor, row: torch.Tensor, red: dict[str, torch.Tensor],
           state: dict[str, torch.Tensor], ring: torch.Tensor, ring_step: torch.Tensor,
           params: Any, *, n_sites: int, rank: int) -> None:
    """Launches the fused update for one step: one program for each row of `state` (made by
    `new_state`), the first for rank `rank`; the first also resets `row` and writes the ring.

    `gathered` float32 [N, 2 + 2M]; `row` this rank's float32 [2 + 2M] row (reset here for the
    next step); `red` the reduction's outputs (`reduce.outputs`), as torch tensors; `params`
    anything with the fields of `gpupace.policy.PolicyParams`. Under the interpreter all
    tensors are CPU tensors."""
    updater(gathered, row, red, state, ring, ring_step, params, rank=rank)(n_sites)


def updater(gathered: torch.Tensor, row: torch.Tensor, red: dict[str, torch.Tensor],
            state: dict[str, torch.Tensor], ring: torch.Tensor, ring_step: torch.Tensor,
            params: Any, *, rank: int) -> Callable[[int], None]:
    """`update` on these buffers, called with the site count: for an engine's hot path, whose
    launches after the first skip the JIT (`launch.Hot`)."""
    n_ranks, row_len = gathered.shape
    max_sites = (row_len - 2) // 2
    n_own = state["floor"].shape[0]
    if state["counter"].shape != (n_own, COUNTER_LEN):
        raise ValueError(f"state['counter'] must be [{n_own}, {COUNTER_LEN}] (one row a rank "
                         f"updated, as new_state makes it), got {list(state['counter'].shape)}")
    if state["last_seen"].shape != (n_own, max_sites, n_ranks):
        raise ValueError(f"state['last_seen'] must be [{n_own}, {max_sites}, {n_ranks}] (a "
                         f"flag for each rank of the gathered rows: new_state(..., world_size="
                         f"{n_ranks})), got {list(state['last_seen'].shape)}")
    if not (0 <= rank and rank + n_own <= n_ranks):
        raise ValueError(f"rank must be in [0, {n_ranks - n_own}] for a state of {n_own} "
                         f"rank(s) among {n_ranks}, got {rank}")
    grid, args, meta = launch_args(gathered, row, red, state, ring, ring_step, params,
                                   n_sites=0, rank=rank)
    hot = Hot(_update_kernel, grid, list(args), free=4, meta=meta)

    def launch(n_sites: int) -> None:
        if not 0 <= n_sites <= max_sites:
            raise ValueError(f"n_sites must be in [0, {max_sites}], got {n_sites}")
        hot(int(n_sites))

    launch.hot = hot  # type: ignore[attr-defined]  # the GPU tests read hot.direct
    return launch


def launch_args(gathered, row, red, state, ring, ring_step, params, *, n_sites: int,
                rank: int) -> tuple[tuple[int], tuple, dict[str, int]]:
    """The grid, the arguments (the constexprs too, last, as a compiled kernel's launcher takes
    them) and the options of the kernel's launch; also what the Hopper compile test compiles."""
    n_ranks, row_len = gathered.shape
    max_sites = (row_len - 2) // 2
    p = params
    args = (
        gathered, n_ranks, row_len, max_sites, int(n_sites), int(rank),
        red["valid"], red["n_valid"], red["site"], red["straggler"], red["median"],
        red["sums"], red["counts"],
        state["floor"], state["calm"], state["mean"], state["var"], state["delay"],
        state["active"], state["above"], state["below"], state["last_seen"], state["n_last"],
        holdoff_table(p, n_ranks, gathered.device), state["counter"], state["usual"],
        state["stamps"], row, ring, ring_step, ring.shape[0], ring.shape[1],
        int(p.mode), float(p.threshold_us), float(p.release_us), int(p.on_steps),
        int(p.off_steps), float(p.gain), float(p.guard_us), float(p.max_delay_us),
        float(p.cap_fraction), float(p.floor_rise), float(p.floor_fall), int(p.holdoff_steps),
        float(p.safety_z), int(p.warmup_steps),
        max(16, triton.next_power_of_2(int(max_sites))),  # BLOCK_M
        min(BLOCK_N, max(16, triton.next_power_of_2(int(n_ranks)))))  # BLOCK_N
    meta = {"num_warps": 4, **COMPILE_OPTIONS}
    return (state["floor"].shape[0],), args, meta
