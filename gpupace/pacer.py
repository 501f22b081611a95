"""`Pacer`: paced sites around collectives, the per-step exchange, telemetry and summary.

    pacer = gpupace.Pacer(gpupace.PaceConfig(mode="pace"))
    for batch in data:
        loss = model(batch).sum(); loss.backward()
        pacer.all_reduce(grad)              # or: with pacer.site("grads"): dist.all_reduce(grad)
        opt.step()
        pacer.step()                        # once per step, on every rank
    print(pacer.summary())

Sites are matched across ranks by their order within a step, so every rank must pass the same
paced collectives in the same order (as it must issue the collectives themselves in order).
`step()` is a collective too: every rank calls it once per step. So is building a `Pacer`:
every rank builds one, and the ranks check that they were given the same settings.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing.util
import numbers
import os
import sys
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from . import checkpoint
from .agree import check_ranks_agree, new_run_id, site_names_differ
from .backends import (
    BACKENDS,
    cuda_device,
    device_backend_blocked,
    device_backend_missing,
    exchange_error,
    group_backend,
    off_current_device,
    too_many_ranks,
)
from .backends.host import HostEngine
from .config import PaceConfig, fill_rank, per_rank_path
from .summary import Summary, summarize
from .telemetry import (
    HEADER_FIELDS,
    Ring,
    StepRecord,
    TelemetryWriter,
    exit_failure,
    failure_of,
    make_header,
    names_a_folder,
    record_bytes,
    ring_capacity,
)
from .warn import warn

# Paced collectives without a step(), in units of `max_sites`, past which the pacer warns.
MISSING_STEP_FACTOR = 4
# Steps with no paced collective at all after which the pacer warns (attach() forgotten).
IDLE_STEPS = 10
# The own step whose site names the ranks compare, once (a DDP model's first step has one
# bucket, its second all of them)
NAMES_STEP = 2
# Fewer step records than this kept for summary(), by ring_memory_mb's choice, is said: a
# tiny value kept one record, silently, and summary() read one step.
FEW_RECORDS = 100
# Closing, at exit included, waits this long at most for the device's queued work before it
# reads the telemetry still on it: after a rank died, that work never ends. Closing on an
# error (a with block's, the exception a process exits on: Ctrl-C on a hung job) waits less,
# and so does a pacer's collection, which may come at any point of the user's code.
CLOSE_DRAIN_S = 30.0
ERROR_DRAIN_S = 3.0


class Pacer(Joinable):
    """Paces the collectives of one process group. See the module docstring.

    `backend`: "host" (CPU clock, any group), "device" (CUDA group; needs triton and cupy) or
    "auto" (device for CUDA groups when it can run, else host).
    `samples_per_step`: scales `throughput` in `summary()` (steps/s when 1).
    `label` and `telemetry_extra` go into the telemetry file's header.
    `tensorboard_dir`: log each step's scalars to TensorBoard (rank 0; on a data-parallel
    subgroup, each group's rank 0 into a folder of the group's, `group2-3`; needs `pip install
    tensorboard`).
    """

    def __init__(self, config: PaceConfig | None = None, group: Any = None, *,
                 backend: str = "auto", samples_per_step: float = 1.0, label: str = "",
                 telemetry_extra: dict[str, Any] | None = None,
                 tensorboard_dir: str | os.PathLike | None = None):
        super().__init__()  # Joinable: uneven inputs, `Join([ddp_model, pacer])`
        if config is not None and not isinstance(config, PaceConfig):
            raise TypeError(f"config must be a PaceConfig, got {type(config).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if dist.is_available() and dist.is_initialized():
            if group is dist.group.WORLD:
                group = None  # the default group, held weakly below (`_world`), not here
            if group is not None and group is getattr(dist.GroupMember, "NON_GROUP_MEMBER", ()):
                # what new_group() gives the ranks outside it; torch's own error named no group
                raise ValueError(f"rank {dist.get_rank()} is not in this pacer's process group: "
                                 "build a group's pacer on the group's ranks alone (new_group "
                                 "returns a non-member marker on the others)")
            self.rank = dist.get_rank(group)
            self.world_size = dist.get_world_size(group)
            pg_backend = group_backend(group)
        elif group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialized")
        else:
            self.rank, self.world_size, pg_backend = 0, 1, "none"
        self.group = group
        self._alone = pg_backend == "none"  # built with no process group: one rank
        # `check_group`'s, weakly: a pacer alive at exit kept a destroyed group's gloo threads
        # running, which aborted the process as the interpreter exited (SIGABRT, "terminate
        # called without an active exception", in about half of the runs of a 2-rank job)
        self._world = weakref.ref(dist.group.WORLD) if not self._alone else None
        if self._alone and _world_size_env() > 1:
            raise RuntimeError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} says this process is one rank of a "
                "job, and torch.distributed is not initialized: build the Pacer after "
                "init_process_group (built before, it takes the job for one rank, and every "
                "rank writes its telemetry as rank 0)")
        # What can fail on some ranks only (this host's GPUPACE_* variables and packages)
        # fails after the ranks have compared settings, on every rank: raised before it, it
        # left the others waiting in that all_gather until the process group's timeout.
        failure: Exception | None = None
        try:
            if not (isinstance(samples_per_step, numbers.Real) and not isinstance(
                    samples_per_step, bool) and math.isfinite(samples_per_step)
                    and samples_per_step > 0):
                raise ValueError(f"samples_per_step must be a finite number > 0 (the samples "
                                 f"of one step, over all ranks), got {samples_per_step!r}")
            self.config = config if config is not None else PaceConfig()
            _check_extra(telemetry_extra)
            self.backend = self._pick_backend(backend, pg_backend, self.world_size)
            if self.backend == "device" and (off := off_current_device(
                    cuda_device(group), "the process group runs on")):
                raise ValueError(off)  # the engine's check, before the settings' all_gather
            if tensorboard_dir is not None and self.enabled and self.rank == 0:
                from .report.tensorboard import summary_writer

                summary_writer()  # ImportError naming the package
        except (ValueError, RuntimeError, ImportError) as e:
            failure = e
        if self.world_size > 1:  # one all_gather: a rank set up differently fails here, named
            ok = failure is None
            run_id = check_ranks_agree(self.config if ok else None,
                                       self.backend if ok else None, group, pg_backend,
                                       self.world_size, self.rank)
        else:
            run_id = new_run_id()
        if failure is not None:
            raise failure
        if self.backend == "host" and pg_backend == "nccl" and self.config.mode != "off":
            why = device_backend_blocked(pg_backend, self.world_size)
            hint = f"the device backend cannot run here: {why}" if why else "use backend='device'"
            warn("gpupace: the host backend on an NCCL group stamps when collectives are "
                 f"enqueued, not when they run on the GPU, so its spreads say little; {hint}")
        self.samples_per_step = samples_per_step
        self.steps = 0
        self._first_measured = self.config.warmup_steps  # the first step summary() counts
        self._resumed_at = -1  # the step count a checkpoint's load set, until the next step
        self._rewarms: list[range] = []  # the warm-ups that loads in the middle of a run ran
        self._t0 = time.perf_counter()
        if self.backend == "device":  # imported here: only the device backend needs triton
            from .backends.device import DeviceEngine
            self._engine = DeviceEngine(self.config, group, self.rank, self.world_size)
        else:
            self._engine = HostEngine(self.config, group, self.rank, self.world_size)
        self.ring = Ring(ring_capacity(self.config.ring_size, self.config.ring_memory_mb,
                                       self.world_size, self.config.max_sites))
        if self.ring.capacity < min(self.config.ring_size, FEW_RECORDS):
            need = FEW_RECORDS * record_bytes(self.world_size, self.config.max_sites) / 1e6
            warn(f"gpupace: ring_memory_mb={self.config.ring_memory_mb:g} keeps "
                 f"{self.ring.capacity} step record(s) at {self.world_size} ranks: summary() "
                 f"covers only the last {self.ring.capacity} step(s); {need:.2g} MB keeps "
                 f"{FEW_RECORDS} (ring_memory_mb, GPUPACE_RING_MEMORY_MB)")
        self.site_names: list[str] = []  # the paced sites of the last step, in order
        self._names_this_step: list[str] = []
        self._sites_this_step = 0  # paced collectives since the last step()
        self._open_blocks = 0  # paced blocks entered and not yet left
        self._sites_last_step = 0
        self._sites_most = 0  # the most paced collectives seen in one step
        self._hooked = False  # attach() registered DDP's comm hook (see _PacerJoinHook)
        # Passes that synced a DDP model's gradients since the last step(), by the model's site
        # prefix: the hook counts each at its bucket marked last (`_check_synced_once`)
        self._synced: dict[str, int] = {}
        # The DDP models attach() took, each with its number and the Join config it had when
        # last looked at (`_AttachedModel`)
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._own_join_seen = self._join_config
        # The pacer's hook in the last Join([ddp_model, pacer]) made: alive until the Join
        # ends (torch frees it then, on an error too), `ended` once every rank joined
        self._join_hook: weakref.ref | None = None
        self._loaded_sites: tuple[int, int] | None = None  # (saved sites, steps to wait)
        self._warned: set[str] = set()  # misuse already warned about, once each
        self._closed = False
        self._writer: TelemetryWriter | None = None
        self._collected: weakref.finalize | None = None  # closes the file if collected unclosed
        self._header: dict[str, Any] = {}
        # One step's record in this many goes to the file and TensorBoard: every step up to 127
        # ranks, then fewer (a record is ~31 bytes of JSON a rank, 8-9 ms to encode at 4096).
        self.telemetry_every = self.config.telemetry_every or max(1, self.world_size // 64)
        path = self.config.telemetry_path
        subgroup = _subgroup_ranks(group)  # a data-parallel group's files are its own
        # The telemetry file's last line: steps run, and how the run ended ("closed", "exit":
        # at interpreter exit without close(), "error: <exception>")
        self._end: dict[str, Any] = {"steps": 0, "how": "exit"}
        if path and self.config.mode != "off" and (per_rank_path(path) or self.rank == 0):
            me = dist.get_rank() if subgroup is not None else self.rank  # the global rank
            extra = {} if subgroup is None else {"global_rank": me, "group_ranks": subgroup}
            self._header = header = make_header(
                source="pacer", world_size=self.world_size, rank=self.rank, label=label,
                config=self.config.to_dict(), samples_per_step=samples_per_step,
                process_group_backend=pg_backend, pacer_backend=self.backend,
                telemetry_every=self.telemetry_every, run_id=f"{run_id:013x}", **extra,
                **(telemetry_extra or {}))
            try:
                self._writer = TelemetryWriter(telemetry_file(path, me, subgroup), header,
                                               self.config.telemetry_interval, background=True,
                                               keep_previous=True, end=self._end)
            # A side channel: training goes on without it. Raised on the writing ranks alone,
            # an error would leave the others waiting in the first step's all_gather.
            except (OSError, ValueError) as e:
                self._telemetry_failed(e)
            else:
                # Dropped without close() (a notebook cell run again, a main() returned),
                # the pacer closes its file when collected, after the device's last records,
                # which frees the path for the next one; one alive at exit is closed by the
                # finalizer below.
                self._collected = weakref.finalize(self, _close_collected, self._engine,
                                                   self._writer, self.telemetry_every)
                self._collected.atexit = False
                if self._writer.kept is not None:
                    warn(f"gpupace: telemetry file {self._writer.path} already held a run: "
                         f"kept it as {self._writer.kept}")
        self._tb = None
        if tensorboard_dir is not None and self.enabled and self.rank == 0:
            from .report.tensorboard import TensorBoardLogger  # names `pip install tensorboard`

            folder = tensorboard_folder(tensorboard_dir, subgroup)
            try:
                self._tb = TensorBoardLogger(folder)
            except (OSError, RuntimeError, ValueError) as e:  # a folder that cannot be written
                self._tensorboard_failed(e, folder)
        if self._writer is not None or self._tb is not None:
            # Left unclosed, at exit (multiprocessing's atexit hook, or a child's bootstrap),
            # before the writer's own finalizer (priority 0): the device backend's last records
            # are still on the GPU.
            multiprocessing.util.Finalize(self, _close_at_exit, args=(weakref.ref(self),),
                                          exitpriority=1)

    @staticmethod
    def _pick_backend(requested: str, pg_backend: str, world_size: int = 1) -> str:
        """The backend to run. "auto": device for CUDA (nccl) groups of up to DEVICE_MAX_RANKS
        ranks when triton and cupy import, else host (the constructor then says why).
        "device" forced where it cannot run: a RuntimeError saying why (the missing package
        and the extra to install, the group's size)."""
        if requested == "host":
            return "host"
        why = device_backend_missing()
        if requested == "device":
            if why:
                raise RuntimeError(f"backend='device' cannot run here: {why}")
            if pg_backend not in ("nccl", "none"):
                raise RuntimeError(f"backend='device' needs a CUDA (nccl) process group, got "
                                   f"{pg_backend!r}; use backend='host'")
            if too_many := too_many_ranks(world_size):
                raise RuntimeError(f"backend='device': {too_many}; use backend='host'")
            return "device"
        why = why or too_many_ranks(world_size)
        return "device" if why is None and pg_backend == "nccl" else "host"

    def warmup(self) -> None:
        """Compiles every device kernel, makes every buffer and initialises the exchange, so
        that a paced training step can then be captured in a CUDA graph. Call it after one
        eager step, before `torch.cuda.graph(...)`. Synchronises. A no-op on the host backend,
        which warns where CUDA is: no graph can capture it (a capture that reaches one of its
        paced collectives raises)."""
        if not self.enabled:
            return
        warm = getattr(self._engine, "warmup", None)
        if warm is not None:
            warm()
        elif torch.cuda.is_available():
            self._warn_once("host_warmup", "gpupace: pacer.warmup() does nothing on the host "
                            f"backend: {self._engine.capture_refused()}")

    def check_group(self) -> None:
        """Raises if this pacer was built before `torch.distributed.init_process_group` and a
        group exists now: it took the job for one rank, so it would exchange nothing and its
        DDP hook would divide the gradients by 1 instead of the world size."""
        if self._alone:
            if dist.is_available() and dist.is_initialized():
                raise RuntimeError(
                    "this Pacer was built before torch.distributed.init_process_group, so it "
                    f"paces one rank, not the group's {dist.get_world_size()}; build the Pacer "
                    "after init_process_group")
        elif self._world is not None and dist.group.WORLD is not (self._world() or ()):
            # An in-process restart: attach() took the new model and its hook divided the
            # gradients by the old world size (0.5x DDP's at 4 ranks made 2). Destroying the
            # default group destroys the subgroups too.
            raise RuntimeError(
                "this Pacer's process group was destroyed (destroy_process_group, then "
                "perhaps init_process_group again): it paces the "
                f"{self.world_size} ranks of the old one; build a new Pacer on the new group")

    @property
    def enabled(self) -> bool:
        return self.config.mode != "off"

    # -- sites ------------------------------------------------------------------------------
    def collective(self, name: str = "", *,
                   async_op: bool = False) -> contextlib.AbstractContextManager[Callable]:
        """Paces the one collective issued inside the block: stamps arrival and waits this
        rank's delay on entry, then yields `issued(work)`, to call right after issuing it with
        its work handle (None for a synchronous collective); the exit is stamped when the work
        completes. On the device backend an async block runs on the pacing stream, so the
        delay holds back the collective and not the compute after it.

            with pacer.collective("grads", async_op=True) as issued:
                work = dist.all_reduce(t, group=pacer.group, async_op=True)
                issued(work)

        On the device backend, allocate an async collective's tensors before the block (one
        made inside belongs to the pacing stream's memory pool) and wait on its result from
        your own stream (`work.wait()`), as without pacing.
        """
        self.check_group()
        return _Paced(self, name, async_op) if self.enabled else _UNPACED

    def site(self, name: str = "") -> contextlib.AbstractContextManager[Callable]:
        """Paces the synchronous collective issued inside the block: stamps arrival, waits this
        rank's delay, stamps entry; the exit is stamped when the block ends (use
        `all_reduce(..., async_op=True)` or `collective` for async ones). `collective(name)`:
        its `issued`, which a synchronous block need not call, is the block's value. Put the
        collective alone in the block: work inside it before the collective (building its
        input) is timed as waiting, so a rank slow there reads as early, not late."""
        return self.collective(name)

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, *,
                   async_op: bool = False, name: str = "all_reduce"):
        """A paced drop-in for `torch.distributed.all_reduce` on this pacer's group."""
        with self.collective(name, async_op=async_op) as issued:
            work = dist.all_reduce(tensor, op=op, group=self.group, async_op=async_op)
            issued(work)
        return work

    def _arrive(self, name: str):
        ticket = self._engine.arrive()  # a refused site (a capture) is not counted
        self._sites_this_step += 1
        if len(self._names_this_step) < self.config.max_sites:  # bounded if step() never comes
            self._names_this_step.append(name)
        elif self._sites_this_step == MISSING_STEP_FACTOR * max(self.config.max_sites,
                                                                self._sites_most):
            # Both causes, neither first: before a step() has shown the real count, a model of
            # many buckets (DDP's first step has one) reaches the threshold in one step.
            m = self.config.max_sites
            if self._closed:  # the user is done with the pacer; its model may not be
                why = ("DDP keeps the comm hook attach() registered, so the model is paced "
                       "still: wrap it in DDP anew without attach() to stop, or call "
                       "pacer.close() after the last step" if self._hooked else
                       "call pacer.close() after the last paced collective and step()")
                self._warn_once("no_step", f"gpupace: {self._sites_this_step} paced "
                                "collectives since the last pacer.step(), after pacer.close(), "
                                f"which ends the telemetry, not the pacing: {why}.")
            else:
                self._warn_once("no_step", f"gpupace: {self._sites_this_step} paced "
                                "collectives since the last pacer.step(). Either one training "
                                f"step has that many (raise max_sites: only the first {m} of a "
                                "step are timed and paced), or pacer.step() is not called once "
                                "per training step (call it on every rank, after the step's "
                                "collectives: without it nothing is exchanged, paced or "
                                "recorded).")
        return ticket

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message)

    # -- steps ------------------------------------------------------------------------------
    def step(self) -> StepRecord | None:
        """Ends a step: exchanges timing rows with every rank (one small all_gather), updates
        the delays of the next step and records telemetry. Call it on every rank, once per step,
        after the step's paced collectives have completed."""
        synced, self._synced = self._synced, {}  # this step's passes, whatever it raises
        self.check_group()
        if self._join_config.enable and self._join_config.is_first_joinable:
            raise ValueError("pass the pacer to Join after the DDP model, Join([ddp_model, "
                             "pacer]): a rank that ran out of inputs must shadow the model's "
                             "gradient all-reduces before the pacer's step")
        if self._models:
            self._check_join()
        if synced and max(synced.values()) > 1 and self._in_own_join():
            self._check_synced_once(synced)
        if self._open_blocks:
            raise RuntimeError("pacer.step() inside a paced block (site, collective, "
                               "all_reduce): call it after the block, once the step's "
                               "collectives are done")
        if self.enabled and not self._sites_this_step and not self._in_own_join():
            self._engine.check_empty_step()  # a Join's shadow step is empty on joined ranks
        self.steps += 1
        if not self.enabled:
            return None
        if self._closed:
            self._warn_once("closed", "gpupace: pacer.step() after pacer.close(): pacing and "
                            "summary() go on, but the telemetry file and TensorBoard are closed")
        own_steps = self.steps - max(self._resumed_at, 0)  # a resumed job's count starts on
        if own_steps == IDLE_STEPS and self._sites_most == 0 and self._sites_this_step == 0:
            self._warn_once("idle", f"gpupace: {IDLE_STEPS} steps and no paced collective: "
                            "pacer.attach(ddp_model) was not called, or nothing goes through "
                            "pacer.all_reduce, site or collective (or not yet); each step() "
                            "still costs its all_gather, and nothing is timed, paced or "
                            "recorded")
        if self._sites_this_step == 0 and self._sites_last_step > 0:
            self._warn_once("empty_step", "gpupace: pacer.step() saw no paced collective since "
                            f"the last step() (the step before had {self._sites_last_step}): "
                            "call it once per training step, after the step's collectives, not "
                            "per micro-batch. Such a step records nothing and zeroes the next "
                            "step's delays: with one per micro-batch, nothing is paced. (A "
                            "model that skips some steps, or an eval loop, may call it so: "
                            "those steps are only left out.)")
        if self._loaded_sites is not None and self._sites_this_step:
            self._check_loaded_sites()
        if self._sites_this_step > self.config.max_sites:
            self._warn_once("max_sites", f"gpupace: {self._sites_this_step} paced collectives "
                            f"in this step, and only the first {self.config.max_sites} are "
                            "timed and paced: raise max_sites (GPUPACE_MAX_SITES) to pace "
                            "them all")
        self._sites_most = max(self._sites_most, self._sites_this_step)
        self._sites_last_step, self._sites_this_step = self._sites_this_step, 0
        self.site_names, self._names_this_step = self._names_this_step, []
        try:
            if own_steps == NAMES_STEP:
                self._compare_site_names()
            record = self._engine.end_step(self.steps - 1, time.perf_counter() - self._t0)
        except BaseException as e:  # a peer gone (ExchangeError), Ctrl-C in the all_gather
            self._end["how"] = failure_of(e) or self._end["how"]
            raise
        self._end["steps"] = self.steps  # steps completed
        if self._end["how"].startswith("error"):  # a paced block's, caught: the run went on
            self._end["how"] = "exit"
        if record is not None:
            self._keep(record)
        return record

    def pause(self) -> None:
        """Marks time between two steps that is not training (an eval loop, a checkpoint
        save): the next step's time and its collectives' arrivals are not measured across it.
        Unmarked, the pause read as one slow step (throughput and the step-time tail in
        `summary()` with it) and as late arrivals. Call it between `step()` and the next
        step's first paced collective, before or after the pause; no collective, no sync. An
        eval loop in `Join([ddp_model])` needs it after the loop: torch leaves the model's Join
        config as the Join set it, and the next step() would take the model for one in a Join
        without the pacer (a Join made after the pause still is)."""
        if self._sites_this_step:
            raise RuntimeError(f"pacer.pause() inside a step ({self._sites_this_step} paced "
                               "collectives since the last step()): call it between steps")
        for model, seen in (self._models or {}).items():  # a Join that ended before it
            seen.join_config = model._join_config  # (around an eval loop) is no training's
        if self._engine is not None and self.enabled:
            self._engine.forget_exits()

    # -- uneven inputs (torch.distributed.algorithms.join) -----------------------------------
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """For `Join([ddp_model, pacer])`: a rank that ran out of inputs runs the model's
        join hook (its zero-gradient all-reduces go through the pacing hook as sites) and then
        this one, `step()` after a pass that synced, so that the others' step all_gather has
        its row. Without it they waited in that all_gather until the process group's
        timeout. `divide_by_initial_world_size=False` is refused: the pacing hook divides by
        the world size, as DDP does by default, and joined ranks would count."""
        if not kwargs.get("divide_by_initial_world_size", True):
            raise ValueError("Join(..., divide_by_initial_world_size=False) is not supported "
                             "with gpupace: its DDP hook averages over the whole world size, "
                             "as DDP does by default; leave the option at True")
        late = self._models_after_me(_joinables_of_the_join())
        if late:
            raise ValueError(f"pass the pacer to Join after every DDP model it paces, "
                             f"Join([ddp_model, pacer]) ({late} of them after it here): a rank "
                             f"out of inputs would run the pacer's step before those models' "
                             f"all-reduces, where the others run it after them, and the "
                             f"collectives stop matching")
        hook = _PacerJoinHook(self)
        self._join_hook = weakref.ref(hook)  # open while torch holds it: state_dict() refused
        return hook

    def _models_after_me(self, joinables: list | None) -> int:
        """How many of the DDP models this pacer paces come after it in a Join's joinables."""
        if not joinables or self not in joinables or not self._models:
            return 0
        after = joinables[joinables.index(self) + 1:]
        return sum(getattr(j, "_orig_mod", j) in self._models for j in after)

    @property
    def join_device(self) -> torch.device:
        nccl = self.world_size > 1 and group_backend(self.group) == "nccl"
        return cuda_device(self.group) if nccl else torch.device("cpu")

    @property
    def join_process_group(self) -> Any:
        return self.group if self.group is not None else dist.group.WORLD

    def drain(self) -> list[StepRecord]:
        """Collects the telemetry records the device backend still holds (it copies them back
        lazily; in CUDA-graph mode, call this at least every 256 replays or the oldest are
        overwritten). Synchronises: call it outside the step loop. Host backend: nothing held."""
        return self._drain(None)

    def _drain(self, timeout_s: float | None) -> list[StepRecord]:
        engine_drain = getattr(self._engine, "drain", None)
        records = engine_drain(timeout_s) if engine_drain is not None and self.enabled else []
        for record in records:
            self._keep(record)
        return records

    def _keep(self, record: StepRecord) -> None:
        self.ring.append(record)
        if record.step % self.telemetry_every:
            return
        if self._writer is not None:
            try:
                self._writer.write(record)
            except (OSError, RuntimeError) as e:  # the writer's thread failed (a full disk)
                self._telemetry_failed(e)
        if self._tb is not None:
            self._tensorboard(lambda tb: tb.log(record))

    def _tensorboard(self, use: Callable[[Any], None]) -> None:
        """`use(logger)` on the TensorBoard logger; one that fails is dropped, with a warning
        (`_tensorboard_failed`)."""
        try:
            use(self._tb)
        except (OSError, RuntimeError, ValueError) as e:  # a full disk
            tb, self._tb = self._tb, None
            self._tensorboard_failed(e, tb.folder)
            with contextlib.suppress(Exception):
                tb.close()

    @staticmethod
    def _tensorboard_failed(error: BaseException, folder: Any) -> None:
        """TensorBoard is a side channel, as the telemetry file is: a folder that cannot be
        written (read-only, a full disk) ended rank 0, and the others failed in their next
        collective. Warns, and training goes on without it."""
        warn(f"gpupace: TensorBoard logging to {str(folder)!r} failed, training goes on "
             f"without it: {error}")

    def _telemetry_failed(self, error: BaseException) -> None:
        """Telemetry is a side channel: a file that cannot be written must not end a training
        run (on every rank, as the others then fail in their next collective). Warns, keeps
        what was written, and goes on without the file."""
        warn(f"gpupace: telemetry file {self.config.telemetry_path!r} failed, "
             f"training goes on without it: {error}")
        writer, self._writer = self._writer, None
        if self._collected is not None:
            self._collected.detach()
        if writer is not None:
            writer.end = None  # records are missing: no end line says the file is whole
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()

    def summary(self) -> Summary:
        """Throughput, step-time mean, CV, p50/p99/max, spread mean/p99 and the straggler
        histogram over the records in memory after the warm-up steps (`summarize`), plus the
        mode, backend, world size and the paced sites of the last step (at most max_sites): a
        dict, times in us, that `print` shows as a table in ms. The
        ring keeps the newest `ring.capacity` records (`ring_size`, `ring_memory_mb`: ~960
        steps at 4096 ranks); the telemetry file one step in `telemetry_every` of the run."""
        steady = [r for r in self.ring if r.step >= self._first_measured
                  and not any(r.step in warm for warm in self._rewarms)]
        out = summarize(steady, self.world_size, self.samples_per_step)
        out.update(mode=self.config.mode, backend=self.backend, world_size=self.world_size,
                   sites=len(self.site_names), warmup_steps=self.config.warmup_steps)
        return out

    def state_dict(self) -> dict[str, Any]:
        """What the pacer has learnt, for a checkpoint, so that a restarted job does not learn
        it all again (where the last arrival moves among many ranks, the holdoff alone is up to
        5 steps a rank: 20,480 steps at 4096 ranks): every rank's earliness floors, holdoff
        counters, running means and variances and flags of the sites where each has been last,
        and the sites' on/off switch (`gpupace.checkpoint`). A collective, like FSDP's full
        state dict: call it on every rank, between steps, and save it from one; each rank gets
        the same dict. Tensors and plain values only: `torch.load` reads it back with weights_only.
        Synchronises (device backend)."""
        self._check_between_steps("state_dict")
        if self._in_own_join():
            raise RuntimeError(
                "Pacer.state_dict() inside Join([ddp_model, pacer]): it is a collective, which "
                "a rank that ran out of inputs cannot take part in (the others waited for it "
                "until the process group's timeout); take it after the Join's block")
        return checkpoint.gather(self._engine.policy_state(), steps=self.steps,
                                 world_size=self.world_size, group=self.group,
                                 device=self.join_device, group_ranks=_subgroup_ranks(self.group))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Takes over what `state_dict` saved, on a job of as many ranks, each taking its own
        rank's part (not a collective: call it on every rank, between steps). The next delays
        are not saved, and the warm-up runs again (its steps measure, as at any start), then
        pacing goes on from the saved floors and counters. Saved on other nodes or GPUs, a
        rank's floor may no longer fit it: the floor falls at its first late step. A pacer
        that has not stepped yet, as a restarted job's, goes on from the saved step count: its
        records, telemetry file and TensorBoard points are numbered on from there (TensorBoard
        hides the points an earlier run logged from that step on), and summary() and the
        report leave out the warm-up after it; one that has stepped keeps its own count, and
        summary() leaves out the warm-up that runs again (the report counts it: the file's
        header says where the first warm-up ends, not this one). A
        ValueError for a state of another world size, of another data-parallel group, or one
        no pacer saved."""
        self._check_between_steps("load_state_dict")
        learnt = checkpoint.unpack(state, world_size=self.world_size,
                                   max_sites=self.config.max_sites,
                                   group_ranks=_subgroup_ranks(self.group))
        steps = checkpoint.steps_of(state)
        self._engine.load_policy_state(learnt)
        # Sites are matched by order: the second step with sites after this (a DDP model's
        # first has one bucket) says whether the model's buckets are the saved ones.
        self._loaded_sites = (int(state["sites"]), 2) if learnt is not None else None
        if steps and (self.steps == 0 or self.steps == self._resumed_at):  # not stepped since
            self._resume_at(steps)
        elif self.steps > 0:  # its own count goes on, with the warm-up again from here
            self._rewarms.append(range(self.steps, self.steps + self.config.warmup_steps))

    def _in_own_join(self) -> bool:
        """Inside Join([ddp_model, pacer]): its hook alive (torch frees it when the block ends,
        on an error too, where the post hook does not run) and not ended; not in the handler of
        an error its exit raised (`throw_on_early_termination`: the traceback holds the Join)."""
        hook = self._join_hook() if self._join_hook is not None else None
        if hook is None or hook.ended or not self._join_config.enable:
            return False
        tb = sys.exc_info()[2]
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code is Join.__exit__.__code__ and hook in frame.f_locals["self"]._join_hooks:
                hook.ended = True
                return False
            tb = tb.tb_next
        return True

    def _check_synced_once(self, synced: dict[str, int]) -> None:
        """Inside Join([ddp_model, pacer]), refuses a step in which a DDP model synced its
        gradients more than once (`synced`: passes by model prefix), where a rank out of inputs
        steps after each pass that syncs, so the ranks' step all_gathers stop matching (they
        waited until the group's timeout). Told at the first step, on every rank alike while
        they all have inputs."""
        prefix, passes = max(synced.items(), key=lambda item: item[1])
        model = f"the DDP model {prefix.rstrip('.')}" if prefix else "the DDP model"
        raise ValueError(
            f"under Join, {model} synced its gradients more than once in this step ({passes} "
            "passes since the last pacer.step()): a rank out of inputs steps after each pass "
            "that syncs, the others once, and the steps' all_gathers would stop matching. "
            "Wrap every micro-batch but the last in ddp_model.no_sync(), or call pacer.step() "
            "after each pass that syncs")

    def _check_join(self) -> None:
        """Refuses the first step after a Join took a model this pacer paces and not the
        pacer: its ranks that ran out of inputs would not shadow this step(), and the others'
        all_gather waited for them until the process group's timeout (30 min on gloo). A Join
        that ended before a pause() (around an eval loop) is not one: pause() marks the
        configs it finds as seen."""
        own_joined = self._join_config is not self._own_join_seen and self._join_config.enable
        self._own_join_seen = self._join_config
        for model, seen in list(self._models.items()):
            config = model._join_config
            if config is seen.join_config:
                continue
            seen.join_config = config
            if config.enable and not own_joined:
                raise ValueError("the DDP model this pacer paces is in a Join without the "
                                 "pacer: pass both, Join([ddp_model, pacer]), so that a rank "
                                 "that ran out of inputs also shadows pacer.step(). (A Join "
                                 "around an eval loop alone, ended: call pacer.pause() after "
                                 "the Join's block)")

    def _compare_site_names(self) -> None:
        """Every rank at the same step (a collective): warns when the ranks' paced sites
        have other names. Not inside a CUDA-graph capture, which every rank skips alike."""
        if self.world_size == 1 or self._alone:
            return
        if self.backend == "device" and torch.cuda.is_current_stream_capturing():
            return
        try:
            why = site_names_differ(self.site_names, self.join_process_group,
                                    self.join_device, self.world_size)
        except RuntimeError as e:  # a peer gone: as the step's own exchange says it
            raise exchange_error(e) from e
        if why:
            self._warn_once("site_names", why)

    def _check_loaded_sites(self) -> None:
        saved, wait = self._loaded_sites
        if wait > 1:
            self._loaded_sites = (saved, wait - 1)
            return
        self._loaded_sites = None
        cap = self.config.max_sites  # the state holds at most max_sites sites, a step more
        if min(self._sites_this_step, cap) != min(saved, cap):
            self._warn_once("loaded_sites", f"gpupace: the checkpoint loaded holds {saved} "
                            f"paced sites and this step has {self._sites_this_step}: sites are "
                            "matched by order, so what was learnt at one DDP bucket now paces "
                            "another (the model, its bucket_cap_mb or its dtypes changed?); "
                            "start without the checkpoint's pacer state if so")

    def _resume_at(self, steps: int) -> None:
        """Numbers this fresh pacer's steps on from `steps`, a checkpoint's count (a second
        load before any step takes the second's, with its state)."""
        self.steps = self._resumed_at = steps
        self._first_measured = steps + self.config.warmup_steps
        if self._writer is not None:  # the report's warm-up: the header says where it ends
            self._header.update(resumed_at_step=steps, first_measured_step=self._first_measured)
            try:
                self._writer.restate_header(self._header)
            except (OSError, RuntimeError, ValueError) as e:  # a full disk: on this rank alone
                self._telemetry_failed(e)
        if self._tb is not None:
            self._tensorboard(lambda tb: tb.resume_at(steps))

    def _check_between_steps(self, what: str) -> None:
        self.check_group()
        if self._engine is None:
            raise RuntimeError(f"{what}() on a copied pacer, which paces nothing")
        if self._sites_this_step:
            raise RuntimeError(f"{what}() inside a step ({self._sites_this_step} paced "
                               "collectives since the last step()): call it between steps, "
                               "after pacer.step()")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{what}() inside a CUDA graph capture: it synchronises; call it "
                               "outside the captured step")

    @property
    def next_delays_us(self):
        """This rank's delays for the next step, one per site the policy holds (a copy; 0 at
        sites past the last step's count, which keep their state until they come back); none
        for a copied pacer, which paces nothing."""
        return self._engine.next_delays() if self._engine is not None else np.zeros(0)

    def attach(self, ddp_model, hook: Callable[..., Any] | None = None) -> None:
        """Paces `ddp_model`'s gradient buckets: registers `gpupace.ddp_comm_hook`, or `hook`,
        a hook of the same signature that calls it (`gpupace demo`'s watches its futures).
        The hook reduces over the pacer's group, so that must be the model's: a DDP model on a
        data-parallel subgroup (tensor or pipeline parallelism beside it) needs
        `Pacer(..., group=ddp_model.process_group)`, or its gradients would be averaged with
        other shards'. The hook refuses to run unless registered here, where that is checked.
        With `mode="off"` it registers nothing, `hook` neither: DDP reduces as it would without
        gpupace. One pacer may pace several models (a GAN's two): the first one's sites are
        "bucket{i}", the second's "model1.bucket{i}", and so on."""
        from .integrations.ddp import Attached, ddp_comm_hook
        if hook is not None and not callable(hook):
            raise TypeError(f"attach(hook=...) takes a comm hook, a function (state, bucket) -> "
                            f"Future that calls gpupace.ddp_comm_hook, got {type(hook).__name__}")
        self.check_group()
        # torch.compile(ddp_model) holds the DDP model; FSDP has a register_comm_hook too, whose
        # hooks take gradients, not buckets (it failed in backward with a TypeError)
        target = getattr(ddp_model, "_orig_mod", ddp_model)
        if not isinstance(target, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(f"attach() takes a torch.nn.parallel.DistributedDataParallel model, "
                            f"got {type(target).__name__}: wrap it first, "
                            f"DistributedDataParallel(model)")
        if getattr(target, "_use_python_reducer", False):
            raise ValueError(
                "this DDP model reduces its gradients in Python, a parameter at a time "
                "(torch._dynamo.config.optimize_ddp = 'python_reducer', set when it was "
                "built): its comm hooks get (grad, param) pairs, not buckets, which gpupace "
                "cannot pace (nor torch's own allreduce_hook). Build it under the default "
                "optimize_ddp: torch.compile(ddp_model) is paced there, bucket by bucket")
        theirs = getattr(target, "process_group", None)
        if theirs is not None:
            ours = self.group if self.group is not None else dist.group.WORLD
            mine, model = dist.get_process_group_ranks(ours), dist.get_process_group_ranks(theirs)
            if mine != model:
                raise ValueError(
                    f"the DDP model reduces over ranks {_ranks_text(model)} and this pacer over "
                    f"{_ranks_text(mine)}: build it with Pacer(..., group="
                    f"ddp_model.process_group), or the paced gradients would be averaged over "
                    f"the wrong ranks")
        if not self.enabled:
            return
        why = _device_mismatch(getattr(target, "device", None), getattr(self._engine, "device", None))
        if why:
            raise ValueError(why)
        used = {m.number for m in self._models.values()}  # of the models alive: a re-wrapped
        number = min(set(range(len(used) + 1)) - used)  # model's number is free again
        prefix = f"model{number}." if number else ""
        try:
            target.register_comm_hook(Attached(self, prefix), hook or ddp_comm_hook)
        except RuntimeError as e:
            if "only be called once" not in str(e):
                raise
            raise RuntimeError("this DDP model already has a comm hook (an earlier attach(), "
                               "or one such as fp16_compress_hook): DDP takes one, and gpupace "
                               "paces through its own, so the two cannot be combined") from e
        self._hooked = True
        self._models[target] = _AttachedModel(number, target._join_config)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (`copy.deepcopy`, `pickle`, `torch.save` of a DDP model whose comm hook this
        pacer is) is inert: it keeps the settings, with mode "off", and the records, not the
        process group, the engine or the telemetry file, which belong to this process. (DDP
        does not re-register a hook on the model it unpickles: the copy's reducer is DDP's
        own.)"""
        state = dict(self.__dict__)
        state.update(config=self.config.replace(mode="off", telemetry_path=""), group=None,
                     _engine=None, _writer=None, _tb=None, _closed=True, _world=None,
                     _models=None, _collected=None, _join_hook=None)
        return state

    def close(self) -> None:
        """Collects what the device still holds (waiting `CLOSE_DRAIN_S` at most for its
        queued work; `ERROR_DRAIN_S` at the end of a with block on an error, or at an exit on
        one), flushes and closes the telemetry file, whose last line then says the run was
        closed (a file without one was cut short). Safe to call twice. A pacer left unclosed
        is closed so at exit, or when it is collected (waiting `ERROR_DRAIN_S` at most)."""
        self._close("closed")

    def _close(self, how: str, drain_s: float | None = None) -> None:
        """Closes as `how` says the run ended, waiting `drain_s` at most for the device (by
        default as long as `how` allows: `_drain_bound`)."""
        if drain_s is None:
            drain_s = _drain_bound(how)
        if not self._end["how"].startswith("error"):  # a failed step() said how first
            self._end["how"] = how
        self._closed = True
        if self._collected is not None:
            self._collected.detach()  # closed here: nothing left for collection to close
        try:
            if self._writer is not None or self._tb is not None:
                self._drain(drain_s)
        except RuntimeError as e:  # a CUDA error: the file still gets its end line
            warn(f"gpupace: could not read the telemetry records still on the device: {e}")
        finally:  # Ctrl-C in the drain's wait too
            if self._writer is not None:
                writer, self._writer = self._writer, None
                try:
                    writer.close()
                except (OSError, RuntimeError) as e:
                    self._telemetry_failed(e)
            if self._tb is not None:
                self._tensorboard(lambda tb: tb.close())
                self._tb = None

    def __enter__(self) -> Pacer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._close(failure_of(exc) or "closed")


class _Paced:
    """The block of one paced collective (`Pacer.collective`). A class, not a generator: it
    runs once a collective, and two nested generator context managers cost ~3 us of the
    ~10 us that a collective's Python took on the 2-core VM (bench/cpu_host_path.py)."""

    __slots__ = ("_pacer", "_engine", "_name", "_async", "_issue", "_ticket", "_issued")

    def __init__(self, pacer: Pacer, name: str, async_op: bool):
        self._pacer, self._engine, self._name, self._async = pacer, pacer._engine, name, async_op
        self._issued = False

    def __enter__(self) -> Callable:
        self._issue = self._engine.issue(sync=not self._async)
        self._issue.__enter__()
        try:
            self._ticket = self._pacer._arrive(self._name)
        except BaseException as e:
            if not self._issue.__exit__(type(e), e, e.__traceback__):
                raise
        self._pacer._open_blocks += 1  # step() inside the block is refused
        return self._issued_async if self._async else _UNPACED.issued

    def _issued_async(self, work: Any) -> None:
        """Right after issuing the async collective, with its work handle: the exit is stamped
        when it completes. (A synchronous block's exit is stamped when the block ends.)"""
        if work is not None and not hasattr(work, "get_future"):  # None: done already
            raise TypeError(f"issued() takes the work handle of the collective issued with "
                            f"async_op=True, got {type(work).__name__}")
        self._issued = True
        self._engine.leave(self._ticket, work)

    def __exit__(self, *exc: Any) -> bool | None:
        self._pacer._open_blocks -= 1
        if exc[0] is not None:  # the telemetry's end line says so, unless the run goes on
            self._pacer._end["how"] = failure_of(exc[1]) or self._pacer._end["how"]
        try:
            if not self._async:
                self._engine.leave(self._ticket)
        except BaseException as e:
            self._issue.__exit__(type(e), e, e.__traceback__)
            raise
        done = self._issue.__exit__(*exc)
        if self._async and not self._issued and exc[0] is None:
            # its exit is never stamped: the site's wait unknown, unpaced, for the whole run
            raise RuntimeError(f"pacer.collective({self._name!r}, async_op=True): the block "
                               "ended without issued(work); call issued() with the collective's "
                               "work handle right after issuing it (None if it returned none)")
        return done


class _Unpaced:
    """`Pacer.collective` with pacing off: nothing, and an `issued` that does nothing."""

    def __enter__(self) -> Callable:
        return self.issued

    def issued(self, work: Any = None) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        return None


_UNPACED = _Unpaced()


@dataclass(slots=True)
class _AttachedModel:
    """A DDP model attach() took: its number (the second one's sites are "model1.bucket{i}")
    and the Join config it had when last looked at (a Join replaces its joinables' configs,
    and never puts them back)."""

    number: int
    join_config: Any


def _drain_bound(how: str) -> float:
    """How long closing waits for the device's queued work, by how the run ended."""
    return ERROR_DRAIN_S if how.startswith("error") else CLOSE_DRAIN_S


_exit_deadline: list[float] = []  # one for every pacer closed at exit, set by the first


def _close_at_exit(pacer_ref: weakref.ref) -> None:
    pacer = pacer_ref()
    if pacer is None or pacer._closed:
        return
    how = exit_failure() or "exit"
    if not _exit_deadline:
        _exit_deadline.append(time.monotonic() + _drain_bound(how))
    try:
        pacer._close(how, max(_exit_deadline[0] - time.monotonic(), 0.0))
    except KeyboardInterrupt:  # a second Ctrl-C cuts the wait short: the file is closed, and
        pass  # the other exit finalizers (other pacers' files) still run


def _close_collected(engine: Any, writer: TelemetryWriter, every: int) -> None:
    """A pacer's close when it is collected unclosed: what `_close` does, without the pacer
    (the finalizer must not hold it), its ring or TensorBoard, waiting `ERROR_DRAIN_S` at most
    (a collection may come anywhere, and a Ctrl-C in a finalizer is only printed)."""
    try:
        drain = getattr(engine, "drain", None)
        for record in drain(ERROR_DRAIN_S) if drain is not None else ():
            if record.step % every == 0:
                writer.write(record)
    except (OSError, RuntimeError) as e:  # a CUDA error, a failed writer: close all the same
        warn(f"gpupace: the telemetry records still on the device were not all written: {e}")
    finally:
        with contextlib.suppress(OSError, RuntimeError):  # its failure was warned about
            writer.close()


class _PacerJoinHook(JoinHook):
    """A joined rank's share of each step: the pacer's step (see `Pacer.join_hook`)."""

    def __init__(self, pacer: Pacer):
        self.pacer, self.ended = pacer, False

    def main_hook(self) -> None:
        # Once per forward pass of the other ranks, who step once per optimizer step: with
        # gradient accumulation (no_sync), DDP's join hook shadows only the passes that sync,
        # through the pacing hook; the step follows those alone. A pacer that paces no DDP
        # model (a model with its own comm hook) steps every pass.
        pacer = self.pacer
        if pacer._sites_this_step or not pacer._hooked:
            pacer.step()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.ended = True  # every rank has joined: the Join ends (its object may live on)


def _joinables_of_the_join() -> list | None:
    """The joinables of the Join being made, from `Join.__init__`'s frame (it calls each one's
    join_hook before anything else), or None where it is not on the stack."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not Join.__init__.__code__:
        frame = frame.f_back
    return None if frame is None else frame.f_locals.get("joinables")


def _subgroup_ranks(group: Any) -> list[int] | None:
    """The global ranks of `group` when it is not the whole world (a data-parallel group of a
    job that also shards its model), else None."""
    if group is None or not (dist.is_available() and dist.is_initialized()):
        return None
    ranks = dist.get_process_group_ranks(group)
    return ranks if len(ranks) < dist.get_world_size() else None


def group_tag(ranks: list[int]) -> str:
    """A subgroup in file and folder names: its first and last global rank, the stride where it
    is not 1 (group2-3, group0-6s2), and a hash of the ranks where they are not evenly spaced;
    overlapping groups (a dense and an expert data-parallel group) get names of their own."""
    r = sorted(ranks)
    steps = {b - a for a, b in zip(r, r[1:], strict=False)}
    tag = f"group{r[0]}-{r[-1]}"
    if len(steps) == 1 and steps != {1}:
        tag += f"s{steps.pop()}"
    elif len(steps) > 1:
        tag += f"-{zlib.crc32(','.join(map(str, r)).encode()):08x}"
    return tag


def tensorboard_folder(folder: str | os.PathLike, subgroup: list[int] | None) -> str:
    """Where a pacer logs to TensorBoard: each data-parallel group's rank 0 in a folder of the
    group's, or TensorBoard interleaves the groups' points as one series. os.path.join, not
    Path: a gs:// or s3:// folder keeps its double slash."""
    folder = os.fspath(folder)
    return os.path.join(folder, group_tag(subgroup)) if subgroup else folder


def telemetry_file(path: str, global_rank: int, subgroup: list[int] | None) -> str:
    """The file a writing rank opens: `{rank}` filled with its global rank; on a subgroup, a
    path without `{rank}` takes the group's name (run.jsonl -> run.group2-3.jsonl): every
    group's rank 0 writes, and one file for all had kept one group's and renamed the others'
    as earlier runs. A folder (".", "runs/") is left as it is: the writer refuses it, and the
    Pacer warns."""
    if per_rank_path(path) or subgroup is None:
        return fill_rank(path, global_rank)
    p = Path(path)
    if names_a_folder(path) or p.is_dir():
        return path
    return str(p.with_name(f"{p.stem}.{group_tag(subgroup)}{p.suffix}"))


# The header fields a Pacer writes beside make_header's
PACER_HEADER_FIELDS = ("samples_per_step", "process_group_backend", "pacer_backend",
                       "telemetry_every", "global_rank", "group_ranks", "resumed_at_step",
                       "run_id")


def _world_size_env() -> int:
    """The WORLD_SIZE a launcher (torchrun, SLURM's wrappers) sets, or 1."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _check_extra(extra: Any) -> None:
    """A ValueError for a `telemetry_extra` that is no dict of names, or that sets a field the
    header has of its own (a "format" or "config" of the user's made the file unreadable, or
    failed on the writing rank alone)."""
    if extra is None:
        return
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise ValueError(f"telemetry_extra must be a dict with string keys, got {extra!r:.60}")
    taken = [k for k in extra if k in HEADER_FIELDS or k in PACER_HEADER_FIELDS]
    if taken:
        raise ValueError(f"telemetry_extra sets {taken}, which the telemetry header holds of its "
                         f"own: give those values other names (e.g. 'train_{taken[0]}')")


def _device_mismatch(model: Any, engine: Any) -> str | None:
    """Why a DDP model on `model` cannot be paced by a device engine on `engine`, or None. The
    hook's kernels launch on the engine's GPU, whose stream would not be the gradients' (and
    every rank of a node on cuda:0, its first exchange fails in NCCL)."""
    if not (isinstance(model, torch.device) and isinstance(engine, torch.device)):
        return None
    if model.type != "cuda" or engine.type != "cuda" or model == engine:
        return None
    return (f"the DDP model is on {model} and this pacer's device backend on {engine} (the "
            f"group's bound device, else the current one when the pacer was made): call "
            f"torch.cuda.set_device({model.index}) before making the Pacer, and where the group "
            f"is bound, init_process_group(device_id=torch.device('cuda', {model.index}))")


def _ranks_text(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ... {ranks[-1]}] ({len(ranks)})"
