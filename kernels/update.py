"""The policy's per-step update as one fused Triton kernel: earliness floors, hysteresis, the
delay cap, the next delays, the telemetry ring and the device step counter.

It reads the gathered timing matrix and the outputs of the CuPy reduction (`reduce.py`) and
updates the policy state in place, in preallocated device buffers, so that a captured CUDA
graph runs it at every replay with no host work. One program: a block of ranks (`BLOCK_N`, a
power of two >= N) and a loop over sites, so N up to a few thousand and any site count fit.

Identical to `gpupace.policy.update` (the NumPy reference):
- validity of a rank's row, earliness E = (w + d) - min (w + d) over valid ranks, spread, the
  straggler (lowest rank on ties), transfer and residual (from the reduction);
- warm-up (steps <= warmup_steps measure but never learn or pace), the fast-down floor that
  rises only after `holdoff_steps` calm steps (the calm counter: steps since the rank was within
  guard_us of the last arrival), the running mean and variance of earliness (rate floor_rise,
  variance -1 until the first sample), all three learning from earliness clipped at
  mean + OUTLIER_Z * sd + guard_us, all reset for invalid ranks, the above/below counters and the on/off hysteresis, only
  with two or more valid ranks;
- the cap min(max_delay_us, cap_fraction * median of the known step times), 0 when none is known;
- next delay clamp(gain * min(floor, mean - safety_z * sd) - guard, 0, cap), zero at inactive sites, for invalid ranks and
  for each site's straggler; a rank's delays over all sites scaled down to sum to at most cap;
  all zero while warming, outside `pace` mode or with fewer than two valid ranks;
- the host engine's rules around the policy: when the ranks' site counts disagree (or are 0)
  nothing is learnt and every delay is 0; a new site count starts the state afresh.
Deliberate differences:
- float32 throughout (NumPy uses float64): floors and delays agree to float32 rounding, and a
  spread within rounding of a threshold may flip a hysteresis count;
- the median of the known step times comes from the reduction (a bitonic sort in float32);
- next delays of sites past this step's count are set to 0 in the state (the host keeps them in
  an unused tail); the state's step count is `counter[1]`, the steps done `counter[0]`.

Telemetry ring: float32 [ring_len, record_len(N, M)], slot = step % ring_len, with the step in
the int64 `ring_step` [ring_len] written last. Record fields, in order (`REC_*` offsets): ok
(1 when the update ran), this rank's step time, spread, residual, transfer and straggler at the
site of largest spread, any site active, that site's index, the cap, the site count; then per
rank earliness at that site, wait and applied delay summed over sites, step time; then the
spread of every site (M slots, the first `n_sites` used).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

MODE_PACE = 2  # gpupace.policy.MODE_PACE; kernels do not import the library
ABSURD_US = 1e9  # gpupace.policy.ABSURD_US
OUTLIER_Z = 4.0  # gpupace.policy.OUTLIER_Z
REC_OK, REC_STEP_TIME, REC_SPREAD, REC_RESIDUAL, REC_TRANSFER, REC_STRAGGLER = range(6)
REC_ACTIVE, REC_SITE, REC_CAP, REC_N_SITES = range(6, 10)
REC_HEAD = 10
COUNTER_LEN = 3  # steps done, policy updates (state.step), site count the state was built for


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _lo(a, b):
    return tl.minimum(a, b)


@triton.jit
def _hi(a, b):
    return tl.maximum(a, b)


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


def record_len(n_ranks: int, max_sites: int) -> int:
    return REC_HEAD + 4 * n_ranks + max_sites


@triton.jit(do_not_specialize=["n_sites", "rank"])
def _update_kernel(
    g_ptr, n_ranks, row_len, max_sites, n_sites, rank,
    valid_ptr, nvalid_ptr, site_ptr, strag_ptr, median_ptr,
    floor_ptr, calm_ptr, mean_ptr, var_ptr, delay_ptr, active_ptr, above_ptr, below_ptr,
    counter_ptr, row_ptr, ring_ptr, ring_step_ptr, ring_len, rec_len,
    mode, threshold, release, on_steps, off_steps, gain, guard, max_delay, cap_fraction,
    rise, fall, holdoff, safety_z, warmup_steps, absurd,
    BLOCK_N: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_N)
    rmask = offs < n_ranks
    grow = g_ptr + offs * row_len
    valid = tl.load(valid_ptr + offs, mask=rmask, other=0) != 0
    nv = tl.load(nvalid_ptr)
    two = nv >= 2

    counts = tl.load(grow, mask=rmask, other=0.0).to(tl.int32)
    counts_lo = tl.reduce(tl.where(rmask, counts, 2147483647), 0, _lo)
    counts_hi = tl.reduce(tl.where(rmask, counts, -1), 0, _hi)
    agree = (counts_lo == n_sites) & (counts_hi == n_sites) & (n_sites > 0)

    total = tl.load(counter_ptr)
    n_state = tl.load(counter_ptr + 2)
    fresh = n_state != n_sites  # a new site layout starts the state afresh (host engine rule)
    pstep = tl.where(fresh, 0, tl.load(counter_ptr + 1)) + 1
    warming = pstep <= warmup_steps
    learn = agree & (~warming) & two
    # HACK: the interpreter turns (block bool & scalar bool) into ints, which tl.store rejects
    # as a mask; a comparison gives a true bool block.
    amask = rmask & ((offs * 0 + agree.to(tl.int32)) != 0)
    pace = mode == _PACE

    # Cap: a fraction of the median known step time (from the reduction), within max_delay;
    # 0 when no step time is known (median NaN).
    st = tl.load(grow + 1, mask=rmask, other=float("nan"))
    med = tl.load(median_ptr)
    cap = tl.where(med == med, tl.minimum(max_delay, cap_fraction * med), 0.0)

    row_total = tl.full([BLOCK_N], 0.0, tl.float32)
    wait_sum = tl.full([BLOCK_N], 0.0, tl.float32)
    delay_sum = tl.full([BLOCK_N], 0.0, tl.float32)
    best_e = tl.full([BLOCK_N], 0.0, tl.float32)
    best = tl.full([], -2.0, tl.float32)
    best_s = tl.full([], 0, tl.int32)
    any_active = tl.full([], 0, tl.int32)
    slot = (total % ring_len).to(tl.int32)
    rec = ring_ptr + slot.to(tl.int64) * rec_len
    for s in range(0, n_sites):
        w = tl.load(grow + 2 + s, mask=rmask, other=0.0)
        d = tl.load(grow + 2 + max_sites + s, mask=rmask, other=0.0)
        wait_sum += tl.where(w == w, w, 0.0)
        delay_sum += tl.where(d == d, d, 0.0)
        earliest = tl.load(site_ptr + s)
        spread = tl.load(site_ptr + max_sites + s)
        strag = tl.load(strag_ptr + s)
        e = tl.where(valid & two, (w + d) - earliest, 0.0)
        sp_key = tl.where(spread == spread, spread, -1.0)
        better = sp_key > best
        best_e = tl.where(better, e, best_e)
        best_s = tl.where(better, s, best_s)
        best = tl.where(better, sp_key, best)
        tl.store(rec + _HEAD + 4 * n_ranks + s, spread)

        f = tl.load(floor_ptr + offs * max_sites + s, mask=rmask, other=0.0)
        f = tl.where(fresh, 0.0, f)
        c = tl.load(calm_ptr + offs * max_sites + s, mask=rmask, other=0)
        c = tl.where(fresh, 0, c)
        mu = tl.where(fresh, 0.0, tl.load(mean_ptr + offs * max_sites + s, mask=rmask, other=0.0))
        var = tl.where(fresh, -1.0, tl.load(var_ptr + offs * max_sites + s, mask=rmask, other=-1.0))
        act = tl.where(fresh, 0, tl.load(active_ptr + s)) != 0
        ab = tl.where(fresh, 0, tl.load(above_ptr + s))
        be = tl.where(fresh, 0, tl.load(below_ptr + s))
        # Fast down; up only after `holdoff` steps without being late (within guard of last).
        c = tl.where(learn, tl.where(e <= guard, 0, c + 1), c)
        # Exponentially weighted mean and variance of earliness, started at the first sample
        # (var < 0: none yet). The state learns from earliness at most OUTLIER_Z sd (and the
        # guard) above the mean, so that one paused step does not switch delays off for long.
        first = var < 0.0
        top = mu + _OUTLIER_Z * tl.sqrt(tl.maximum(var, 0.0)) + guard
        x = tl.where(first, e, tl.minimum(e, top))
        rate = tl.where(x < f, fall, tl.where(c >= holdoff, rise, 0.0))
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
        any_active = any_active | act.to(tl.int32)

        # below the floor and below mean - z sigma (no rank pushed past the last)
        bound = tl.minimum(f, mu - safety_z * tl.sqrt(tl.maximum(var, 0.0)))
        nd = tl.minimum(tl.maximum(gain * bound - guard, 0.0), cap)
        nd = tl.where(act & valid & (offs != strag), nd, 0.0)
        row_total += nd
        tl.store(floor_ptr + offs * max_sites + s, f, mask=amask)
        tl.store(calm_ptr + offs * max_sites + s, c, mask=amask)
        tl.store(mean_ptr + offs * max_sites + s, mu, mask=amask)
        tl.store(var_ptr + offs * max_sites + s, var, mask=amask)
        tl.store(delay_ptr + offs * max_sites + s, nd, mask=rmask)
        # Every warp has read this site's switch state before it is overwritten: without the
        # barrier a warp one site behind could read the next step's values.
        tl.debug_barrier()
        if agree:
            tl.store(active_ptr + s, act.to(tl.int32))
            tl.store(above_ptr + s, ab)
            tl.store(below_ptr + s, be)

    tl.debug_barrier()  # the delays stored above are read back below
    scale = tl.where(row_total > cap, cap / tl.where(row_total > 0.0, row_total, 1.0), 1.0)
    keep = agree & (~warming) & pace & two
    for s in range(0, max_sites):
        nd = tl.load(delay_ptr + offs * max_sites + s, mask=rmask, other=0.0)
        nd = tl.where(keep & (s < n_sites), nd * scale, 0.0)
        tl.store(delay_ptr + offs * max_sites + s, nd, mask=rmask)
        # This rank's row starts the next step empty: no sites, w unknown, no delay.
        tl.store(row_ptr + 2 + s, float("nan"))
        tl.store(row_ptr + 2 + max_sites + s, 0.0)
    tl.store(row_ptr, 0.0)
    tl.store(row_ptr + 1, float("nan"))

    # Telemetry record at the site of largest spread; the step number is written last.
    tl.store(rec + _OK, agree.to(tl.float32))
    tl.store(rec + _STEP_TIME, tl.load(g_ptr + rank * row_len + 1))
    tl.store(rec + _SPREAD, tl.load(site_ptr + max_sites + best_s))
    tl.store(rec + _RESIDUAL, tl.load(site_ptr + 3 * max_sites + best_s))
    tl.store(rec + _TRANSFER, tl.load(site_ptr + 2 * max_sites + best_s))
    tl.store(rec + _STRAGGLER, tl.load(strag_ptr + best_s).to(tl.float32))
    tl.store(rec + _ACTIVE, any_active.to(tl.float32))
    tl.store(rec + _SITE, best_s.to(tl.float32))
    tl.store(rec + _CAP, cap)
    tl.store(rec + _N_SITES, n_sites.to(tl.float32))
    # NaN for an invalid row, as the host's make_record: 0 would tie with the last arrival.
    tl.store(rec + _HEAD + offs, tl.where(valid, best_e, float("nan")), mask=rmask)
    tl.store(rec + _HEAD + n_ranks + offs, wait_sum, mask=rmask)
    tl.store(rec + _HEAD + 2 * n_ranks + offs, delay_sum, mask=rmask)
    tl.store(rec + _HEAD + 3 * n_ranks + offs, st, mask=rmask)
    tl.store(ring_step_ptr + slot, total)

    tl.store(counter_ptr, total + 1)
    if agree:
        tl.store(counter_ptr + 1, pstep.to(tl.int64))
        tl.store(counter_ptr + 2, n_sites.to(tl.int64))


def block_n(n_ranks: int) -> int:
    return max(16, triton.next_power_of_2(int(n_ranks)))


def num_warps_for(n_ranks: int) -> int:
    """About 4 elements of each rank vector per thread, up to 32 warps (1024 threads): a
    dozen such vectors live at once. Compiled for sm_90a (Triton 3.9, ptxas -v): 512 ranks on
    4 warps and 1024 on 8 use 184 and 211 registers, no spill; 1024 on 4 warps spilled 208 B,
    4096 on 16 warps 2436 B, on 32 warps 968 B (the 1024-thread limit: beyond it, spills)."""
    return min(32, max(4, block_n(n_ranks) // 128))


def update(gathered: torch.Tensor, row: torch.Tensor, red: dict[str, torch.Tensor],
           state: dict[str, torch.Tensor], ring: torch.Tensor, ring_step: torch.Tensor,
           params: Any, *, n_sites: int, rank: int) -> None:
    """Launches the fused update for one step (one program).

    `gathered` float32 [N, 2 + 2M]; `row` this rank's float32 [2 + 2M] row (reset here for the
    next step); `red` the reduction outputs (valid, n_valid, site, straggler, median, as in
    `reduce.py`, as torch tensors); `state` float32 floor, mean, var (-1: no sample) and delay [N, M], int32 calm [N, M],
    int32 active, above, below [M], int64 counter [COUNTER_LEN]; `params` anything with the fields of
    `gpupace.policy.PolicyParams`. Under the interpreter all tensors are CPU tensors."""
    n_ranks, row_len = gathered.shape
    max_sites = (row_len - 2) // 2
    if not 0 <= n_sites <= max_sites:
        raise ValueError(f"n_sites must be in [0, {max_sites}], got {n_sites}")
    if not 0 <= rank < n_ranks:
        raise ValueError(f"rank must be in [0, {n_ranks}), got {rank}")
    p = params
    _update_kernel[(1,)](
        gathered, n_ranks, row_len, max_sites, int(n_sites), int(rank),
        red["valid"], red["n_valid"], red["site"], red["straggler"], red["median"],
        state["floor"], state["calm"], state["mean"], state["var"], state["delay"], state["active"], state["above"], state["below"],
        state["counter"], row, ring, ring_step, ring.shape[0], ring.shape[1],
        int(p.mode), float(p.threshold_us), float(p.release_us), int(p.on_steps),
        int(p.off_steps), float(p.gain), float(p.guard_us), float(p.max_delay_us),
        float(p.cap_fraction), float(p.floor_rise), float(p.floor_fall), int(p.holdoff_steps),
        float(p.safety_z), int(p.warmup_steps),
        ABSURD_US, BLOCK_N=block_n(n_ranks),
        num_warps=num_warps_for(n_ranks),
    )
