"""The device clock: `%globaltimer` read through inline PTX, and the measured timer tick.

`now` is the one place any kernel reads time. Its `USE_CLOCK` constexpr switch gives the Triton
interpreter (TRITON_INTERPRET=1, which cannot run inline asm) a clock-free path: time is then a
virtual counter that advances by `fake_tick` nanoseconds per read, so every other line of every
kernel runs in CPU tests with deterministic times. Launchers pick the path with `use_clock()`.

`%globaltimer` counts nanoseconds but its resolution is coarser on many GPUs (it has been
reported to step by 32 ns up to 1 us); `measure_tick` measures it on the device rather than
assuming 1 ns. Not yet measured on a GPU in this repository.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older ones read the env var
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_clock(clock: bool | None = None) -> bool:
    """Whether launches read `%globaltimer`: never under the interpreter; else `clock`, default on."""
    if interpreting():
        return False
    return True if clock is None else bool(clock)


@triton.jit
def now(prev, fake_tick, USE_CLOCK: tl.constexpr):
    """Nanoseconds on the device clock; on the clock-free path, `prev + fake_tick`."""
    if USE_CLOCK:
        t = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
    else:
        t = prev + fake_tick
    return t


@triton.jit
def stamp_now(clk_ptr, USE_CLOCK: tl.constexpr):
    """A stamp: the device clock, or on the clock-free path the virtual clock `clk[1]` (no
    load at all on the clock path)."""
    if USE_CLOCK:
        t = now(0, 0, USE_CLOCK)
    else:
        t = tl.load(clk_ptr + 1)
    return t


@triton.jit
def _clock_kernel(out_ptr, n_reads, fake_tick, USE_CLOCK: tl.constexpr):
    # Reads the clock n_reads times back to back; consecutive distinct values give the tick.
    t = tl.load(out_ptr)
    for i in range(n_reads):
        t = now(t, fake_tick, USE_CLOCK)
        tl.store(out_ptr + i, t)


def read_clock(out: torch.Tensor, *, clock: bool | None = None, fake_tick: int = 1) -> torch.Tensor:
    """Fills the int64 buffer `out` with back-to-back clock reads (one program, one warp).
    On the clock-free path `out[0]` holds the start time and reads advance by `fake_tick`."""
    if out.dtype != torch.int64 or out.dim() != 1 or out.numel() < 1:
        raise ValueError(f"out must be a 1-d int64 tensor, got {out.dtype} of shape {tuple(out.shape)}")
    _clock_kernel[(1,)](out, out.numel(), fake_tick, USE_CLOCK=use_clock(clock), num_warps=1)
    return out


def tick_from_reads(reads: np.ndarray) -> float:
    """The timer's tick (ns) from back-to-back reads: the smallest positive step between
    consecutive reads (the counter moves by whole ticks, and a loop slower than one tick shows
    multiples of it, never less). NaN when the clock never moved."""
    steps = np.diff(np.asarray(reads, dtype=np.int64))
    steps = steps[steps > 0]
    return float(steps.min()) if steps.size else float("nan")


def measure_tick(device: str | torch.device = "cuda", n_reads: int = 4096) -> float:
    """Measures the `%globaltimer` tick (ns) on a CUDA device. Synchronises: call it outside
    any training loop (doctor, device check)."""
    out = torch.zeros(n_reads, dtype=torch.int64, device=device)
    read_clock(out, clock=True)
    return tick_from_reads(out.cpu().numpy())
