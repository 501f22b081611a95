"""The device backend: the whole measure -> decide -> delay loop on the GPU, with no host sync.

Per paced collective: `kernels.spin.enter` (arrive stamp, spin for this rank's delay, enter
stamp) -> the collective -> `kernels.stamp.exit_stamp` (exit stamp, site count); an async
collective's on the engine's pacing stream, forked from the stream that issues it (`issue`), so
that the spin delays the collective and not the compute queued after it. Once per step: the
row from the stamps (`kernels.stamp.finish_row`: waits, step time) -> one all_gather of the
rows -> the CuPy reduction -> the fused Triton update (floors, hysteresis, next delays,
telemetry ring, step counter). Everything lives in buffers made in the
constructor, so a paced step can be captured in a CUDA graph after `warmup()`; replays then
adapt the delays with no host involvement.

Telemetry reaches the host lazily: every `COPY_EVERY` steps the ring is copied to pinned memory
with a non-blocking copy, and parsed once its event has completed, so `end_step` returns the
records of earlier steps, one per call (a few steps late). In eager mode only the slots written
since the last copy are copied (the host counts the steps); once a step has been captured,
replays move the device's step counter unseen and each copy takes the whole ring (16.8 MB at
4096 ranks). In graph mode call `drain()` outside the replay loop (it synchronises) at least
every `ring_len` replays, or records are lost.
CUDA events time the compute and collective phases in eager mode (`phase_times()`). With
`GPUPACE_TAIL_GRAPH=1` eager steps replay their reduction and update from a CUDA graph
(`backends/tail.py`; opt-in until measured on a GPU).

Limits, bluntly: sites are matched by order, and a captured graph fixes the site count; on
an H200 (the last device check, code of 975f711) a paced collective added 3.1 us in a CUDA
graph at 8 a step and 11.4 us at one (target 3 us), and 72 us eager at 8 a step, 184 us at one
(target 15 us: host launch time; the last three checks of that evening: 54-72 and 155-184 us;
README). This code has changed since: not yet measured on a GPU. On a CPU device the engine runs
only under TRITON_INTERPRET=1, with the clock-free kernel path and the NumPy twin of the
reduction: that is for tests.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import checkpoint, policy
from ..config import PaceConfig
from ..telemetry import StepRecord
from ..warn import warn
from . import (
    NO_FORK,
    blocking_wait_note,
    cuda_device,
    device_backend_missing,
    exchange_error,
    gather_rows,
    off_current_device,
    too_many_ranks,
)
from .tail import TailGraphs, tail_graph_wanted

COPY_EVERY = 8  # steps between non-blocking copies of the telemetry ring
# Eager phase timing records two CUDA events per site, a few us of host time each: sample one
# step in PHASE_EVERY so that the average cost per paced collective stays small.
PHASE_EVERY = 8


class WarmupError(RuntimeError):
    """A CUDA graph capture started before `warmup()`."""


def ring_slots(start: int, end: int, ring_len: int) -> list[tuple[int, int]]:
    """The ring slots [lo, hi) that steps start..end-1 wrote (slot = step % ring_len), at most
    two ranges; only the last ring_len steps when more have passed (the older ones are
    overwritten)."""
    start = max(start, end - ring_len)
    if start >= end:
        return []
    lo, hi = start % ring_len, (end - 1) % ring_len + 1
    return [(lo, hi)] if lo < hi else [(lo, ring_len), (0, hi)]


def join_action(fork: tuple[int, bool] | None, capturing: bool, generation: int) -> str:
    """What `_join` does with the pacing stream's fork, (step generation, captured) or None:
    "join" it (same capture state), "drop" it (none, or one left over from an earlier step in
    the other state) or "refuse" it (this step's, in the other capture state)."""
    if fork is None:
        return "drop"
    forked_at, captured = fork
    if captured == capturing:
        return "join"
    return "refuse" if forked_at == generation else "drop"


class DeviceEngine:
    """Times sites, applies delays and runs the policy on the device. Same interface as
    `HostEngine`, plus `warmup()`, `drain()` and `phase_times()`."""

    name = "device"

    def __init__(self, config: PaceConfig, group, rank: int, world_size: int, *,
                 device: torch.device | str | None = None, ring_len: int = 256):
        if device is not None:
            dev = torch.device(device)
            if dev.type == "cuda" and dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
            where = "the device given is"
        elif torch.cuda.is_available():
            dev = cuda_device(group)
            where = "the process group runs on"
        else:
            dev = torch.device("cpu")
        if dev.type == "cuda" and (off := off_current_device(dev, where)):
            raise ValueError(off)
        from gpupace.kernels import clock, launch, reduce, spin, stamp, update  # triton from here

        self._k_spin, self._k_stamp, self._k_update, self._k_reduce = spin, stamp, update, reduce
        self._k_launch = launch
        if dev.type == "cuda":
            why = device_backend_missing()
            if why:
                raise RuntimeError(f"the device backend cannot run here: {why}")
        elif not clock.interpreting():
            raise RuntimeError("the device backend runs on a CPU device only under "
                               "TRITON_INTERPRET=1 (for tests); use backend='host'")
        if too_many := too_many_ranks(world_size):
            raise ValueError(f"gpupace: {too_many}")
        self.config, self.group, self.rank, self.world_size = config, group, rank, world_size
        self.device = dev
        self._cuda = dev.type == "cuda"
        paces = self._cuda and world_size > 1 and config.mode != "off"
        blocking = blocking_wait_note() if paces else None
        if blocking:
            warn(blocking)
        self._pace_stream = torch.cuda.Stream(dev) if self._cuda else None
        # The fork's and the join's events, recorded anew at each use (Stream.wait_stream
        # would make an event each time): a wait takes the record made just before it.
        self._fork_event = torch.cuda.Event() if self._cuda else None
        self._join_event = torch.cuda.Event() if self._cuda else None
        self._fork: tuple[int, bool] | None = None  # (step generation, captured) of a fork
        self.max_sites = m = config.max_sites
        self.params = policy.PolicyParams.from_config(config, world_size)
        self.cap_us = float(config.max_delay_us)
        self._max_reads = spin.max_reads_for(self.cap_us)
        n, r = world_size, 2 + 2 * m
        f32, i64 = torch.float32, torch.int64
        z = dict(device=dev)
        self.row = torch.empty(r, dtype=f32, **z)
        self._reset_row()
        self.gathered = torch.zeros(n, r, dtype=f32, **z)
        self.clk = torch.zeros(2, dtype=i64, **z)
        self.red = reduce.outputs(n, m, dev)
        # this rank's alone, as the host engine's
        self.state = update.new_state(1, m, dev, world_size=n)
        # the sites' kernels' buffers, views of the state's (the update resets sites that went)
        self.stamps, self.usual = self.state["stamps"][0], self.state["usual"][0]
        self.ring_len = max(int(ring_len), 2 * COPY_EVERY)
        self.ring = torch.full((self.ring_len, update.record_len(n, m)), float("nan"), dtype=f32, **z)
        self.ring_step = torch.full((self.ring_len,), -1, dtype=i64, **z)
        # On the CPU whatever torch's default device is (set_default_device("cuda") is common)
        host = dict(device="cpu", pin_memory=dev.type == "cuda")
        self._host_ring = torch.empty(self.ring.shape, dtype=f32, **host)
        # -1: a slot no copy has reached yet, which `_parse` skips (eager copies are partial)
        self._host_ring_step = torch.full(self.ring_step.shape, -1, dtype=i64, **host)
        self._copied = 0  # eager steps whose ring slots have been copied (or are on their way)
        self._captured = False  # a step was captured: graph replays move the counter unseen
        self._copy_event: Any = None
        self._copy_pending = False
        self._cupy_views: dict[str, Any] | None = None
        self._warm = False
        self._exited = False  # an exit kernel has run (and so is compiled)
        self._calls = 0  # end_step calls, the device counter's value in eager mode
        self._times: deque[tuple[int, int, float]] = deque(maxlen=4 * self.ring_len)
        self._last_seen = -1
        self._warned_disagree = False
        self._records: deque[StepRecord] = deque()
        self._phases: deque[dict[str, float]] = deque(maxlen=self.ring_len)
        self._pending_phases: deque[tuple[int, list]] = deque()
        self._step_events: list = []
        self._prev_end_event: Any = None
        self.generation = -1
        # The hot path's launchers, bound to the buffers above: after their first call they
        # skip Triton's JIT (kernels/launch.py).
        self._enter = spin.enterer(self.state["delay"], self.usual, self.row, self.stamps,
                                   self.clk, cap_us=self.cap_us, max_reads=self._max_reads)
        self._exit = stamp.exit_stamper(self.row, self.stamps, self.clk)
        self._finish = stamp.row_finisher(self.row, self.stamps, self.clk)
        self._update = update.updater(self.gathered, self.row, self.red, self.state, self.ring,
                                      self.ring_step, self.params, rank=rank)
        self._tail: TailGraphs | None = None
        self.use_tail_graphs(tail_graph_wanted())
        self._new_step()

    def use_tail_graphs(self, on: bool) -> None:
        """Eager steps replay their reduction and update from a CUDA graph captured once per
        site count (`backends/tail.py`; `GPUPACE_TAIL_GRAPH=1`), or launch them. CUDA only."""
        self._tail = TailGraphs(self.device) if on and self._cuda else None

    def _prepare_tail(self, stream) -> None:
        """Before a tail graph's capture, outside it: CuPy's views and its view of the stream."""
        self._views()
        self._k_reduce.warmup(stream.cuda_stream, self.device.index or 0)

    # -- helpers ------------------------------------------------------------------------------
    def _new_step(self) -> None:
        self.generation += 1  # exits of an older step are ignored
        self.n_sites = 0
        self._timed = self._cuda and self._calls % PHASE_EVERY == 0

    def _reset_row(self) -> None:
        """This rank's row empty, as it starts and as the update kernel leaves it for the next
        step: no sites, step time and waits unknown, no delays."""
        m = self.max_sites
        self.row[0] = 0.0
        self.row[1:2 + m] = float("nan")
        self.row[2 + m:] = 0.0

    def _capturing(self) -> bool:
        return self._cuda and torch.cuda.is_current_stream_capturing()

    def _check_capture(self) -> bool:
        capturing = self._capturing()
        if capturing and not self._warm:
            raise WarmupError(
                "a CUDA graph capture reached a paced collective before warm-up: call "
                "pacer.warmup() after the first eager step and before torch.cuda.graph(...), so "
                "that every kernel is compiled and every buffer made outside the capture")
        return capturing

    def _event(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    # -- per site ---------------------------------------------------------------------------
    def arrive(self) -> tuple[int, int]:
        """Enqueues arrive stamp + spin + enter stamp for the next site on the current stream.
        Returns the ticket (step generation, site index) that `exit` takes."""
        # The capture state matters for a step that records events, and before warm-up at a
        # step's first site: a capture that starts there is refused (WarmupError). One that
        # starts at a later site finds the site kernels compiled by the first one; if it takes
        # in step() it is refused there (end_step checks), before anything could compile in it;
        # one of sites alone, which the design does not support warm or not, goes unrefused.
        # Other sites skip the query (a CUDA call each).
        k = self.n_sites
        capturing = self._check_capture() if self._timed or (k == 0 and not self._warm) else False
        self.n_sites += 1
        if k < self.max_sites:
            if self._timed and not capturing:
                self._step_events.append([self._event(), None])
            self._enter(k)
        return self.generation, k

    def exit(self, ticket: tuple[int, int]) -> None:
        generation, k = ticket
        if generation != self.generation or k >= self.max_sites:
            return  # an async collective that outlived its step, or a site past max_sites
        if not (self._warm or self._exited):
            self._check_capture()  # the first exit compiles its kernel: not inside a capture
        self._exit(k)
        self._exited = True
        if self._timed and k < len(self._step_events) and not self._capturing():
            self._step_events[k][1] = self._event()

    def issue(self, sync: bool) -> contextlib.AbstractContextManager:
        """The block that arrives and issues a collective. An async one runs on the engine's
        pacing stream after the work already queued on the current stream (the gradients): the
        spin then holds back the collective, which NCCL orders after the stream it is issued
        on, and not the compute that follows on the current stream; its result is awaited by
        its future, and `end_step` joins the pacing stream back (as a CUDA-graph capture
        requires). A synchronous one stays on the current stream: that stream waits for the
        collective's end whatever precedes it, so a fork would only add launches."""
        if self._pace_stream is None or sync:
            return NO_FORK
        return _Fork(self)

    def _join(self, strict: bool = True, capturing: bool | None = None) -> None:
        """Orders the current stream after the pacing stream, if a block forked it in this
        step. A capturing stream must not wait on an event recorded outside its capture (CUDA
        invalidates the capture), nor an eager one on a captured fork: such a fork is dropped
        when it is left over from an earlier step, and refused (`strict`) when it is this
        step's, which means one graph captured the step's collectives and not its `step()`,
        or the reverse. `capturing`: the capture state, if the caller has just queried it."""
        fork, self._fork = self._fork, None
        if capturing is None:
            capturing = self._capturing()
        action = join_action(fork, capturing, self.generation)
        if action == "join":
            self._join_event.record(self._pace_stream)
            torch.cuda.current_stream(self.device).wait_event(self._join_event)
        elif action == "refuse" and strict:
            raise RuntimeError(
                "a CUDA graph captured this step's paced collectives but not pacer.step(), "
                "or pacer.step() but not the collectives: capture the whole step, "
                "collectives and step() together, in one graph")

    def leave(self, ticket: tuple[int, int], work=None) -> None:
        """After issuing a collective, inside `issue`: the exit stamp, queued behind the
        collective (`work.wait()` orders the current stream after an async one, host-free)."""
        if work is not None:
            work.wait()
        self.exit(ticket)

    # -- per step ---------------------------------------------------------------------------
    def check_empty_step(self) -> None:
        """Before a step with no paced collective ends, nothing changed yet: once a step was
        captured, an eager one is refused. It is a `step()` called after graph replays (the
        replays ran the captured one), and its empty row would zero every rank's next delays,
        which the replays read from the same buffers."""
        if self._captured and not self._capturing():
            raise RuntimeError(
                "pacer.step() with no paced collective after a step was captured in a CUDA "
                "graph: a replay runs the captured step's pacer.step() itself, so call none "
                "after g.replay() (drain() collects the replays' records); an eager step after "
                "a capture must pass its paced collectives, as the captured one did")

    def end_step(self, step: int, time_s: float) -> StepRecord | None:
        """Enqueues the exchange, the reduction and the update; returns the oldest telemetry
        record that has reached the host, if any (records arrive a few steps late)."""
        capturing = self._check_capture()
        self._join(capturing=capturing)  # the step's exit stamps, from the pacing stream
        n = min(self.n_sites, self.max_sites)
        self._finish()  # the row's waits and step time, from the step's stamps
        try:
            self._exchange()
        except BaseException:  # a step cut short (Ctrl-C in the all_gather) leaves no sites,
            self._step_events = []  # nor their events, to the next; its row starts empty,
            self._new_step()  # as the update kernel leaves it (its marks counted as sites).
            if not capturing:  # A failed capture is invalid: no launch into it (nothing of
                self._reset_row()  # it ran), which would raise over the exchange's error.
            raise
        # From the second eager step on both kernels are compiled: the graphs may capture them.
        if self._tail is not None and not capturing and self._calls >= 1:
            self._tail(n, self._reduce_and_update, self._prepare_tail)
        else:
            self._reduce_and_update(n)
        if capturing:
            self._captured = True
            self._new_step()
            return None
        self._times.append((self._calls, step, time_s))
        self._calls += 1
        if self._cuda:
            # A timed step's end event; a step before a timed one records one as its start.
            timed_next = self._calls % PHASE_EVERY == 0
            end = self._event() if self._step_events or timed_next else None
            if self._step_events:
                self._pending_phases.append((step, [self._prev_end_event, *self._step_events, end]))
            self._step_events, self._prev_end_event = [], end
            self._collect_phases()
        self._new_step()
        self._poll(self._calls % COPY_EVERY == 0)
        return self._records.popleft() if self._records else None

    def _reduce_and_update(self, n: int) -> None:
        """The step's kernels after the exchange, on the current stream."""
        self._reduce(n)
        self._update(n)

    # At world size 1 the exchange is a copy. The benchmarks set this to run the all_gather
    # all the same: the added time per collective they report then holds the launch a step of
    # many ranks pays for its exchange (one tiny NCCL launch), without the network's time.
    gather_alone = False

    def _exchange(self) -> None:
        alone = self.world_size == 1 and not self.gather_alone
        if alone or self.group is None and not dist.is_initialized():
            self.gathered[0].copy_(self.row)
            return
        try:
            if self._cuda:  # NCCL's failures come later, from the stream, if at all
                gather_rows(self.gathered, self.row, self.group)
            else:  # gloo (CPU tests): the list form
                dist.all_gather(list(self.gathered.unbind(0)), self.row, group=self.group)
        except RuntimeError as e:
            raise exchange_error(e) from e

    def _reduce(self, n: int) -> None:
        if self._cuda:
            v = self._views()
            self._k_reduce.reduce_rows(v["gathered"], v, n_sites=n,
                                       stream_ptr=self._k_launch.current_stream(self.device.index),
                                       device=self.device.index or 0)
        else:  # CPU tests: the NumPy twin, written into the same buffers
            out = self._k_reduce.reduce_reference(self.gathered.numpy(), n)
            for key, value in out.items():
                self.red[key].copy_(torch.from_numpy(value))

    def _views(self) -> dict[str, Any]:
        """CuPy views of the reduction's buffers, made once (DLPack), before any capture."""
        if self._cupy_views is None:
            self._cupy_views = self._k_reduce.views({"gathered": self.gathered, **self.red})
        return self._cupy_views

    # -- telemetry --------------------------------------------------------------------------
    def _poll(self, start_copy: bool) -> None:
        """Parses a finished ring copy; starts a new non-blocking one when asked. No sync."""
        if self._copy_pending and (self._copy_event is None or self._copy_event.query()):
            self._copy_pending = False
            self._parse(self._host_ring.numpy(), self._host_ring_step.numpy())
        if start_copy and not self._copy_pending:
            if self._captured:
                spans = [(0, self.ring_len)]
            else:  # eager: the device has done exactly self._calls steps
                spans = ring_slots(self._copied, self._calls, self.ring_len)
                self._copied = self._calls
            for lo, hi in spans:
                self._host_ring[lo:hi].copy_(self.ring[lo:hi], non_blocking=True)
                self._host_ring_step[lo:hi].copy_(self.ring_step[lo:hi], non_blocking=True)
            if self._cuda:
                self._copy_event = torch.cuda.Event()
                self._copy_event.record()
            self._copy_pending = True

    def drain(self, timeout_s: float | None = None) -> list[StepRecord]:
        """Synchronises, reads the whole ring and returns every record not yet returned (the
        ones `end_step` would have returned later included). Call it outside the step loop,
        e.g. after a batch of graph replays. With `timeout_s` (closing, at exit), it waits
        that long at most for the current and pacing streams' work, and if that has not ended
        (a collective waiting for a rank that died) returns only what has reached the host,
        and says so: a synchronize would hang until the process group's timeout. Refused
        inside a CUDA graph capture (its wait and copy would invalidate it)."""
        if self._capturing():
            raise RuntimeError("gpupace: the device's telemetry cannot be drained inside a "
                               "CUDA graph capture: drain() or close() the pacer after it")
        if self._cuda:
            if timeout_s is None:
                torch.cuda.synchronize(self.device)  # steps may have run on any stream
            elif not self._settles(timeout_s):
                warn(f"gpupace: the GPU had not finished this rank's queued work after "
                     f"{timeout_s:g} s (a collective waiting for a rank that died?): the "
                     f"telemetry records of the steps still on it are lost")
                out = list(self._records)
                self._records.clear()
                return out
        self._copy_pending = False
        self._parse(self.ring.cpu().numpy(), self.ring_step.cpu().numpy())
        out = list(self._records)
        self._records.clear()
        return out

    def _settles(self, timeout_s: float) -> bool:
        """Whether the work queued so far on the current and pacing streams ends within
        `timeout_s` (polled: no blocking call)."""
        ends = []
        for stream in (torch.cuda.current_stream(self.device), self._pace_stream):
            ends.append(torch.cuda.Event())
            ends[-1].record(stream)
        deadline = time.monotonic() + timeout_s
        while not all(end.query() for end in ends):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def _parse(self, ring: np.ndarray, ring_step: np.ndarray) -> None:
        from gpupace.kernels import update as u

        n, now = self.world_size, time.perf_counter()
        # The slots of steps not seen yet, oldest first: a Python pass over all of the ring's
        # slots took ~0.1 ms a parse on the 2-core VM, for the 8 new ones of an eager copy.
        new = np.flatnonzero(ring_step > self._last_seen)
        for slot in new[np.argsort(ring_step[new], kind="stable")]:
            k = int(ring_step[slot])
            self._last_seen = k
            rec = ring[slot]
            step, t = self._time_of(k)
            if rec[u.REC_OK] != 1.0:  # no record, as on the host
                if rec[u.REC_N_SITES] > 0 and not self._warned_disagree:  # not an empty step
                    warn(f"gpupace: ranks passed different numbers of paced sites in step "
                         f"{step}; every rank must pace the same collectives in the same "
                         f"order. Until they agree, steps are neither paced nor recorded.")
                    self._warned_disagree = True
                continue
            h, n_sites = u.REC_HEAD, int(rec[u.REC_N_SITES])
            self._records.append(StepRecord(
                step=int(step), time_s=float(t) if t == t else now,
                step_time_us=float(rec[u.REC_STEP_TIME]), spread_us=float(rec[u.REC_SPREAD]),
                residual_us=float(rec[u.REC_RESIDUAL]), transfer_us=float(rec[u.REC_TRANSFER]),
                straggler=int(rec[u.REC_STRAGGLER]), active=bool(rec[u.REC_ACTIVE]),
                earliness_us=rec[h:h + n].astype(np.float64),
                wait_us=rec[h + n:h + 2 * n].astype(np.float64),
                delay_us=rec[h + 2 * n:h + 3 * n].astype(np.float64),
                step_times_us=rec[h + 3 * n:h + 4 * n].astype(np.float64),
                site_spread_us=rec[h + 4 * n:h + 4 * n + n_sites].astype(np.float64),
            ))

    def _time_of(self, call: int) -> tuple[int, float]:
        """The step number and host time that eager `end_step` call `call` was given, from
        `_times` (consecutive calls; a dict made of it at every parse cost ~0.4 ms here). A
        call the host did not make (a graph replay) or no longer holds: its step counted on
        from the nearest call held (a resumed pacer's steps are not its calls), time NaN."""
        times = self._times
        if not times:
            return call, float("nan")
        i = call - times[0][0]
        if 0 <= i < len(times):
            return times[i][1], times[i][2]
        near = times[0] if i < 0 else times[-1]
        return call - near[0] + near[1], float("nan")

    def _collect_phases(self) -> None:
        """Eager-mode phase times from CUDA events, read only once they have completed."""
        while self._pending_phases:
            step, evs = self._pending_phases[0]
            prev, sites, end = evs[0], evs[1:-1], evs[-1]
            if not end.query():
                return
            self._pending_phases.popleft()
            first = sites[0][0]
            self._phases.append({
                "step": step,
                "compute_us": prev.elapsed_time(first) * 1e3 if prev is not None else float("nan"),
                "collective_us": sum(a.elapsed_time(b) * 1e3 for a, b in sites if b is not None),
                "step_us": prev.elapsed_time(end) * 1e3 if prev is not None else float("nan"),
            })

    def phase_times(self) -> list[dict[str, float]]:
        """Per step (eager mode): compute before the first paced site, time in paced sites
        (delay + collective), and the whole step, in us, from CUDA events."""
        if self._cuda:
            self._collect_phases()
        return list(self._phases)

    # -- control ----------------------------------------------------------------------------
    def forget_exits(self) -> None:
        """As the host engine's: the exits the next step times itself and its arrivals from,
        zeroed on the device (0: none; two fills on the current stream, which the next step's
        kernels follow)."""
        self.clk[0:1].zero_()
        self.stamps[:, 2].zero_()

    def next_delays(self) -> np.ndarray:
        """This rank's delays for the next step (synchronises: not for the step loop)."""
        if self._cuda:
            torch.cuda.synchronize(self.device)  # replays may have run on any stream
        n_state = int(self.state["counter"][0, 2].item())
        return self.state["delay"][0, :max(n_state, 0)].double().cpu().numpy()

    def policy_state(self) -> dict[str, np.ndarray] | None:
        """This rank's learnt state, [S] a field (`gpupace.checkpoint`); None before any.
        Synchronises: not for the step loop."""
        if self._cuda:
            torch.cuda.synchronize(self.device)  # replays may have run on any stream
        n = int(self.state["counter"][0, 2])
        if n <= 0:
            return None
        # This rank's own row of the flags of past stragglers, which every program holds whole
        mine = {"last_seen": self.state["last_seen"][0, :n, self.rank]}
        return {name: mine.get(name, self.state[name][0, :n]).cpu().numpy().astype(
                    np.int64 if name in checkpoint.COUNTERS else np.float64)
                for name in checkpoint.FIELDS}

    def load_policy_state(self, saved: dict[str, np.ndarray] | None) -> None:
        """Takes over a saved state (`checkpoint.unpack`: [N, S] and [S] fields, S at most
        max_sites; None: none), in place (a captured step's graph reads the same buffers), with
        the policy's step count at 0, so that the warm-up runs again, and no delay planned.
        Synchronises, before (a replay may still run on another stream) and after."""
        if self._cuda:
            torch.cuda.synchronize(self.device)
        state = self.state
        for name in ("delay", *checkpoint.LOADED):
            state[name][0].fill_(-1.0 if name == "var" else 0)
        n = 0
        if saved is not None:
            n = saved["floor"].shape[1]
            # The flags of past stragglers whole, [S, N] (every program holds every rank's);
            # of the other per-rank fields, this rank's row.
            state["last_seen"][0, :n].copy_(torch.from_numpy(saved["last_seen"].T))
            for name in (name for name in checkpoint.LOADED if name != "last_seen"):
                value = saved[name][self.rank] if name in checkpoint.PER_RANK else saved[name]
                if name in checkpoint.COUNTERS:  # int32 here; a host's are int64
                    value = np.minimum(value, self._k_update.CALM_MAX)
                state[name][0, :n].copy_(torch.from_numpy(np.asarray(value, dtype=np.float64)))
        state["counter"][0, 1:].copy_(torch.tensor([0, n], device="cpu"))
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def warmup(self) -> None:
        """Compiles every kernel (Triton, CuPy NVRTC), makes every view and initialises the
        collective, on scratch copies of the buffers so no state changes; then synchronises.
        Call it after the first eager step and before capturing a paced step in a CUDA graph."""
        if self._capturing():
            raise WarmupError("warmup() was called inside a CUDA graph capture; call it before")
        scratch = DeviceEngine.__new__(DeviceEngine)
        scratch.__dict__.update(self.__dict__)
        scratch.row, scratch.gathered = self.row.clone(), self.gathered.clone()
        scratch.clk = self.clk.clone()
        scratch.red = {k: v.clone() for k, v in self.red.items()}
        scratch.state = {k: v.clone() for k, v in self.state.items()}
        scratch.stamps, scratch.usual = scratch.state["stamps"][0], scratch.state["usual"][0]
        scratch.ring, scratch.ring_step = self.ring.clone(), self.ring_step.clone()
        scratch._cupy_views = None
        zero = torch.zeros_like(self.state["delay"])
        scratch.state["delay"] = zero  # no spin during warm-up
        for k in (0, 1 % self.max_sites):  # two sites: the site index is not specialised on
            self._k_spin.enter(zero, scratch.usual, scratch.row, scratch.stamps, scratch.clk, k,
                               cap_us=self.cap_us)
            self._k_stamp.exit_stamp(scratch.row, scratch.stamps, scratch.clk, k)
        self._k_stamp.finish_row(scratch.row, scratch.stamps, scratch.clk)
        scratch._exchange()
        if self._cuda:
            self._k_reduce.warmup(torch.cuda.current_stream().cuda_stream, self.device.index or 0)
        scratch._reduce(1)
        self._k_update.update(scratch.gathered, scratch.row, scratch.red, scratch.state,
                              scratch.ring, scratch.ring_step, self.params, n_sites=1,
                              rank=self.rank)
        if self._cuda:
            self._views()
            torch.cuda.synchronize(self.device)
        self._warm = True


class _Fork:
    """An async block's fork onto the engine's pacing stream (`DeviceEngine.issue`): a class,
    not a generator, and the current stream set and restored directly, not through
    `torch.cuda.stream` (it runs once an async collective, on the eager hot path). It restores
    the engine device's stream alone, which is the current device's: the constructor requires
    it, and the engine's launches go to the current device."""

    __slots__ = ("_engine", "_prev")

    def __init__(self, engine: DeviceEngine):
        self._engine = engine

    def __enter__(self) -> None:
        eng = self._engine
        # Before the fork: a capture refused for want of warm-up must not leave the pacing
        # stream forked into it, or ending the capture fails on that instead.
        capturing = eng._check_capture()
        self._prev = current = torch.cuda.current_stream(eng.device)
        eng._fork_event.record(current)
        eng._pace_stream.wait_event(eng._fork_event)
        eng._fork = (eng.generation, capturing)
        torch.cuda.set_stream(eng._pace_stream)

    def __exit__(self, exc_type, exc, tb) -> bool:
        torch.cuda.set_stream(self._prev)
        if exc_type is not None:
            try:
                self._engine._join(strict=False)  # nothing left forked behind an error
            except Exception:  # noqa: BLE001 - a broken capture: the user's error matters
                self._engine._fork = None
        return False
