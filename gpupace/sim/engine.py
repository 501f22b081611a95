"""The Numba hot loops: one bulk-synchronous step of every rank, bucket by bucket.

Timeline of rank i in one step, in us from the previous step's last collective exit:
  optimizer (previous step) -> forward -> backward bucket 0 .. B-1 (compute stream)
  comm stream, per bucket b: natural arrival a = max(gradient ready, exit of bucket b-1)
  -> pacing delay d (gpupace's one-warp spin) and, when paced, the pacing kernels' own time c
  -> entry e = a + d + c -> the collective starts when the last rank enters, s = max e, and
  every rank leaves at x = s + transfer.
Backward compute of bucket b overlaps the collectives of earlier buckets. While a collective
kernel is resident on rank i ([e, x): waiting, then transferring) compute runs at
`1 - coupling`; during a pacing spin ([a, e)) at `1 - paced_coupling`; otherwise at full speed.
This is the spin coupling: an early rank that waits inside NCCL slows its own next bucket.
A paced step also starts later by the step's own pacing work (`simulate` adds it to `start`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import policy

# Compiled into `run_step`. Numba's on-disk cache checks only this file's timestamp: after
# editing `policy.deadline_delay`, touch this file (or clear __pycache__) or the old code runs.
deadline_delay = njit(cache=True, inline="always")(policy.deadline_delay)


@njit(cache=True, inline="always")
def _finish_time(t0, work, b, a, e, s, x, kp, kc):
    """When `work` us of compute started at `t0` ends, given the comm intervals of buckets < b."""
    t = t0
    rem = work
    for j in range(b):
        if x[j] <= t:
            continue
        # three segments of bucket j: spin [a, e), collective [e, x); idle before a
        for seg in range(2):
            lo = a[j] if seg == 0 else e[j]
            hi = e[j] if seg == 0 else x[j]
            k = kp if seg == 0 else kc
            if lo > t:  # comm stream idle: full speed
                gap = lo - t
                if rem <= gap:
                    return t + rem
                rem -= gap
                t = lo
            if hi > t:
                speed = 1.0 - k
                dur = hi - t
                if rem <= dur * speed:
                    return t + rem / speed
                rem -= dur * speed
                t = hi
    return t + rem


@njit(cache=True)
def arrive_bucket(b, start, fwd, work, s, x, kp, kc, ready, a, e):
    """Natural arrivals a[:, b] of every rank at bucket b (compute of b overlaps buckets < b)."""
    n = work.shape[0]
    for i in range(n):
        if b == 0:
            ready[i, 0] = start[i] + fwd[i] + work[i, 0]
            a[i, 0] = ready[i, 0]
        else:
            ready[i, b] = _finish_time(ready[i, b - 1], work[i, b], b, a[i], e[i], s, x, kp, kc)
            a[i, b] = max(ready[i, b], x[b - 1])


@njit(cache=True)
def finish_bucket(b, delay_b, xfer_b, cost, a, e, s, x, w, d):
    """Applies the delays of bucket b and the pacing kernels' `cost`, runs its collective and
    records each rank's wait (from its entry, as the pacer's enter stamp measures it)."""
    n = a.shape[0]
    last = -np.inf
    for i in range(n):
        di = delay_b[i]
        d[i, b] = di
        e[i, b] = a[i, b] + di + cost
        if e[i, b] > last:
            last = e[i, b]
    s[b] = last
    x[b] = last + xfer_b
    for i in range(n):
        w[i, b] = x[b] - e[i, b]


@njit(cache=True)
def run_step(start, fwd, work, xfer, delay, cost, kp, kc, ready, a, e, s, x, w, d, expect, ref,
             rate):
    """One whole step with delays planned in advance (policies `none` and `gpupace`, which
    pays `cost` us of its kernels at every collective), applied as a pacer applies them
    (`gpupace.policy.deadline_delay`): shortened by how much later than usual the rank arrived,
    its arrival at bucket b measured from the bucket's exit one step before, `ref[b]` us
    before this step's origin (NaN on the first step). `expect` [N, B] holds each rank's usual
    arrival and is updated here."""
    applied = np.empty(work.shape[0])
    for b in range(work.shape[1]):
        arrive_bucket(b, start, fwd, work, s, x, kp, kc, ready, a, e)
        for i in range(work.shape[0]):
            applied[i], expect[i, b] = deadline_delay(delay[i, b], a[i, b] + ref[b],
                                                      expect[i, b], rate)
        finish_bucket(b, applied, xfer[b], cost, a, e, s, x, w, d)


@njit(cache=True)
def oracle_advance(b, delay_prev, xfer_prev, cost, start, fwd, work, kp, kc, ready, a, e, s, x,
                   w, d):
    """Finishes bucket b - 1 with its delays (if b > 0), then computes the natural arrivals of
    bucket b (if b < buckets): one call per bucket for the oracle, which decides each bucket's
    delays from its true arrivals in between."""
    if b > 0:
        finish_bucket(b - 1, delay_prev, xfer_prev, cost, a, e, s, x, w, d)
    if b < work.shape[1]:
        arrive_bucket(b, start, fwd, work, s, x, kp, kc, ready, a, e)


@njit(cache=True)
def oracle_step(start, fwd, work, xfer, cost, kp, kc, ready, a, e, s, x, w, d):
    """One whole step under the oracle, paying the pacing kernels' `cost` as the policy does
    (the best that pacing by them can do): each bucket's delays from its true arrivals,
    d_i = max_j a_j - a_i, which is `gpupace.policy.oracle_delays` with no guard and no cap,
    inlined here because one NumPy call per bucket and step was half the simulator's time
    (tests hold the two equal). None where a pacing spin slows compute at least as much as a
    waiting collective (kp >= kc): a delay then cannot gain, and with kp > kc it loses (delaying
    anyway, the bound fell below no pacing and below the policy: -0.17% on `paper` at 2 nodes
    with kc 0 and kp 0.2, 600 steps, one-off run of 2026-12-01)."""
    delay = np.zeros(a.shape[0])
    for b in range(work.shape[1] + 1):
        oracle_advance(b, delay, xfer[b - 1] if b > 0 else 0.0, cost, start, fwd, work, kp, kc,
                       ready, a, e, s, x, w, d)
        if b < work.shape[1] and kp < kc:
            hi = -np.inf
            for i in range(a.shape[0]):
                hi = max(hi, a[i, b])
            for i in range(a.shape[0]):
                delay[i] = hi - a[i, b]


@njit(cache=True)
def step_stats(a, d, spread, early, delay_sum):
    """Per step: true arrival spread per site, each rank's earliness at the site of largest
    spread, and each rank's applied delay summed over sites."""
    n, nb = a.shape
    best, site = -1.0, 0
    for b in range(nb):
        lo, hi = np.inf, -np.inf
        for i in range(n):
            lo = min(lo, a[i, b])
            hi = max(hi, a[i, b])
        spread[b] = hi - lo
        if hi - lo > best:
            best, site = hi - lo, b
    last = -np.inf
    for i in range(n):
        last = max(last, a[i, site])
    for i in range(n):
        early[i] = last - a[i, site]
        tot = 0.0
        for b in range(nb):
            tot += d[i, b]
        delay_sum[i] = tot


@njit(cache=True)
def ar1(z0, eps, rho):
    """AR(1) with unit stationary variance: z[t] = rho z[t-1] + sqrt(1 - rho^2) eps[t]."""
    out = np.empty_like(eps)
    z = z0.copy()
    c = np.sqrt(1.0 - rho * rho)
    for t in range(eps.shape[0]):
        for j in range(eps.shape[1]):
            z[j] = rho * z[j] + c * eps[t, j]
            out[t, j] = z[j]
    return out


@njit(cache=True)
def markov2(state0, u, p_on, p_off):
    """Two-state Markov chain (0: normal, 1: communication-bound) driven by uniforms u."""
    out = np.empty(u.shape[0], dtype=np.int8)
    st = state0
    for t in range(u.shape[0]):
        if st == 0 and u[t] < p_on:
            st = 1
        elif st == 1 and u[t] < p_off:
            st = 0
        out[t] = st
    return out


def warmup() -> float:
    """Compiles (or loads from the on-disk cache) every kernel on tiny inputs; returns seconds."""
    import time

    t0 = time.perf_counter()
    n, nb = 2, 2
    z = np.zeros((n, nb))
    v = np.zeros(nb)
    run_step(np.zeros(n), np.ones(n), np.ones((n, nb)), v.copy(), z.copy(), 0.0, 0.0, 0.1,
             z.copy(), z.copy(), z.copy(), v.copy(), v.copy(), z.copy(), z.copy(),
             np.full((n, nb), np.nan), np.zeros(nb), 0.05)
    z2 = np.zeros(nb)
    oracle_advance(1, v.copy(), 1.0, 0.0, np.zeros(n), np.ones(n), np.ones((n, nb)), 0.0, 0.1,
                   z.copy(), z.copy(), z.copy(), v.copy(), v.copy(), z.copy(), z.copy())
    step_stats(z.copy(), z.copy(), z2, np.zeros(n), np.zeros(n))
    ar1(np.zeros(1), np.zeros((2, 1)), 0.5)
    markov2(0, np.zeros(2), 0.1, 0.1)
    return time.perf_counter() - t0
