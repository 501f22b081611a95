"""Timestamps: a plain stamp into a slot of a device buffer; the exit stamp that closes a
paced collective; and, once a step, the row made of the step's stamps.

Buffer layouts are those of `spin.py`. The exit kernel is the second of the two tiny kernels a
paced collective adds (the first is `spin.enter`): a clock read and two stores (the stamp, and
a mark in the row that the site exited), no load, since a load's round trip to memory was a
third of its time on the H200 (1.18 us in a CUDA graph, 0.81 for a plain stamp; 2026-11-30).
The site count, the waits (w = exit - entry) and the step time are computed for all sites at
once by `finish_row`, before the step's exchange.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .clock import stamp_now, use_clock
from .launch import COMPILE_OPTIONS, Hot, site_launcher


@triton.jit(do_not_specialize=["slot"])
def _stamp_kernel(out_ptr, slot, clk_ptr, USE_CLOCK: tl.constexpr):
    tl.store(out_ptr + slot, stamp_now(clk_ptr, USE_CLOCK))


@triton.jit(do_not_specialize=["site"])
def _exit_kernel(row_ptr, stamps_ptr, clk_ptr, site, USE_CLOCK: tl.constexpr):
    tl.store(stamps_ptr + 3 * site + 2, stamp_now(clk_ptr, USE_CLOCK))
    # Marks the site exited this step: its wait, NaN since the step began, is 0 until
    # finish_row writes it. A mark per site, not a count, since an async site's exit (on the
    # pacing stream) may run after a later sync site's (on the current one).
    tl.store(row_ptr + 2 + site, 0.0)


@triton.jit
def _hi(a, b):
    return tl.maximum(a, b)


@triton.jit
def _finish_kernel(row_ptr, stamps_ptr, clk_ptr, n_max_sites, BLOCK_M: tl.constexpr):
    # The row of the step from its stamps: the sites exited (marked by their exit kernels;
    # counted up to the last of them), the wait w = exit - entry of each, and the step time,
    # the exit-to-exit interval of site 0 (NaN while unknown). No load waits on another.
    s = tl.arange(0, BLOCK_M)
    ins = s < n_max_sites
    mark = tl.load(row_ptr + 2 + s, mask=ins, other=float("nan"))
    entered = tl.load(stamps_ptr + 3 * s + 1, mask=ins, other=0)
    left = tl.load(stamps_ptr + 3 * s + 2, mask=ins, other=0)
    done = mark == mark
    prev = tl.load(clk_ptr)
    mark0 = tl.load(row_ptr + 2)
    left0 = tl.load(stamps_ptr + 2)
    count = tl.reduce(tl.where(done, s + 1, 0), 0, _hi)
    tl.store(row_ptr, count.to(tl.float32))
    tl.store(row_ptr + 2 + s, (left - entered).to(tl.float32) * 0.001, mask=done)
    if mark0 == mark0:  # site 0 exited
        tl.store(row_ptr + 1, tl.where(prev > 0, (left0 - prev).to(tl.float32) * 0.001,
                                       float("nan")))
        tl.store(clk_ptr, left0)
    else:  # a step without it: the next step's time, from an older exit, spans two: unknown
        tl.store(clk_ptr, 0)


def stamp(out: torch.Tensor, slot: int, clk: torch.Tensor, *, clock: bool | None = None) -> None:
    """Writes the device clock (ns) into `out[slot]` (int64). On the clock-free path the stamp is
    the virtual clock `clk[1]`."""
    if not 0 <= slot < out.numel():
        raise ValueError(f"slot must be in [0, {out.numel()}), got {slot}")
    _stamp_kernel[(1,)](out, int(slot), clk, USE_CLOCK=use_clock(clock), num_warps=1,
                        **COMPILE_OPTIONS)


def exit_stamp(row: torch.Tensor, stamps: torch.Tensor, clk: torch.Tensor, site: int, *,
               clock: bool | None = None) -> None:
    """The post-collective kernel of site `site`: stamps exit and marks the site exited (its
    wait in `row`, NaN at the step's start, becomes 0). `finish_row` turns the step's stamps
    into the row's site count, waits and step time."""
    exit_stamper(row, stamps, clk, clock=clock)(site)


def exit_stamper(row: torch.Tensor, stamps: torch.Tensor, clk: torch.Tensor, *,
                 clock: bool | None = None) -> Callable[[int], None]:
    """`exit_stamp` on these buffers, called with the site: for an engine's hot path, whose
    launches after the first skip the JIT (`launch.Hot`)."""
    m = stamps.shape[0]
    hot = Hot(_exit_kernel, (1,), [row, stamps, clk, 0, use_clock(clock)], free=3,
              meta={"num_warps": 1, **COMPILE_OPTIONS})
    return site_launcher(hot, m)


def finish_row(row: torch.Tensor, stamps: torch.Tensor, clk: torch.Tensor) -> None:
    """Once a step, after its last exit and before the exchange: writes into `row` the site
    count (up to the last site marked exited), the wait of each site exited (w = exit - entry,
    us; the others stay NaN) and, when site 0 was, the step time (us since the exit of site 0
    one step before, NaN for the first), and keeps that exit in `clk[0]`. The row's waits must
    be NaN when the step begins (the update kernel resets them)."""
    row_finisher(row, stamps, clk)()


def row_finisher(row: torch.Tensor, stamps: torch.Tensor, clk: torch.Tensor) -> Hot:
    """`finish_row` on these buffers, called with nothing: for an engine's hot path, whose
    launches after the first skip the JIT (`launch.Hot`)."""
    m = stamps.shape[0]
    if row.numel() != 2 + 2 * m:
        raise ValueError(f"row must hold 2 + 2 x {m} values, got {row.numel()}")
    return Hot(_finish_kernel, (1,), [row, stamps, clk, m, max(16, triton.next_power_of_2(m))],
               free=None, meta={"num_warps": 1, **COMPILE_OPTIONS})
