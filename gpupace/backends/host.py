"""The host backend: `perf_counter_ns` stamps, a sleep-then-spin delay, one all_gather of the
timing rows per step over the process group, and the policy (`gpupace.policy`, its fused kernel
prepared when the engine starts).

It serves CPU process groups (gloo) and GPUs without Triton/CuPy. On one host
`perf_counter_ns` reads CLOCK_MONOTONIC, shared by all processes, which is what lets the tests
check the clock-free estimator against true arrival times. The estimator itself never compares
stamps across ranks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import checkpoint, policy
from ..config import PaceConfig
from ..telemetry import StepRecord, make_record, prepare_record
from ..warn import warn
from . import (
    NO_FORK,
    cuda_device,
    device_backend_blocked,
    exchange_error,
    gather_rows,
    group_backend,
)

log = logging.getLogger(__name__)

# Sleep until this close to the deadline, then spin: on the 2-core VM (2026-11-30, 300 sleeps
# each) time.sleep woke 56 us late at p50 for 0.1 ms, 89 us for 1 ms and 149 us for 5 ms
# (p90 197 us, p99 405 us), so the last 200 us are spun; a rarer later wake overshoots.
SPIN_TAIL_US = 200.0


def sleep_then_spin(delay_us: float) -> float:
    """Waits `delay_us` microseconds and returns the time really waited (us)."""
    start = time.perf_counter_ns()
    if delay_us <= 0:
        return 0.0
    deadline = start + int(delay_us * 1e3)
    if delay_us > SPIN_TAIL_US:
        time.sleep((delay_us - SPIN_TAIL_US) * 1e-6)
    while time.perf_counter_ns() < deadline:
        pass
    return (time.perf_counter_ns() - start) * 1e-3


def ranks_by_count(counts: np.ndarray, most: int = 4) -> str:
    """Which ranks passed how many sites ("1 on ranks 0, 2; 2 on rank 1"), the first `most`
    ranks of each count named."""
    parts = []
    for value in np.unique(counts):
        ranks = np.flatnonzero(counts == value)
        names = ", ".join(map(str, ranks[:most])) + (f" and {len(ranks) - most} more"
                                                      if len(ranks) > most else "")
        parts.append(f"{int(value)} on rank{'s' if len(ranks) > 1 else ''} {names}")
    return "; ".join(parts)


def capture_refused(pg_backend: str, world_size: int) -> str:
    """Why a host-backend pacer cannot run in a CUDA graph, and what to use instead, with why
    that cannot run either on a group of `world_size` ranks on `pg_backend` ("none": none)."""
    why = device_backend_blocked(pg_backend, world_size)
    return ("the host backend times and paces on the host, so a CUDA graph cannot capture it (a "
            "replay would pace nothing, exchange nothing, record nothing): build the Pacer with "
            "backend='device'" + (f", which cannot run here: {why}" if why else ""))


class HostEngine:
    """Times sites on the host clock and runs the policy on the host.

    A site's row entry: w = exit - entry and d = the delay really applied, in us; plus the
    step time, the exit-to-exit interval of site 0. Row layout (float64):
    [n_sites, step_us, w_0..w_{W-1}, d_0..d_{W-1}]. Every rank's all_gather must match, so the
    width W is one all ranks agree on, from the counts they all gathered: `max_sites` on the
    first step, then the largest site count seen (a step without sites changes nothing). A
    job with 3 DDP buckets exchanges 8 values a rank, not 130: at 4096 ranks 256 KB a step,
    not 4.3 MB. A step with more sites than ever before times its first W (the policy goes on
    with the sites it knows); W grows from the next step on.
    A planned delay is applied as a deadline (`policy.deadline_delay`), against the site's
    usual arrival time since the rank left the same site one step before.
    """

    name = "host"

    def __init__(self, config: PaceConfig, group, rank: int, world_size: int):
        self.config = config
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.max_sites = config.max_sites
        # NCCL moves CUDA tensors only: on an NCCL group the rows travel through the GPU (a
        # copy each way; the host backend waits for the step's collectives anyway).
        self._pg_backend = group_backend(group) if dist.is_initialized() else "none"
        nccl = world_size > 1 and self._pg_backend == "nccl"
        self._device = cuda_device(group) if nccl else None
        self._cuda = torch.cuda.is_available()  # then a CUDA graph capture may reach a site
        self.params = policy.PolicyParams.from_config(config, world_size)
        self.state: policy.PolicyState | None = None
        # Per-site state in Python lists, not arrays: a site reads and writes a few of their
        # items, and around a 1 MB gloo all_reduce (its caches cold) a site's arrive and exit
        # took 5.1 and 6.9 us p50 on NumPy scalars against 2.1 and 1.0 us on lists (2-core VM)
        m = self.max_sites
        self._next_delay = [0.0] * m
        self._usual = [math.nan] * m  # mean arrival per site since its last exit
        self._last_exit_ns = [0] * m  # 0: none yet
        self._new_step()
        self._prev_exit0: int | None = None
        self._warned_disagree = False
        self._warned_unfinished = False
        # (work's future, its exit stamp's) of this step's async sites: see end_step
        self._stamping: list[tuple[Any, Any]] = []
        self._set_width(self.max_sites)
        self._width_set = False  # until a step with sites: then the sites it had
        # The fused policy kernel for every size and the record's: compiled or loaded now, not
        # in the step loop (not at all when pacing is off: no update runs, no record is made).
        if config.mode != "off":
            t0 = time.perf_counter()
            policy.prepare_fused()
            prepare_record()
            if time.perf_counter() - t0 > 2.0:
                log.info("gpupace: compiled the policy kernels in %.1f s (once per machine: "
                         "cached on disk)", time.perf_counter() - t0)

    def capture_refused(self) -> str:
        return capture_refused(self._pg_backend, self.world_size)

    def _set_width(self, width: int) -> None:
        """The sites each row carries from now on, and the gather buffers for it."""
        self._width = width
        # One flat buffer, not N tensors stacked after the gather: at 4096 ranks the stack
        # alone cost 1-3 ms a step on the 2-core VM.
        self._gathered = torch.zeros(self.world_size * (2 + 2 * width), dtype=torch.float64,
                                     device=self._device)
        # The row sent, copied in, not a tensor made a step: gloo's thread releases the last
        # one after the step, and one whose Python object has gone takes the GIL to do so,
        # which, as the interpreter exits, aborts the process (1 run in 12 of a 2-rank job
        # once the pacer no longer kept the destroyed group's threads alive: 0 with both).
        self._row = torch.zeros(2 + 2 * width, dtype=torch.float64, device=self._device)

    def _new_step(self) -> None:
        self.generation = getattr(self, "generation", -1) + 1  # exits of an older step are ignored
        self.n_sites = 0
        m = self.max_sites
        self.wait_us, self.delay_us, self._entry_ns = [math.nan] * m, [0.0] * m, [0] * m
        self._exit0: int | None = None

    # -- per site ---------------------------------------------------------------------------
    def arrive(self) -> tuple[int, int]:
        """Stamps arrival, applies this site's delay, stamps entry. Returns the site's ticket
        (step generation, index) that `exit` takes."""
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(self.capture_refused())
        k = self.n_sites
        self.n_sites += 1
        if k < self.max_sites:
            last_exit = self._last_exit_ns[k]  # this site's, one step before
            arrival = (time.perf_counter_ns() - last_exit) * 1e-3 if last_exit else math.nan
            delay, self._usual[k] = policy.deadline_delay(
                self._next_delay[k], arrival, self._usual[k], policy.ARRIVAL_RATE)
            self.delay_us[k] = sleep_then_spin(delay)
            self._entry_ns[k] = time.perf_counter_ns()
        return self.generation, k

    def exit(self, ticket: tuple[int, int]) -> None:
        now = time.perf_counter_ns()
        generation, k = ticket
        if generation != self.generation:  # an async collective that outlived its step
            return
        if k < self.max_sites:
            self.wait_us[k] = (now - self._entry_ns[k]) * 1e-3
            self._last_exit_ns[k] = now
        if k == 0:
            self._exit0 = now

    def issue(self, sync: bool) -> contextlib.AbstractContextManager:
        """The block that arrives and issues a collective: nothing to set up on the host."""
        return NO_FORK

    def leave(self, ticket: tuple[int, int], work=None) -> None:
        """After issuing a collective: stamps its exit now (`work` None: it was synchronous)
        or when its future completes."""
        if work is None:
            self.exit(ticket)
        else:
            done = work.get_future()
            stamped = done.then(lambda _: self.exit(ticket))
            if ticket[1] < self.max_sites:  # bounded (each holds its result) if step() never comes
                self._stamping.append((done, stamped))

    # -- per step ---------------------------------------------------------------------------
    def check_empty_step(self) -> None:
        """Before a step with no paced collective ends, nothing changed yet: a CUDA graph
        capture is refused (one that reached a site was refused there)."""
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(self.capture_refused())

    def end_step(self, step: int, time_s: float) -> StepRecord | None:
        """Exchanges the rows, updates the policy and returns the step's record."""
        self._await_stamps()
        step_us = (self._exit0 - self._prev_exit0) * 1e-3 if (
            self._exit0 is not None and self._prev_exit0 is not None) else np.nan
        if self._exit0 is not None:
            self._prev_exit0 = self._exit0
        n_local = min(self.n_sites, self.max_sites)
        unfinished = sum(math.isnan(w) for w in self.wait_us[:n_local])
        if unfinished and not self._warned_unfinished:
            # Its exit, stamped when its work completes, will be ignored (another step's):
            # the step's row says "unknown", and the site is not paced.
            warn(f"gpupace: {unfinished} of the {n_local} paced collectives of step {step} "
                 "had not completed (or their block failed) when pacer.step() ran, so their "
                 "waits are unknown and they are not paced: wait on async collectives "
                 "(work.wait()) before pacer.step() (a DDP model's backward() waits for its "
                 "own)")
            self._warned_unfinished = True
        width = self._width
        row = np.concatenate([[n_local, step_us], self.wait_us[:width], self.delay_us[:width]])
        try:
            rows = self._exchange(row)
        finally:  # a step cut short (Ctrl-C in the all_gather) leaves no sites to the next
            self._new_step()

        counts = rows[:, 0]
        most = int(counts.max())  # the same on every rank: they all gathered these counts
        if most > 0 and (most > width or not self._width_set):
            self._set_width(most)
            self._width_set = True
        n = int(counts.min())
        if n == 0 or counts.max() != n:
            # Ranks disagree on the sites of this step (or there were none): nothing to
            # compare; no delays until they agree again. The next step's time would run from
            # an exit of this one (or of the step before, with no exit here): unknown instead.
            if counts.max() != n and not self._warned_disagree:
                warn(f"gpupace: ranks passed different numbers of paced sites in step "
                     f"{step} ({ranks_by_count(counts)}); every rank must pace the same "
                     f"collectives in the same order. Until they agree, steps are neither "
                     f"paced nor recorded.")
                self._warned_disagree = True
            self._next_delay = [0.0] * self.max_sites
            self._prev_exit0 = None
            return None
        n = min(n, width)  # sites past the rows' width: timed for nobody this step
        if self.state is None:
            self.state = policy.init_state(self.world_size, n)
        elif n > self.state.shape[1]:  # more sites than ever: the first keep their state
            self.state = policy.resize_state(self.state, n)
        if n != self.state.shape[1]:  # sites past the count forget their deadline's arrival
            m = self.max_sites  # and exit (the kernel's rule: against the widest count)
            self._usual[n:] = [math.nan] * (m - n)
            self._last_exit_ns[n:] = [0] * (m - n)
        w, d, steps = rows[:, 2:2 + n], rows[:, 2 + width:2 + width + n], rows[:, 1]
        # Fewer sites than the state holds: the others keep what they learnt until they come
        # back (a DDP model's first step has one bucket).
        stats = policy.update_leading(self.params, self.state, w, d, steps, rank=self.rank)
        self._next_delay = [*stats.delay[self.rank].tolist(), *[0.0] * (self.max_sites - n)]
        return make_record(step, time_s, stats, steps, self.rank)

    def _await_stamps(self) -> None:
        """Waits for the exit stamps of the step's async collectives that have completed. A
        work's future runs its callbacks on the thread that completes it (gloo's), or at once
        on the thread that adds one to a completed future: when the work completes between
        the exit stamp's `then` and DDP's, gloo's thread holds the stamp (waiting for the GIL)
        while the training thread runs DDP's callback, returns from backward and calls step()
        (one step in ~3000 of the README's loop was unmeasured so). A collective not completed
        is not waited for (the step's warning names it)."""
        for done, stamped in self._stamping:
            if done.done():
                with contextlib.suppress(Exception):  # the stamp itself failed: wait unknown
                    stamped.wait()
        self._stamping.clear()

    def forget_exits(self) -> None:
        """After a pause between steps: the next step's time and its sites' arrivals are
        unknown, not measured across the pause."""
        self._prev_exit0 = None
        self._last_exit_ns = [0] * self.max_sites

    def next_delays(self) -> np.ndarray:
        n = self.state.shape[1] if self.state is not None else 0
        return np.array(self._next_delay[:n], dtype=np.float64)

    def policy_state(self) -> dict[str, np.ndarray] | None:
        """This rank's learnt state, [S] a field (`gpupace.checkpoint`); None before any."""
        if self.state is None:
            return None
        s, r = self.state, self.rank
        return {name: getattr(s, name)[r] if name in checkpoint.PER_RANK else getattr(s, name)
                for name in checkpoint.FIELDS}

    def load_policy_state(self, saved: dict[str, np.ndarray] | None) -> None:
        """Takes over a saved state (`checkpoint.unpack`: [N, S] and [S] fields; None: none),
        with its step count at 0, so that the warm-up runs again, and no delay planned."""
        self.state = None
        self._next_delay = [0.0] * self.max_sites
        if saved is None:
            return
        state = policy.init_state(self.world_size, saved["floor"].shape[1])
        for name in checkpoint.LOADED:
            getattr(state, name)[...] = saved[name]
        self.state = state

    def _exchange(self, row: np.ndarray) -> np.ndarray:
        if self.world_size == 1:
            return row[None, :]
        try:
            self._row.copy_(torch.from_numpy(row))
            gather_rows(self._gathered, self._row, group=self.group)
        except RuntimeError as e:
            raise exchange_error(e) from e
        # [N, 2 + 2 W], overwritten by the next step's exchange (gloo takes a flat buffer)
        return self._gathered.cpu().numpy().reshape(self.world_size, -1)
