"""The spin-wait: alone, fused with the arrive and enter stamps, and from a common start as the
virtual cluster's compute stand-in (`skew_spin`).

One program, one warp (`num_warps=1`): a paced rank delays by keeping one warp busy instead of
the many CTAs an NCCL kernel would spin on (the coupling pacing works through: README,
"What if the job ran on 512 GPUs").
Every launch reads its delay from device memory, so the delay changes between CUDA-graph
replays with no host work. Whatever the buffer holds (NaN, negative, huge), the delay is clamped
inside the kernel to [0, min(cap_us, HARD_CAP_US)], and the loop also stops after a bounded
number of clock reads and if the clock runs backwards: it cannot spin forever. The kernel
writes the delay it really applied, measured on the device clock.

Buffers, shared with `stamp.py` and the device engine:
  row     float32 [2 + 2M]: n_sites, step_us, w_0..w_{M-1}, d_0..d_{M-1} (the host's layout);
          a wait is NaN from the step's start, 0 once its site's exit is stamped, the wait
          once `stamp.finish_row` has run
  stamps  int64 [M, 3]: arrive, enter, exit of each site, device clock (ns)
  clk     int64 [2]: exit of site 0 at the previous step (0: none), the virtual clock
          (clock-free path only)
  usual   float32 [M]: each site's running mean arrival since the site's exit one step
          before (us; NaN: none yet), against which a planned delay is applied as a deadline
Spin precision on an H200 (the tight loop; bench/results and their history, 2026-11-30): error
p99 1.01 us by CUDA events in the last device check (code of 975f711), 0.85 and 1.02 us in the
two before it (87d4952, b35f25f), against the target of one timer tick (32 ns) + 1 us; within
24 ns by the spin's own clock. The sleeping spin
(`backoff_ns`): not yet measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from gpupace.policy import ARRIVAL_RATE

from .clock import now, sleep_ns, stamp_now, use_clock
from .launch import COMPILE_OPTIONS, Hot, site_launcher

# A delay above 1 s per collective is a broken buffer, not pacing: the device never spins longer
# than this, whatever its delay buffer holds (PaceConfig's max_delay_us stops there too).
HARD_CAP_US = 1_000_000.0
# One clock read and compare takes far more than 2 ns, so cap / 2 ns reads cover any real
# delay; the bound matters only when the clock is stuck.
MIN_READ_NS = 2
HARD_MAX_READS = int(HARD_CAP_US * 1000) // MIN_READ_NS
MAX_BACKOFF_NS = 1_000_000  # PTX nanosleep's bound


@triton.jit
def spin_for(delay_us, cap_us, max_reads, t0, fake_tick, USE_CLOCK: tl.constexpr,
             HARD_CAP: tl.constexpr, HARD_READS: tl.constexpr, BACKOFF: tl.constexpr = 0):
    """Spins from clock time `t0` for the clamped delay; returns (end time, clock reads).
    BACKOFF > 0: sleeps about BACKOFF ns between clock reads while more than twice that
    remains (a sleep lasts up to twice its request), so the spin ends as precisely."""
    cap = tl.where(cap_us == cap_us, cap_us, 0.0)  # NaN cap: no delay
    cap = tl.minimum(tl.maximum(cap, 0.0), HARD_CAP)
    d = tl.where(delay_us == delay_us, delay_us, 0.0)  # NaN delay: none
    d = tl.minimum(tl.maximum(d, 0.0), cap)
    target = t0 + (d * 1000.0).to(tl.int64)
    reads = tl.minimum(tl.maximum(max_reads, 0), HARD_READS)
    t = t0
    i = 0
    while (t < target) & (i < reads) & (t >= t0):
        if BACKOFF > 0:
            if target - t > 2 * BACKOFF:
                sleep_ns(BACKOFF, USE_CLOCK)
        t = now(t, fake_tick, USE_CLOCK)
        i += 1
    return t, i


@triton.jit
def _spin_kernel(delay_ptr, applied_ptr, reads_ptr, clk_ptr, cap_us, max_reads, fake_tick,
                 USE_CLOCK: tl.constexpr, HARD_CAP: tl.constexpr, HARD_READS: tl.constexpr,
                 BACKOFF: tl.constexpr = 0):
    t0 = stamp_now(clk_ptr, USE_CLOCK)
    t, i = spin_for(tl.load(delay_ptr), cap_us, max_reads, t0, fake_tick, USE_CLOCK,
                    HARD_CAP, HARD_READS, BACKOFF)
    tl.store(applied_ptr, ((t - t0).to(tl.float32)) * 0.001)
    tl.store(reads_ptr, i)
    if not USE_CLOCK:
        tl.store(clk_ptr + 1, t)


@triton.jit
def _skew_kernel(skew_ptr, start_ptr, applied_ptr, reads_ptr, clk_ptr, cap_us, max_reads,
                 fake_tick, USE_CLOCK: tl.constexpr, HARD_CAP: tl.constexpr,
                 HARD_READS: tl.constexpr):
    # Spins until the common start + this rank's skew: the start is the clock of the first
    # rank whose kernel began (an atomic min returns what an earlier one left), so the order
    # and pace of the host's launches add nothing to the skew.
    t0 = stamp_now(clk_ptr, USE_CLOCK)
    start = tl.minimum(tl.atomic_min(start_ptr, t0), t0)
    late_us = (t0 - start).to(tl.float32) * 0.001
    t, i = spin_for(tl.load(skew_ptr) - late_us, cap_us, max_reads, t0, fake_tick, USE_CLOCK,
                    HARD_CAP, HARD_READS)
    tl.store(applied_ptr, ((t - t0).to(tl.float32)) * 0.001)
    tl.store(reads_ptr, i)
    if not USE_CLOCK:
        tl.store(clk_ptr + 1, t)


@triton.jit(do_not_specialize=["site", "delay_offset"])
def _enter_kernel(delay_ptr, usual_ptr, row_ptr, stamps_ptr, clk_ptr, site, delay_offset,
                  n_max_sites, cap_us, rate, max_reads, fake_tick, USE_CLOCK: tl.constexpr,
                  HARD_CAP: tl.constexpr, HARD_READS: tl.constexpr):
    # arrive stamp -> spin(delay[site], as a deadline) -> enter stamp, applied delay into the row.
    t0 = stamp_now(clk_ptr, USE_CLOCK)
    # The deadline rule of gpupace.policy.deadline_delay: the planned delay less how much
    # later than usual this rank arrived, timed from its exit of this site one step before.
    ref = tl.load(stamps_ptr + 3 * site + 2)
    usual = tl.load(usual_ptr + site)
    arrival = (t0 - ref).to(tl.float32) * 0.001
    known = ref != 0
    seen = usual == usual  # NaN until the first sample
    late = tl.where(known & seen, arrival - usual, 0.0)
    delay = tl.load(delay_ptr + delay_offset + site) - tl.maximum(late, 0.0)
    learn = tl.where(usual > 0.0, tl.minimum(late, usual), late)  # by at most the mean itself
    tl.store(usual_ptr + site, tl.where(known, tl.where(seen, usual + rate * learn, arrival), usual))
    t, i = spin_for(delay, cap_us, max_reads, t0, fake_tick, USE_CLOCK, HARD_CAP, HARD_READS)
    tl.store(stamps_ptr + 3 * site, t0)
    tl.store(stamps_ptr + 3 * site + 1, t)
    tl.store(row_ptr + 2 + n_max_sites + site, ((t - t0).to(tl.float32)) * 0.001)
    if not USE_CLOCK:
        tl.store(clk_ptr + 1, t)


def max_reads_for(cap_us: float) -> int:
    """The clock-read bound the launchers pass for a cap: enough for any real delay."""
    cap = min(max(float(cap_us), 0.0), HARD_CAP_US) if cap_us == cap_us else 0.0
    return int(cap * 1000) // MIN_READ_NS + 1000


def spin(delay: torch.Tensor, applied: torch.Tensor, reads: torch.Tensor, clk: torch.Tensor, *,
         cap_us: float, max_reads: int | None = None, clock: bool | None = None,
         fake_tick: int = 1000, backoff_ns: int = 0) -> None:
    """Spins for `delay[0]` us (float32, device memory), clamped to [0, min(cap_us, 1 s)];
    writes the applied delay (us) to `applied[0]` and the clock reads to `reads[0]` (int32).
    `clk` is the engine's int64 [2] clock buffer (the virtual clock on the clock-free path).
    `backoff_ns` > 0 sleeps that long between clock reads while more than twice it remains:
    whether that takes less from concurrent compute than a tight loop, at the same precision,
    is the device check's question (`vcluster.spin_coupling`); not yet measured on a GPU,
    so the engine's spins do not use it."""
    n = max_reads_for(cap_us) if max_reads is None else int(max_reads)
    if isinstance(backoff_ns, bool) or not isinstance(backoff_ns, int) \
            or not 0 <= backoff_ns <= MAX_BACKOFF_NS:
        raise ValueError(f"backoff_ns must be an integer in [0, {MAX_BACKOFF_NS}], "
                         f"got {backoff_ns!r}")
    _spin_kernel[(1,)](delay, applied, reads, clk, float(cap_us), n, int(fake_tick),
                       USE_CLOCK=use_clock(clock), HARD_CAP=HARD_CAP_US, HARD_READS=HARD_MAX_READS,
                       BACKOFF=int(backoff_ns), num_warps=1, **COMPILE_OPTIONS)


def skew_spin(skew: torch.Tensor, start: torch.Tensor, applied: torch.Tensor,
              reads: torch.Tensor, clk: torch.Tensor, *, cap_us: float,
              max_reads: int | None = None, clock: bool | None = None,
              fake_tick: int = 1000) -> None:
    """A virtual-cluster rank's compute stand-in (`gpupace.vcluster`): spins until the common
    start + `skew[0]` us, the start being the earliest clock at which any rank's call on the
    same `start` (int64 [1], INT64_MAX before the first) began. Launched rank by rank on an idle
    GPU, a plain spin starts each rank when the host's launch reaches it, tens of us apart: most
    likely why 8 ranks showed ~300 us more arrival spread than their skews held (724 us p50
    against 420 + noise, H200, 2026-11-30). A rank that starts past its deadline does not spin.
    Writes the applied spin (us) and the clock reads."""
    n = max_reads_for(cap_us) if max_reads is None else int(max_reads)
    if start.dtype != torch.int64 or start.numel() != 1:
        raise ValueError(f"start must be one int64 value, got {start.dtype} of shape "
                         f"{tuple(start.shape)}")
    _skew_kernel[(1,)](skew, start, applied, reads, clk, float(cap_us), n, int(fake_tick),
                       USE_CLOCK=use_clock(clock), HARD_CAP=HARD_CAP_US, HARD_READS=HARD_MAX_READS,
                       num_warps=1, **COMPILE_OPTIONS)


def enter(delay: torch.Tensor, usual: torch.Tensor, row: torch.Tensor, stamps: torch.Tensor,
          clk: torch.Tensor, site: int, *, delay_offset: int = 0, cap_us: float,
          rate: float = ARRIVAL_RATE, max_reads: int | None = None, clock: bool | None = None,
          fake_tick: int = 1000) -> None:
    """The fused pre-collective kernel of site `site`: stamps arrival, spins for
    `delay.flat[delay_offset + site]` (float32 us; the virtual cluster passes its whole delay
    matrix and a rank's offset, so the pointer's alignment, which Triton specialises on, never
    changes) applied as a deadline against `usual[site]` (float32 [M], NaN at first: the running
    mean arrival since the site's exit one step before, updated at `rate`), stamps entry and
    writes the applied delay into `row`. See the module docstring for the buffers."""
    enterer(delay, usual, row, stamps, clk, delay_offset=delay_offset, cap_us=cap_us, rate=rate,
            max_reads=max_reads, clock=clock, fake_tick=fake_tick)(site)


def enterer(delay: torch.Tensor, usual: torch.Tensor, row: torch.Tensor, stamps: torch.Tensor,
            clk: torch.Tensor, *, delay_offset: int = 0, cap_us: float,
            rate: float = ARRIVAL_RATE, max_reads: int | None = None, clock: bool | None = None,
            fake_tick: int = 1000) -> Callable[[int], None]:
    """`enter` on these buffers, called with the site: for an engine's hot path, whose launches
    after the first skip the JIT (`launch.Hot`)."""
    if usual.numel() != stamps.shape[0]:
        raise ValueError(f"usual must hold one value per site ({stamps.shape[0]}), got {usual.numel()}")
    m = stamps.shape[0]
    n = max_reads_for(cap_us) if max_reads is None else int(max_reads)
    if not (0 <= delay_offset and delay_offset + m <= delay.numel()):
        raise ValueError(f"delay_offset + {m} sites must fit in delay ({delay.numel()}), got "
                         f"delay_offset {delay_offset}")
    hot = Hot(_enter_kernel, (1,),
              [delay, usual, row, stamps, clk, 0, int(delay_offset), m, float(cap_us),
               float(rate), n, int(fake_tick), use_clock(clock), HARD_CAP_US, HARD_MAX_READS],
              free=5, meta={"num_warps": 1, **COMPILE_OPTIONS})
    return site_launcher(hot, m)
