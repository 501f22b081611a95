"""Timestamps: a plain stamp into a slot of a device buffer, and the fused exit stamp that
closes a paced collective (its wait, the step time at site 0, the site count).

Buffer layouts are those of `spin.py`. The exit kernel is the second of the two tiny kernels a
paced collective adds (the first is `spin.enter`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .clock import stamp_now, use_clock
from .launch import Hot


@triton.jit(do_not_specialize=["slot"])
def _stamp_kernel(out_ptr, slot, clk_ptr, USE_CLOCK: tl.constexpr):
    tl.store(out_ptr + slot, stamp_now(clk_ptr, USE_CLOCK))


@triton.jit(do_not_specialize=["site"])
def _exit_kernel(row_ptr, stamps_ptr, clk_ptr, site, USE_CLOCK: tl.constexpr):
    t = stamp_now(clk_ptr, USE_CLOCK)
    entered = tl.load(stamps_ptr + 3 * site + 1)
    tl.store(stamps_ptr + 3 * site + 2, t)
    tl.store(row_ptr + 2 + site, (t - entered).to(tl.float32) * 0.001)  # w = exit - entry
    tl.store(row_ptr, (site + 1).to(tl.float32))  # sites run in order: the last exit counts them
    if site == 0:  # step time: exit-to-exit interval of the first site, NaN while unknown
        prev = tl.load(clk_ptr)
        step = tl.where(prev > 0, (t - prev).to(tl.float32) * 0.001, float("nan"))
        tl.store(row_ptr + 1, step)
        tl.store(clk_ptr, t)


def stamp(out: torch.Tensor, slot: int, clk: torch.Tensor, *, clock: bool | None = None) -> None:
    """Writes the device clock (ns) into `out[slot]` (int64). On the clock-free path the stamp is
    the virtual clock `clk[1]`."""
    if not 0 <= slot < out.numel():
        raise ValueError(f"slot must be in [0, {out.numel()}), got {slot}")
    _stamp_kernel[(1,)](out, int(slot), clk, USE_CLOCK=use_clock(clock), num_warps=1)


def exit_stamp(row: torch.Tensor, stamps: torch.Tensor, clk: torch.Tensor, site: int, *,
               clock: bool | None = None) -> None:
    """The fused post-collective kernel of site `site`: stamps exit, writes w = exit - entry
    (us) into `row`, sets the row's site count to site + 1 and, at site 0, the step time."""
    exit_stamper(row, stamps, clk, clock=clock)(site)


def exit_stamper(row: torch.Tensor, stamps: torch.Tensor, clk: torch.Tensor, *,
                 clock: bool | None = None) -> Callable[[int], None]:
    """`exit_stamp` on these buffers, called with the site: for an engine's hot path, whose
    launches after the first skip the JIT (`launch.Hot`)."""
    m = stamps.shape[0]
    hot = Hot(_exit_kernel, (1,), [row, stamps, clk, 0, use_clock(clock)], free=3,
              meta={"num_warps": 1})

    def launch(site: int) -> None:
        if not 0 <= site < m:
            raise ValueError(f"site must be in [0, {m}), got {site}")
        hot(int(site))

    launch.hot = hot  # type: ignore[attr-defined]  # the GPU tests read hot.direct
    return launch
