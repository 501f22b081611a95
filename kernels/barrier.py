"""A device-side barrier that stands in for a collective in the virtual cluster
(`gpupace.vcluster`): each rank's launch adds one arrival to a counter, then K programs (CTAs)
spin on it until every rank has arrived, as an NCCL kernel's channels (one CTA each) spin while
a rank waits for its peers. Every wait is bounded by a timeout on the device clock, and by a
number of polls should that clock stall; a launch that times out raises a flag instead of
hanging the GPU.

All K programs of all N ranks must be resident at once for the barrier to complete, so the
virtual cluster keeps N * (K + 1) below the SM count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .clock import now, stamp_now, use_clock
from .launch import COMPILE_OPTIONS
from .spin import MIN_READ_NS


@triton.jit(do_not_specialize=["target", "timeout_ns", "max_polls"])
def _barrier_kernel(count_ptr, target, timeout_ns, max_polls, flag_ptr, clk_ptr, fake_tick,
                    USE_CLOCK: tl.constexpr):
    if tl.program_id(0) == 0:
        tl.atomic_add(count_ptr, 1)
    t0 = stamp_now(clk_ptr, USE_CLOCK)
    t = t0
    seen = tl.load(count_ptr, volatile=True)
    i = 0
    while (seen < target) & (t - t0 < timeout_ns) & (i < max_polls):
        seen = tl.load(count_ptr, volatile=True)
        t = now(t, fake_tick, USE_CLOCK)
        i += 1
    if seen < target:
        # A plain store: every writer writes the same 1. A scalar atomic puts a CTA-wide
        # bar.sync around it (seen in the PTX, 16 warps), and warps whose last polls differ
        # would not all reach it.
        tl.store(flag_ptr, 1)


def barrier(count: torch.Tensor, target: int, flag: torch.Tensor, clk: torch.Tensor, *,
            ctas: int = 1, warps: int = 1, timeout_us: float = 100_000.0,
            max_polls: int | None = None, clock: bool | None = None,
            fake_tick: int = 1000) -> None:
    """Arrives at the barrier `count` (int32 [1]) and spins on `ctas` programs of `warps` warps
    each until it reaches `target` or `timeout_us` passes; a timeout sets `flag` (int32 [1]) to
    1. `clk` as in `spin.py` (the virtual clock on the clock-free path). NCCL's channels run
    512 threads a CTA by default (NCCL_NTHREADS): `warps=16` spins like one of them.
    `max_polls` bounds the polls should the clock stall (default: the timeout over 2 ns)."""
    if ctas < 1:
        raise ValueError(f"ctas must be >= 1, got {ctas}")
    if warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"warps must be a power of two from 1 to 32, got {warps}")
    if not timeout_us > 0:
        raise ValueError(f"timeout_us must be positive, got {timeout_us}")
    timeout_ns = int(timeout_us * 1000)
    # A poll (a volatile load and a clock read) takes far more than MIN_READ_NS: this bound
    # only ever stops a wait whose clock has stalled.
    if max_polls is None:
        max_polls = timeout_ns // MIN_READ_NS + 1000
    max_polls = min(max(int(max_polls), 0), 2**31 - 1)
    _barrier_kernel[(int(ctas),)](count, int(target), timeout_ns, max_polls, flag, clk,
                                  int(fake_tick), USE_CLOCK=use_clock(clock), num_warps=warps,
                                  **COMPILE_OPTIONS)
