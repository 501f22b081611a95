"""The device clock: `%globaltimer` read through inline PTX, and the measured timer tick.

`now` is the one place any kernel reads time. Its `USE_CLOCK` constexpr switch gives the Triton
interpreter (TRITON_INTERPRET=1, which cannot run inline asm) a clock-free path: time is then a
virtual counter that advances by `fake_tick` nanoseconds per read, so every other line of every
kernel runs in CPU tests with deterministic times. Launchers pick the path with `use_clock()`.

`%globaltimer` counts nanoseconds but its resolution is coarser on many GPUs (it has been
reported to step by 32 ns up to 1 us); `measure_tick` measures it on the device rather than
assuming 1 ns. On an H200: 32 ns (every device check of 2026-11-30).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch
import triton
import triton.language as tl

from .launch import COMPILE_OPTIONS


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
def sleep_ns(ns, USE_CLOCK: tl.constexpr):
    """Suspends the warp for about `ns` ns (PTX `nanosleep`, sm_70 on: anywhere from 0 to 2x
    `ns`, at most 1 ms), so a spin need not issue a clock read every few cycles; nothing on the
    clock-free path. Returns 0."""
    if USE_CLOCK:
        z = tl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.u32 $0, 0;", "=r,r", [ns],
                                      dtype=tl.int32, is_pure=False, pack=1)
    else:
        z = ns * 0
    return z


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
    with on_device(out.device):
        _clock_kernel[(1,)](out, out.numel(), fake_tick, USE_CLOCK=use_clock(clock), num_warps=1,
                            **COMPILE_OPTIONS)
    return out


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """`device` current while a diagnostic launches on it: Triton launches on the current CUDA
    device, whatever device the buffers are on (cuda:1's, launched on cuda:0, are an illegal
    address)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


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


# -- do the SMs agree on the time? --------------------------------------------------------------
# The estimator subtracts stamps of one rank taken by different kernels, which may run on
# different SMs; the virtual cluster's ground truth compares stamps across SMs. Both assume the
# SMs read one `%globaltimer`. (The virtual cluster's estimate once exceeded its exact-stamp
# bound by 0.25-0.32 us on the H200: most likely float64 rounding of the stamps on the host,
# since fixed, but SMs that disagree would do the same.) `sm_offsets` measures it: program 0
# pings each other program and it answers with its clock.


@triton.jit
def sm_id(fallback, USE_CLOCK: tl.constexpr):
    """The SM this program runs on (`%smid`); `fallback` on the clock-free path."""
    if USE_CLOCK:
        s = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                      is_pure=False, pack=1)
    else:
        s = fallback
    return s


@triton.jit
def _offsets_kernel(flags_ptr, out_ptr, sm_ptr, rounds, max_polls, fake_tick,
                    USE_CLOCK: tl.constexpr):
    # flags int64 [P, rounds, 2] (ping, answer; 0: not yet), out int64 [P, rounds, 3] (program
    # 0's clock at the ping, the other's on seeing it, program 0's on the answer), sm int32 [P].
    # Every poll is bounded by max_polls: a program that is not resident is never waited for.
    pid = tl.program_id(0)
    tl.store(sm_ptr + pid, sm_id(pid * 0 - 1, USE_CLOCK))
    t = tl.load(out_ptr) * 0  # the clock-free path's start
    if pid == 0:
        for i in range(1, tl.num_programs(0)):
            alive = 1  # a program that missed one round is not pinged again
            for r in range(rounds):
                if alive != 0:
                    slot = (i * rounds + r) * 2
                    t = now(t, fake_tick, USE_CLOCK)
                    t_ping = t
                    tl.atomic_xchg(flags_ptr + slot, 1)
                    got = tl.atomic_add(flags_ptr + slot + 1, 0)
                    k = 0
                    while (got == 0) & (k < max_polls):
                        got = tl.atomic_add(flags_ptr + slot + 1, 0)
                        k += 1
                    t = now(t, fake_tick, USE_CLOCK)
                    tl.store(out_ptr + (i * rounds + r) * 3, t_ping)
                    tl.store(out_ptr + (i * rounds + r) * 3 + 1, got)
                    tl.store(out_ptr + (i * rounds + r) * 3 + 2, t)
                    alive = (got != 0).to(tl.int32)
    else:
        for r in range(rounds):
            slot = (pid * rounds + r) * 2
            seen = tl.atomic_add(flags_ptr + slot, 0)
            k = 0
            while (seen == 0) & (k < max_polls):
                seen = tl.atomic_add(flags_ptr + slot, 0)
                k += 1
            t = now(t, fake_tick, USE_CLOCK)
            if seen != 0:
                tl.atomic_xchg(flags_ptr + slot + 1, t)


def offsets_from(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per program (row 0, the reference, included): its clock's offset from program 0's (ns)
    and the round trip it was measured over (ns), from `out` [P, rounds, 3], taking each
    program's round of least round trip: offset = answer - (ping + back) / 2, off by at most
    half that round trip. NaN where no round was answered."""
    out = np.asarray(out, dtype=np.int64)
    ping, answer, back = out[..., 0], out[..., 1], out[..., 2]
    # Differences in int64 first: the clock counts ns since 1970 (~1.8e18), where a float64
    # holds only multiples of 256 ns.
    there, trip = (answer - ping).astype(np.float64), (back - ping).astype(np.float64)
    rtt = np.where(answer != 0, trip, np.inf)
    best = rtt.argmin(axis=1)
    rows = np.arange(out.shape[0])
    offset = there[rows, best] - trip[rows, best] / 2
    trip = rtt[rows, best]
    offset[~np.isfinite(trip)], trip[~np.isfinite(trip)] = np.nan, np.nan
    offset[0], trip[0] = 0.0, 0.0
    return offset, trip


MAX_PROGRAMS = 1024


def sm_offsets(programs: int | None = None, rounds: int = 16, max_polls: int = 200_000, *,
               device: str | torch.device = "cuda", clock: bool | None = None,
               fake_tick: int = 1) -> dict[str, np.ndarray]:
    """Each of `programs` one-warp programs' clock offset from program 0's (ns), measured by
    ping and answer over memory; by default as many programs as SMs (the scheduler places
    them: `sm` says where each ran). Returns arrays by name: `sm`, `offset_ns`,
    `round_trip_ns` (the offset's error is at most half of it). A program that is not running
    when pinged costs at most `max_polls` polls once (~0.1 s), then is skipped. Synchronises:
    a diagnostic for the device check, not for a training loop."""
    dev = torch.device(device)
    if programs is None:
        programs = torch.cuda.get_device_properties(dev).multi_processor_count
    if not 2 <= programs <= MAX_PROGRAMS or rounds < 1 or max_polls < 1:
        raise ValueError(f"need 2 <= programs <= {MAX_PROGRAMS}, rounds >= 1, max_polls >= 1; "
                         f"got {programs}, {rounds}, {max_polls}")
    flags = torch.zeros(programs, rounds, 2, dtype=torch.int64, device=dev)
    out = torch.zeros(programs, rounds, 3, dtype=torch.int64, device=dev)
    sm = torch.zeros(programs, dtype=torch.int32, device=dev)
    with on_device(dev):
        _offsets_kernel[(programs,)](flags, out, sm, rounds, max_polls, fake_tick,
                                     USE_CLOCK=use_clock(clock), num_warps=1, **COMPILE_OPTIONS)
    offset, trip = offsets_from(out.cpu().numpy())
    return {"sm": sm.cpu().numpy(), "offset_ns": offset, "round_trip_ns": trip}
