"""The policy update as one fused Numba kernel: the same arithmetic as the NumPy reference
`gpupace.policy.update_reference`, in a few passes over the matrices instead of ~40 NumPy
calls. Tests hold it equal to the reference on random inputs.

Layout: the kernel works site-major, on [S, N] C-contiguous matrices, which are the [N, S]
Fortran-ordered arrays of `PolicyState` seen transposed. Each site's loop over ranks is then
a contiguous stream of selects rather than branches; the state is updated in place. On the
2-core VM at 4096 ranks x 4 sites this took the kernel from ~350 to ~140 us per update in a
warm loop (interleaved A/B on the same inputs): ~15 us the call, ~45 the first pass, ~40 the
state pass, ~20 the median of the step times. With the caches cold (16 MB touched between
calls, as a training step would) it takes ~290 us: one update streams ~1 MB of float64 state,
inputs and outputs, which alone is ~100 us at this VM's bandwidth. A pacer needs only its own
rank's state (`only`): the state pass shrinks to S elements and bench/cpu_policy measures
180-224 us p50 (every rank: 277-408 us), still over the 100 us target; what is left is the
first pass over the inputs, every rank's earliness and the median.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# A wait, delay or step of more than 1000 s is a broken clock or a corrupted row, not a measurement.
ABSURD_US = 1e9
MODE_PACE = 2


@njit(cache=True, nogil=True, error_model="numpy")
def fused_update(mode, threshold_us, release_us, on_steps, off_steps, gain, guard_us,
                 max_delay_us, cap_fraction, floor_rise, floor_fall, holdoff_steps, safety_z,
                 warmup_steps, floor, calm, mean, var, active, above, below, step, w, d,
                 step_us, earliness, delay, valid, spread, residual, straggler, transfer,
                 step_us_known, only):
    """Updates the state (floor, calm, mean, var [S, N]; active, above, below [S]) in place
    from the measurements (w, d [N, S], any strides; step_us [N]) and fills the outputs
    (earliness, delay [S, N]; valid [N]; spread, residual, straggler, transfer [S]);
    `step_us_known` [N] is scratch. With `only` >= 0, the state and delays of that rank alone
    (a pacer's own); the other ranks' state rows stay as they were and their delays are 0.
    Returns (cap, step + 1)."""
    n, s = w.shape
    # Pass 1, per site: a site-major copy of w + d (the rows arrive rank-major), the invalid
    # values per rank, and the per-site extremes of w + d and of w, taken over every rank:
    # right whenever all ranks are valid, and redone below for the ranks that are when not.
    arrival = np.empty((s, n))
    bad = np.zeros(n)
    lowest, highest = np.empty(s), np.empty(s)
    wlow, whigh = np.empty(s), np.empty(s)
    for k in range(s):
        lo, hi, wmin, wmax = np.inf, -np.inf, np.inf, -np.inf
        for i in range(n):
            x, y = w[i, k], d[i, k]
            a = x + y
            arrival[k, i] = a
            # NaN fails every comparison, so this also counts NaN and inf.
            bad[i] += (0.0 if 0.0 <= x < ABSURD_US else 1.0) + (0.0 if 0.0 <= y < ABSURD_US else 1.0)
            lo = a if a < lo else lo
            hi = a if a > hi else hi
            wmin = x if x < wmin else wmin
            wmax = x if x > wmax else wmax
        lowest[k], highest[k], wlow[k], whigh[k] = lo, hi, wmin, wmax
    n_valid = 0
    for i in range(n):
        valid[i] = bad[i] == 0.0
        n_valid += valid[i]
    if n_valid < n:  # rare: the extremes again, over valid ranks only
        for k in range(s):
            lo, hi, wmin, wmax = np.inf, -np.inf, np.inf, -np.inf
            for i in range(n):
                if valid[i]:
                    a, x = arrival[k, i], w[i, k]
                    lo, hi = min(lo, a), max(hi, a)
                    wmin, wmax = min(wmin, x), max(wmax, x)
            lowest[k], highest[k], wlow[k], whigh[k] = lo, hi, wmin, wmax
    for k in range(s):
        first = -1  # the straggler: the first valid rank with the lowest w + d
        if n_valid >= 2:
            for i in range(n):
                if valid[i] and arrival[k, i] == lowest[k]:
                    first = i
                    break
        straggler[k] = first
        transfer[k] = wlow[k] if n_valid >= 1 else np.nan
        spread[k] = highest[k] - lowest[k] if n_valid >= 2 else np.nan
        residual[k] = whigh[k] - wlow[k] if n_valid >= 2 else np.nan

    step_count = step + 1
    learning = step_count > warmup_steps and n_valid >= 2
    if learning:
        for k in range(s):
            above[k] = above[k] + 1 if spread[k] > threshold_us else 0
            below[k] = below[k] + 1 if spread[k] < release_us else 0
            if mode == MODE_PACE:
                if not active[k] and above[k] >= on_steps:
                    active[k] = True
                elif active[k] and below[k] >= off_steps:
                    active[k] = False
    if mode != MODE_PACE:
        active[:] = False

    m = 0
    for i in range(n):
        x = step_us[i]
        if 0.0 < x < ABSURD_US:
            step_us_known[m] = x
            m += 1
    cap = min(max_delay_us, cap_fraction * median(step_us_known[:m])) if m else 0.0
    pacing = learning and mode == MODE_PACE

    # Each element of earliness and delay is written once (twice for `only`'s rank).
    total = np.zeros(n)  # each rank's delays over all sites
    rank_lo, rank_hi = (0, n) if only < 0 else (only, only + 1)
    if not learning or only >= 0:
        for k in range(s):
            lo = lowest[k]
            for i in range(n):
                earliness[k, i] = arrival[k, i] - lo if n_valid >= 2 else 0.0
                delay[k, i] = 0.0
    if learning:
        # Per site, ranks contiguous and branch-free: earliness, calm, floor, mean, variance
        # and the next delay. Invalid ranks go through too (NaN in, garbage out) and are reset
        # below, which keeps this loop free of per-rank tests.
        keep = 1.0 - floor_rise
        for k in range(s):
            lo = lowest[k]
            pace_site = pacing and active[k]
            last = straggler[k]  # the last arrival waits for nobody
            for i in range(rank_lo, rank_hi):
                e = arrival[k, i] - lo
                earliness[k, i] = e
                f, c, m, v = floor[k, i], calm[k, i], mean[k, i], var[k, i]
                # Fast down; up only for a rank that has not been late for the holdoff.
                c = 0 if e <= guard_us else c + 1
                rate = floor_fall if e < f else (floor_rise if c >= holdoff_steps else 0.0)
                f = f + rate * (e - f)
                fresh = v < 0.0  # the first sample starts the mean and variance
                diff = 0.0 if fresh else e - m
                m = e if fresh else m + floor_rise * diff
                v = keep * ((0.0 if fresh else v) + floor_rise * diff * diff)
                floor[k, i], calm[k, i], mean[k, i], var[k, i] = f, c, m, v
                x = 0.0
                if pace_site:
                    b = m - safety_z * np.sqrt(v)
                    x = gain * (f if f < b else b) - guard_us
                    x = x if x > 0.0 else 0.0
                    x = x if x < cap else cap
                    x = 0.0 if i == last else x
                    total[i] += x
                delay[k, i] = x
    if n_valid < n:
        for i in range(n):
            if not valid[i]:
                for k in range(s):
                    earliness[k, i], delay[k, i] = 0.0, 0.0
                    if rank_lo <= i < rank_hi:
                        floor[k, i], calm[k, i], mean[k, i], var[k, i] = 0.0, 0, 0.0, -1.0
                total[i] = 0.0

    # One rank's delays over all sites must not exceed the cap either.
    if pacing and s > 1:  # with one site, the clamp above already did it
        for i in range(rank_lo, rank_hi):
            if total[i] > cap:
                for k in range(s):
                    delay[k, i] *= cap / total[i]
    return cap, step_count


@njit(cache=True, nogil=True, error_model="numpy")
def median(x):
    """np.median of finite values, by a histogram of N/8 bins between min and max and a
    partition of the bins that hold the middle: two passes and a small sort instead of a
    quickselect, whose mispredicted branches cost ~25 us at 4096 ranks on the 2-core VM.
    Exact: the bin index is monotone in the value, so the middle order statistics are in
    the bins where the cumulative counts say they are."""
    n = x.size
    lo, hi = x.min(), x.max()
    if lo == hi or n < 64:
        return np.median(x)
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
    middle.sort()
    return 0.5 * (middle[r_lo - below] + middle[r_hi - below])
