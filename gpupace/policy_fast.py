"""The policy update as one fused Numba kernel: the same arithmetic as the NumPy reference
`gpupace.policy.update_reference`, in a few passes over the matrices instead of ~40 NumPy
calls. Tests hold it equal to the reference on random inputs.

Layout: the kernel reads w and d as given, [N, S] (strided columns of the host backend's
gathered rows), and the state site-major, as [S, N] C-contiguous matrices, which are the
[N, S] Fortran-ordered arrays of `PolicyState` seen transposed. Each site's loop over ranks is
then a contiguous stream of selects rather than branches; the state is updated in place.
The first pass, one read of the rows, takes the per-site extremes and the straggler and
proves every rank valid from them (the exact per-rank test runs only when that proof fails).
Nothing per rank is written but the ranks being updated: every rank's earliness is left to
`StepStats.earliness`, on demand. A pacer updates its own rank only (`only`).
Costs at 4096 ranks x 4 sites for one pacer on the 2-core VM, each call after a NumPy
reference update (as after the rest of a training step: caches cold), in one interleaved run
of 2026-11-30 (/tmp scripts, not kept): ~30 us for Numba's dispatch and the Python around it
even with a kernel that does nothing, ~35 us more for the first pass, ~25 us for the median
of the step times. Side by side with the version before it, which wrote every rank's
earliness and checked its inputs field by field: 113-132 us against 148-173 in three
interleaved rounds. In bench/cpu_policy (each call after its `cool()`): 116, 133 and 152 us
p50 in three full runs that afternoon, as the VM's speed moved.
Cold, Numba's dispatch alone is costly: a no-op njit function of 17 arguments took 35 us after
16 MB of other memory traffic (1.5 us warm), one of 3 arguments 18 us.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba import types as nt

from .jit import compile_once

# A wait, delay or step of more than 1000 s is a broken clock or a corrupted row, not a measurement.
ABSURD_US = 1e9
MODE_PACE = 2
# The control state learns from earliness clipped this many standard deviations above the
# rank's running mean (plus the guard): 4 leaves a Gaussian sample alone 99.997% of the time.
OUTLIER_Z = 4.0
# A holdoff in steps is its product rounded up, less float64's representation error: 1.1 x 100
# is 110.00000000000001, which a plain ceil took to 111 (`policy.whole_steps`).
WHOLE = 1.0 - 1e-12
_F, _I = nt.float64, nt.int64
# The one signature `fused_update` is compiled for (see `compile_fused`). w, d and step_us are
# strided ('A'): the host backend passes columns of its gathered [N, 2 + 2 W] matrix, and a
# copy of them into contiguous arrays cost more than the update (4096 x 4 on the 2-core VM:
# 267 us p50 with the copies, 145 us without, in one interleaved run). Contiguous arrays
# convert to 'A' for free. The state and outputs are the kernel's own, always contiguous.
SIGNATURE = (_F[::1], _F[:, ::1], _I[:, ::1], _F[:, ::1], _F[:, ::1], nt.boolean[::1],
             _I[::1], _I[::1], nt.boolean[:, ::1], _I[::1], _I, _F[:, :], _F[:, :], _F[:],
             _F[:, ::1], nt.boolean[::1], _F[:, ::1], _I[::1], _I)


def compile_fused() -> None:
    """Compiles `fused_update` for `SIGNATURE` (7.9 s on the 2-core VM the first time on a
    machine; Numba caches it on disk, ~0.5 s to load), then no other (`jit.compile_once`)."""
    compile_once(fused_update, SIGNATURE)


@njit(cache=True, nogil=True, error_model="numpy")
def fused_update(params, floor, calm, mean, var, active, above, below, last_seen, n_last, step,
                 w, d, step_us, delay, valid, per_site, straggler, only):
    """Updates the state (floor, calm, mean, var, last_seen [S, N]; active, above, below,
    n_last [S]) in place from the measurements (w, d [N, S]; step_us [N]) and fills the
    outputs (delay [S, N], the next delays; valid [N]; per_site [4, S]: spread, residual,
    transfer and the lowest w + d, that of the last arrival, from which every rank's earliness
    follows; straggler [S]).
    `params`: `PolicyParams` as float64 [15], in its order. With `only` >= 0, the state and
    delays of that rank alone (a pacer's own); the other ranks' state rows and delays are not
    written (the caller keeps those delays at 0: zeroing them every step cost ~10 us at
    4096 x 4 on a cold cache). Returns (cap, step + 1). Few arguments, some packed: each one
    costs the call ~0.5-1 us of Numba's type dispatch, cold, as it is once a training step."""
    mode, threshold_us, release_us, on_steps, off_steps = params[0], params[1], params[2], \
        params[3], params[4]
    gain, guard_us, max_delay_us, cap_fraction = params[5], params[6], params[7], params[8]
    floor_rise, floor_fall, holdoff_steps = params[9], params[10], params[11]
    safety_z, warmup_steps, holdoff_factor = params[12], params[13], params[14]
    spread, residual, transfer, lowest = per_site[0], per_site[1], per_site[2], per_site[3]
    n, s = w.shape
    # Pass 1, one read of the rows (rank-major: the cost of the update at 4096 ranks): per
    # site, the extremes of w + d and of w, and the first rank with the lowest w + d. All
    # ranks are valid on almost every step; the extremes then prove it (see `_extremes`), and
    # only if not do the exact per-rank test and a second pass over the valid ranks run.
    # Nothing per rank is written: a pacer needs its own rank's earliness alone, recomputed
    # below as w + d - lowest, and a telemetry record one site's (`StepStats.earliness`).
    highest, wlow, whigh = np.empty(s), np.empty(s), np.empty(s)
    if _extremes(w, d, lowest, highest, wlow, whigh, straggler):
        valid[:] = True
        n_valid = n
    else:
        n_valid = _validity(w, d, valid)
        _valid_extremes(w, d, valid, lowest, highest, wlow, whigh, straggler)
    for k in range(s):
        if n_valid < 2:
            straggler[k] = -1
        transfer[k] = wlow[k] if n_valid >= 1 else np.nan
        spread[k] = highest[k] - lowest[k] if n_valid >= 2 else np.nan
        residual[k] = whigh[k] - wlow[k] if n_valid >= 2 else np.nan
        if n_valid == 0:
            lowest[k] = np.nan

    step_count = step + 1
    learning = step_count > warmup_steps and n_valid >= 2
    if learning:
        for k in range(s):
            above[k] = above[k] + 1 if spread[k] > threshold_us else 0
            below[k] = below[k] + 1 if spread[k] < release_us else 0
            last = straggler[k]  # a rank new to the site's stragglers lengthens its holdoff
            n_last[k] += not last_seen[k, last]
            last_seen[k, last] = True
            if mode == MODE_PACE:
                if not active[k] and above[k] >= on_steps:
                    active[k] = True
                elif active[k] and below[k] >= off_steps:
                    active[k] = False
    if mode != MODE_PACE:
        active[:] = False

    typical = median_known(step_us)
    cap = min(max_delay_us, cap_fraction * typical) if typical == typical else 0.0
    pacing = learning and mode == MODE_PACE

    rank_lo, rank_hi = (0, n) if only < 0 else (only, only + 1)
    total = np.zeros(rank_hi - rank_lo)  # each updated rank's delays over all sites
    if not learning:
        delay[:, rank_lo:rank_hi] = 0.0
    else:
        # Per site, ranks in a row and branch-free: earliness, calm, floor, mean, variance and
        # the next delay. Invalid ranks go through too (NaN in, garbage out) and are reset
        # below, which keeps this loop free of per-rank tests.
        keep = 1.0 - floor_rise
        for k in range(s):
            lo = lowest[k]
            pace_site = pacing and active[k]
            last = straggler[k]  # the last arrival waits for nobody
            hold = holdoff_factor * max(n_last[k], 1)  # policy.holdoff, for ranks never last
            hold = np.ceil((hold if hold < holdoff_steps else holdoff_steps) * WHOLE)
            seen = last_seen[k]
            for i in range(rank_lo, rank_hi):
                e = w[i, k] + d[i, k] - lo
                f, c, m, v = floor[k, i], calm[k, i], mean[k, i], var[k, i]
                # Fast down; up only for a rank that has not been late for the holdoff.
                c = 0 if e <= guard_us else c + 1
                fresh = v < 0.0  # the first sample starts the mean and variance
                # Learnt from at most OUTLIER_Z sd (and the guard) above the mean: a pause.
                top = m + OUTLIER_Z * np.sqrt(v) + guard_us
                x = e if fresh or e < top else top
                h = holdoff_steps if seen[i] else hold
                rate = floor_fall if x < f else (floor_rise if c >= h else 0.0)
                f = f + rate * (x - f)
                diff = 0.0 if fresh else x - m
                m = x if fresh else m + floor_rise * diff
                v = keep * ((0.0 if fresh else v) + floor_rise * diff * diff)
                floor[k, i], calm[k, i], mean[k, i], var[k, i] = f, c, m, v
                x = 0.0
                if pace_site:
                    b = m - safety_z * np.sqrt(v)
                    x = gain * (f if f < b else b) - guard_us
                    x = x if x > 0.0 else 0.0
                    x = x if x < cap else cap
                    x = 0.0 if i == last else x
                    total[i - rank_lo] += x
                delay[k, i] = x
    if n_valid < n:
        for i in range(rank_lo, rank_hi):
            if not valid[i]:
                total[i - rank_lo] = 0.0
                for k in range(s):
                    delay[k, i] = 0.0
                    floor[k, i], calm[k, i], mean[k, i], var[k, i] = 0.0, 0, 0.0, -1.0

    # One rank's delays over all sites must not exceed the cap either.
    if pacing and s > 1:  # with one site, the clamp above already did it
        for i in range(rank_lo, rank_hi):
            if total[i - rank_lo] > cap:
                for k in range(s):
                    delay[k, i] *= cap / total[i - rank_lo]
    return cap, step_count


@njit(cache=True, nogil=True, error_model="numpy")
def _extremes(w, d, lowest, highest, wlow, whigh, straggler):
    """Fills the per-site min and max of w + d and of w, and the first rank with the lowest
    w + d; returns whether every value of w and d is valid (0 <= x < ABSURD_US). The test
    costs a NaN check and one more min per element instead of four comparisons: no NaN in
    w + d (a NaN or an opposite infinity in either gives one), min w >= 0, min d >= 0 and
    max(w + d) < ABSURD_US (with both >= 0, each is then below it too). A False may still be
    all valid (w + d over the bound with each under it): the caller's exact test decides then."""
    n, s = w.shape
    nan = False
    dmin = np.inf
    for k in range(s):
        lo, hi, wmin, wmax = np.inf, -np.inf, np.inf, -np.inf
        first = -1
        for i in range(n):
            x, y = w[i, k], d[i, k]
            a = x + y
            nan |= a != a
            first = i if a < lo else first
            lo = a if a < lo else lo
            hi = a if a > hi else hi
            wmin = x if x < wmin else wmin
            wmax = x if x > wmax else wmax
            dmin = y if y < dmin else dmin
        lowest[k], highest[k], wlow[k], whigh[k], straggler[k] = lo, hi, wmin, wmax, first
    return not nan and dmin >= 0.0 and wlow.min() >= 0.0 and highest.max() < ABSURD_US


@njit(cache=True, nogil=True, error_model="numpy")
def _valid_extremes(w, d, valid, lowest, highest, wlow, whigh, straggler):
    """`_extremes` over the valid ranks alone (inf, -inf and -1 with none)."""
    n, s = w.shape
    for k in range(s):
        lo, hi, wmin, wmax = np.inf, -np.inf, np.inf, -np.inf
        first = -1
        for i in range(n):
            if valid[i]:
                x = w[i, k]
                a = x + d[i, k]
                first = i if a < lo else first
                lo, hi = min(lo, a), max(hi, a)
                wmin, wmax = min(wmin, x), max(wmax, x)
        lowest[k], highest[k], wlow[k], whigh[k], straggler[k] = lo, hi, wmin, wmax, first


@njit(cache=True, nogil=True, error_model="numpy")
def _validity(w, d, valid):
    """The exact test, per rank: every w and d of its row in [0, ABSURD_US). Returns the
    number of valid ranks."""
    n, s = w.shape
    n_valid = 0
    for i in range(n):
        ok = True
        for k in range(s):
            # NaN fails every comparison, so this also rejects NaN and inf.
            ok &= (0.0 <= w[i, k] < ABSURD_US) and (0.0 <= d[i, k] < ABSURD_US)
        valid[i] = ok
        n_valid += ok
    return n_valid


@njit(cache=True, nogil=True, error_model="numpy")
def median_known(x):
    """np.median of the known values of x, those in (0, ABSURD_US) (a step time is unknown as
    NaN, 0 or absurd); NaN when none is. One pass keeps them and takes their extremes, then a
    histogram of N/8 bins between min and max and a partition of the bins that hold the
    middle: two passes more and a small sort instead of a quickselect, whose mispredicted
    branches cost ~25 us at 4096 ranks on the 2-core VM. Exact: the bin index is monotone in
    the value, so the middle order statistics are in the bins where the cumulative counts say
    they are."""
    known = np.empty(x.size)
    n = 0
    lo, hi = np.inf, -np.inf
    for v in x:
        if 0.0 < v < ABSURD_US:
            known[n] = v
            n += 1
            lo = v if v < lo else lo
            hi = v if v > hi else hi
    if n == 0:
        return np.nan
    if lo == hi:
        return lo
    x = known[:n]
    if n < 64:
        sort_in_place(x)
        return 0.5 * (x[(n - 1) // 2] + x[n // 2])
    bins = n // 8
    scale = bins / (hi - lo)
    counts = np.zeros(bins + 1, dtype=np.int64)
    for v in x:
        counts[int((v - lo) * scale)] += 1
    r_lo, r_hi = (n - 1) // 2, n // 2  # the order statistics to average
    below = 0  # values in the bins before b
    b = 0
    while below + counts[b] <= r_lo:
        below += counts[b]
        b += 1
    b_hi, upto = b, below + counts[b]
    while upto <= r_hi:
        b_hi += 1
        upto += counts[b_hi]
    middle = np.empty(upto - below)
    j = 0
    for v in x:
        c = int((v - lo) * scale)
        if b <= c <= b_hi:
            middle[j] = v
            j += 1
    sort_in_place(middle)
    return 0.5 * (middle[r_lo - below] + middle[r_hi - below])


@njit(cache=True, nogil=True, error_model="numpy")
def sort_in_place(x):
    """Heapsort of a 1-D float array: O(n log n) whatever the data (the middle bins of
    `median` can hold most values when one is far out), and compiled by Numba in a fraction
    of the time that ndarray.sort and np.median take (seconds, on a first run)."""
    n = x.size
    for root in range(n // 2 - 1, -1, -1):
        _sift_down(x, root, n)
    for end in range(n - 1, 0, -1):
        x[0], x[end] = x[end], x[0]
        _sift_down(x, 0, end)


@njit(cache=True, nogil=True, error_model="numpy")
def _sift_down(x, root, end):
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and x[child] < x[child + 1]:
            child += 1
        if not x[root] < x[child]:
            return
        x[root], x[child] = x[child], x[root]
        root = child
