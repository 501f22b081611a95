"""Per-step telemetry: the record format, a bounded in-memory ring, and the JSON-lines writer
and reader (the run summary is in `gpupace.summary`).

File format (JSON lines), shared by `Pacer`, `gpupace demo` and the simulator:
  line 1, the header: {"gpupace": "telemetry", "format": 1, "source", "label", "rank",
      "world_size", "sites", "config", "versions", "host", "started"}, and optional fields:
      "first_measured_step" (where the figures start; else the config's warmup_steps),
      "resumed_at_step" (a Pacer loaded from a checkpoint: its first step's number),
      "run_id" (a Pacer's, the same in each rank's file of one run), ...
  then one line per step, a `StepRecord`: scalars for the whole step plus per-rank lists
  (every rank holds the gathered matrix, so one file describes every rank).
The writer hands its lines to the OS whenever it has caught up with the steps (a killed
process loses only what was still queued) and fsyncs every `telemetry_interval` records (a
machine that goes down loses at most that many).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import multiprocessing.util
import os
import platform
import queue
import socket
import stat
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
from numba import njit

from .jit import compile_once
from .warn import warn

if TYPE_CHECKING:
    from .policy import StepStats

FORMAT_VERSION = 1


def _empty() -> np.ndarray:
    return np.empty(0)


@dataclass(slots=True)
class StepRecord:
    """One step. Times in microseconds; per-rank arrays (float64, NaN where unknown) are
    indexed by rank. Arrays, not lists: a pacer makes a record every step on every rank, and
    at 4096 ranks x 4 sites four lists of Python floats took 424 us to make and 32 bytes a
    value to keep, against 137 us and 8 bytes (timed side by side on the 2-core VM). Lists
    given to the constructor are kept as given; `from_dict` makes arrays."""

    step: int
    time_s: float  # seconds since the run started, on the writer's clock
    step_time_us: float  # exit-to-exit interval of the writer's first site (NaN on the first step)
    spread_us: float  # arrival spread at the site where it was largest
    residual_us: float  # entry spread after pacing at that site
    transfer_us: float  # transfer estimate (min wait) at that site
    straggler: int  # last natural arrival at that site, -1 if unknown
    active: bool  # pacing engaged at any site
    earliness_us: np.ndarray = field(default_factory=_empty)  # per rank, at that site; NaN: invalid row
    wait_us: np.ndarray = field(default_factory=_empty)  # per rank, summed over sites
    delay_us: np.ndarray = field(default_factory=_empty)  # per rank, applied, summed over sites
    step_times_us: np.ndarray = field(default_factory=_empty)  # per rank
    site_spread_us: np.ndarray = field(default_factory=_empty)  # per site
    dropped_before: int = 0  # records the writer dropped just before this one (it fell behind)

    def __eq__(self, other: object) -> bool:
        """Field by field, arrays by value (the generated one would ask an array for its truth)."""
        if not isinstance(other, StepRecord):
            return NotImplemented
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, (np.ndarray, list)) or isinstance(b, (np.ndarray, list)):
                if not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    def to_json(self, chunk: int = 0) -> str:
        """One JSON line. `chunk` > 0 encodes long lists `chunk` values at a time and lets
        other threads run in between: the background writer's way to keep each hold of the
        GIL short (one json.dumps of a 4096-rank record holds it for ~8 ms). Same text."""
        # JSON has no NaN or infinity: they are written as null (and read back as NaN). A
        # record holds numbers only, so replacing the tokens in the dumped text is exact and,
        # at 4096 ranks, ~10x cheaper than asdict() and a Python pass over every value.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if chunk > 0:
            text = "{" + ",".join(f'"{k}":{_dumps_chunked(v, chunk)}' for k, v in fields.items()) + "}"
        else:
            text = json.dumps({k: _as_list(v) for k, v in fields.items()}, separators=(",", ":"))
        if "NaN" in text or "Infinity" in text:
            text = text.replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING} - set(d)
        if missing:
            raise ValueError(f"step record lacks fields {sorted(missing)}")
        return cls(**{k: _from_json(k, v) for k, v in d.items() if k in names})


# Decimals of the microseconds an array is written with: 1 ns, below any clock gpupace reads.
# Shorter numbers halve json.dumps' time (16384 values: 13.9 -> 6.2 ms on the 2-core VM).
WRITTEN_DECIMALS = 3


def _as_list(value: Any) -> Any:
    """An array as the list JSON writes (rounded to `WRITTEN_DECIMALS`); anything else as is."""
    return np.round(value, WRITTEN_DECIMALS).tolist() if isinstance(value, np.ndarray) else value


def _dumps_chunked(value: Any, chunk: int) -> str:
    """json.dumps(value), a long array or list `chunk` items per call with a GIL release
    between."""
    if not isinstance(value, (list, np.ndarray)) or len(value) <= chunk:
        return json.dumps(_as_list(value), separators=(",", ":"))
    parts = []
    for i in range(0, len(value), chunk):
        part = value[i:i + chunk]
        part = _as_list(part)
        parts.append(json.dumps(part, separators=(",", ":"))[1:-1])
        time.sleep(0)  # releases the GIL: a waiting training thread runs now
    return "[" + ",".join(parts) + "]"


def json_safe(obj: Any) -> Any:
    """`obj` for strict JSON, which has no NaN or infinity: those are written as null (and read
    back as NaN); NumPy scalars and arrays as Python numbers and lists."""
    if isinstance(obj, np.generic | np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    return obj


# What each field of a record read from JSON may hold (a hand-edited or foreign file): a
# wrong one makes the record unreadable, skipped with the field named, not a crash later.
_INT_FIELDS = {"step", "straggler", "dropped_before"}
_LIST_FIELDS = {"earliness_us", "wait_us", "delay_us", "step_times_us", "site_spread_us"}


def _from_json(name: str, v: Any) -> Any:
    """A field read from JSON: null is NaN; a list becomes a float64 array (null as NaN).
    Raises ValueError for a value of the wrong kind, naming the field."""
    if name in _LIST_FIELDS:
        if not isinstance(v, list):
            raise ValueError(f"{name} must be a list of numbers, got {v!r:.40}")
        try:
            a = np.array(v, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a list of numbers or null, got {v!r:.40}") from None
        if a.ndim != 1:
            raise ValueError(f"{name} must be a list of numbers, got {a.ndim} dimensions")
        return a
    if name in _INT_FIELDS:
        # int64's range: the report keeps them in int64 arrays (a corrupt 10**20 stopped it)
        if not isinstance(v, int) or isinstance(v, bool) or not -2**63 <= v < 2**63:
            raise ValueError(f"{name} must be a 64-bit integer, got {v!r:.40}")
        return v
    if name == "active":
        if not isinstance(v, bool):
            raise ValueError(f"active must be true or false, got {v!r:.40}")
        return v
    if v is None:
        return float("nan")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{name} must be a number or null, got {v!r:.40}")
    return v


def first_measured_step(header: dict[str, Any]) -> int:
    """The first step that a run's figures count: the header's `first_measured_step` when the
    writer names one (the demo: where a fresh pacer has settled), else its config's
    `warmup_steps` (compilation, autotuning, allocator, DDP's bucket rebuild); 0 for a
    simulated run, which has no warm-up, or when the header says neither."""
    if header.get("source") == "sim":
        return 0
    v = header.get("first_measured_step")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:  # -5, NaN: none
        cfg = header.get("config")
        v = cfg.get("warmup_steps") if isinstance(cfg, dict) else None
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0


def failure_of(exc: BaseException | None) -> str | None:
    """An end line's `how` for a run ended by `exc`: "error: <its type>"; None for none, or for
    sys.exit() with status 0, which is a clean end."""
    if exc is None or isinstance(exc, SystemExit) and exc.code in (0, None):
        return None
    if isinstance(exc, SystemExit) and exc.__context__ is not None:
        return failure_of(exc.__context__)  # the error a handler turned into an exit status
    return f"error: {type(exc).__name__}"


def _uncaught() -> BaseException | None:
    """The exception a script's interpreter is exiting on (its traceback was printed, which
    sets sys.last_value), outside an interactive session or a test run, where sys.last_value
    is whatever traceback was shown last. (A multiprocessing child's finalizers run while its
    exception is handled: sys.exc_info() has that one.)"""
    if hasattr(sys, "ps1") or sys.flags.interactive or "IPython" in sys.modules \
            or "pytest" in sys.modules:
        return None
    return getattr(sys, "last_value", None)


def positive_number(v: Any) -> bool:
    """Whether a header's value `v` is a finite number > 0 (not a bool)."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v > 0)


def header_batch(header: dict[str, Any]) -> tuple[str, float] | None:
    """A file's batch size as its header gives it: ("step", a pacer's `samples_per_step`,
    over all ranks) or ("rank", a simulated run's scenario `samples_per_rank`); None without
    either, or where the value is no finite number > 0 (throughput is then steps/s)."""
    if positive_number(v := header.get("samples_per_step")):
        return "step", float(v)
    sim = header.get("sim")
    v = (sim.get("scenario") or {}).get("samples_per_rank") if isinstance(sim, dict) else None
    return ("rank", float(v)) if positive_number(v) else None


def unended(last_step: int) -> str:
    """What a file whose header promised an end line and that has none says (the report and
    the simulator's fit say it alike)."""
    return (f"no end mark: its writer stopped after step {last_step} (the rank was killed or "
            "crashed, its disk filled, or the run is still going)")


def comm_backend(header: dict[str, Any]) -> str:
    """The collective backend a file's run used: "nccl", "gloo", "mpi", "sim", or "" when the
    header does not say. Read from the header's `process_group_backend` (the Pacer records it;
    older files lack it); else a simulated run is "sim", and a run whose torch is a CPU-only
    build ("+cpu") used gloo (such a build has no NCCL, and MPI needs a source build)."""
    for key in ("process_group_backend", "backend"):
        v = header.get(key)
        if isinstance(v, str) and v.lower() in ("nccl", "gloo", "mpi"):
            return v.lower()
    if header.get("source") == "sim":
        return "sim"
    torch_version = str((header.get("versions") or {}).get("torch", ""))
    return "gloo" if torch_version.endswith("+cpu") else ""


def exit_failure() -> str | None:
    """`failure_of` the exception this process is exiting on, as far as it can be told (an
    exit finalizer's view: see `_uncaught`); None for a clean exit."""
    return failure_of(sys.exc_info()[1] or _uncaught())


# The fields of a file's end line (`TelemetryWriter`'s `end`): the steps its owner ran, how
# it ended, and what the writer wrote and dropped.
END_FIELDS = ("gpupace", "steps", "how", "records", "dropped")
# The fields every header has (make_header's own): `extra` must not set them.
HEADER_FIELDS = ("gpupace", "format", "source", "label", "rank", "world_size", "sites", "config",
                 "versions", "host", "started")


def make_header(*, source: str, world_size: int, rank: int = 0, label: str = "",
                sites: Iterable[str] = (), config: dict[str, Any] | None = None,
                **extra: Any) -> dict[str, Any]:
    """The first line of a telemetry file; `extra` adds fields (a demo's scenario, say), none
    of HEADER_FIELDS."""
    versions: dict[str, str] = {"python": platform.python_version()}
    for mod in ("torch", "numpy", "gpupace"):
        try:
            versions[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            pass
    return {
        "gpupace": "telemetry",
        "format": FORMAT_VERSION,
        "source": source,
        "label": label,
        "rank": rank,
        "world_size": world_size,
        "sites": list(sites),
        "config": config or {},
        "versions": versions,
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }


# Values encoded per hold of the GIL by the background writer: ~0.3 ms on the 2-core VM.
GIL_CHUNK = 512
BACKLOG_WARN_MB = 64  # memory of queued records past which the background writer warns, once
BACKLOG_LIMIT_MB = 256  # ... and past which it drops records, counted in the next one written
CLOSE_NOTICE_MB = 16  # queued at close() past which it says it is writing them (~0.5 s at 4096)
# close() waits for the writer's thread while it writes; past this long without a record
# written (a hung file system) it gives the rest up, so that the rank can exit.
CLOSE_STALL_S = 60.0


def names_a_folder(path: str | os.PathLike) -> bool:
    """Whether a path's text names a folder whatever is on disk ("runs/", "runs/.", ".", "..").
    A pathlib.Path has lost a trailing slash already: only a str shows it."""
    text = os.fspath(path)
    return text.endswith(("/", os.sep)) or os.path.basename(text) in ("", ".", "..")


def _blocks_on_open(path: Path) -> bool:
    """Whether opening `path` to write could wait for another process (a FIFO, a socket)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def keep_aside(path: Path) -> Path | None:
    """Renames a non-empty file at `path` to `<name>.1` (or the first free `<name>.<k>`, which
    `gpupace report DIR` leaves out with its *.jsonl) and returns the new path; None when
    there is nothing to keep."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    k = 1
    while (kept := path.with_name(f"{path.name}.{k}")).exists():
        k += 1
    path.rename(kept)
    return kept


# The files this process's open writers write. A background writer stays open until closed
# (its thread and its exit finalizer hold it); a plain one dropped unclosed leaves.
_writing: weakref.WeakValueDictionary[Path, TelemetryWriter] = weakref.WeakValueDictionary()


def _disown_in_child() -> None:
    """After a fork, in the child: every writer is the parent's (`TelemetryWriter._disown`)."""
    for writer in list(_writing.values()):
        writer._disown()
    _writing.clear()


os.register_at_fork(after_in_child=_disown_in_child)


def _held(path: Path) -> bool:
    """Whether an open writer of this process writes `path`. A Pacer dropped unclosed closes its
    writer when it is collected (`Pacer.__init__`): once, the collector runs to find out."""
    if _writing.get(path) is None:
        return False
    gc.collect()
    return _writing.get(path) is not None


class TelemetryWriter:
    """Appends records to a JSON-lines file; flushes (and fsyncs) every `interval` records.

    `background=True` moves the encoding and the file writes to a thread: `write` only queues
    the record, so the training thread does not wait for them (at 4096 ranks a record takes
    8-9 ms to encode on the 2-core VM, which would make the writing rank a straggler every
    step); it still shares the GIL with the thread, which encodes in chunks. The thread
    keeps the order; `close()` (also run at interpreter exit, and at the end of a multiprocessing
    child, forked ones included) writes everything still queued.
    A failure in the thread is raised by the next `write`, `flush` or `close`.

    `end`: the fields of the file's last line, `{"gpupace": "end", ...}`, which `close()`
    writes after the last record when everything reached the file (its owner keeps them up to
    date: steps run, how it ended). The header then says one is due (`end_mark`): a file
    without it was cut short (a killed or crashed rank, a full disk), which the report says."""

    def __init__(self, path: str | os.PathLike, header: dict[str, Any], interval: int = 50, *,
                 background: bool = False, keep_previous: bool = False,
                 end: dict[str, Any] | None = None):
        if names_a_folder(path):  # Path() drops "/" and "/.": a file "runs" was made
            raise IsADirectoryError(f"telemetry path {str(path)!r} names a folder: give a file "
                                    "path, such as runs/run.jsonl")
        self.path = Path(path)
        if _held(self.path.resolve()):  # kept aside, it would go on being written as .1
            raise FileExistsError(f"{self.path} is being written by another telemetry writer "
                                  "of this process (two Pacers given one telemetry_path?)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # it said FileExistsError: '/etc/passwd'
            raise NotADirectoryError(f"telemetry path {str(path)!r}: a part of its folder, "
                                     f"{str(self.path.parent)!r}, is a file") from None
        if _blocks_on_open(self.path):  # a FIFO: open() waited for a reader, for ever
            raise ValueError(f"telemetry path {str(path)!r} is a FIFO or socket, not a file")
        self.interval = interval
        self.end = end
        # A restarted job given the same path keeps the run before (a Pacer's file), renamed
        # to path.1 (the first free number), instead of writing over it.
        self.kept: Path | None = keep_aside(self.path) if keep_previous else None
        self._pending = 0
        self._resolved = self.path.resolve()
        self._file: TextIO | None = open(self.path, "w", encoding="utf-8")
        try:
            self._start(header, background)
        except BaseException:  # the header could not be written (a full disk): no open file
            with contextlib.suppress(OSError):  # its close flushes, and fails again
                self._file.close()
            _writing.pop(self._resolved, None)
            raise

    def _start(self, header: dict[str, Any], background: bool) -> None:
        """The rest of `__init__`, once the file is open: the header, the thread."""
        self._pid = os.getpid()  # a forked child's copy of this writer is not its own
        self.written = 0  # records written to the file (the thread's progress, for close)
        _writing[self._resolved] = self
        # default=str: a Path or a NumPy scalar in the caller's `telemetry_extra` is written as
        # text rather than failing on the writing rank alone (the others would go on).
        self._file.write(self._header_line(header))
        self._took_records = False  # `write` was called: the header can no longer change
        self._given_up = False  # close() stopped waiting for a stuck thread
        self._lock = threading.Lock()  # the file, between the thread and flush/close
        self._error: BaseException | None = None
        self._queue: queue.SimpleQueue | None = None
        self._warned_behind = False
        self.dropped = 0  # records dropped because the queue was full
        self._dropped_told = 0  # of which counted in a record queued since
        self._record_mb = 0.0  # the last record's size in memory, estimated
        self._thread: threading.Thread | None = None
        self.flush()
        if background:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, name="gpupace-telemetry",
                                            daemon=True)
            self._thread.start()
            # Run at interpreter exit by multiprocessing's own atexit hook, and at the end of a
            # forked or fork-server child (os._exit, no atexit) by its bootstrap: either way
            # the queued records are written.
            self._finalizer = multiprocessing.util.Finalize(None, self.close, exitpriority=0)

    def _header_line(self, header: dict[str, Any]) -> str:
        promise = {"end_mark": True} if self.end is not None else {}
        return json.dumps(json_safe({**header, **promise}), default=str) + "\n"

    def restate_header(self, header: dict[str, Any]) -> bool:
        """Writes `header` over the file's, if no record has come yet (a resumed pacer's, whose
        step count is known after its file was opened); False, and nothing written, after."""
        if self._file is None or self._took_records:
            return False
        with self._lock:  # no record queued: the thread writes nothing
            self._file.seek(0)
            self._file.truncate()
            self._file.write(self._header_line(header))
            self._flush()
        return True

    def write(self, record: StepRecord) -> None:
        if self._file is None:
            raise ValueError(f"telemetry file {self.path} is closed")
        self._raise_failure()
        self._took_records = True
        if self._queue is not None:
            self._record_mb = record_bytes(len(record.earliness_us),
                                           len(record.site_spread_us)) / 1e6
            behind = self._queue.qsize() * self._record_mb
            if behind > BACKLOG_LIMIT_MB:  # bounded memory: drop, and say so in the file
                self.dropped += 1
                return
            if self.dropped > self._dropped_told:
                record = dataclasses.replace(record, dropped_before=self.dropped - self._dropped_told)
                self._dropped_told = self.dropped
            self._queue.put(record)
            if not self._warned_behind and behind > BACKLOG_WARN_MB:
                self._warned_behind = True
                warn(
                    f"gpupace: the telemetry writer is {self._queue.qsize()} records behind "
                    f"({self.path}): steps come faster than it encodes them ("
                    f"{len(record.earliness_us)} ranks). Past {BACKLOG_LIMIT_MB} MB queued it "
                    f"drops records and counts them in the file; set telemetry_every "
                    f"(GPUPACE_TELEMETRY_EVERY) to write one step in 10 or 100.")
        else:
            self._write(record)

    def _write(self, record: StepRecord) -> None:
        line = record.to_json(chunk=GIL_CHUNK if self._thread is not None else 0) + "\n"
        with self._lock:
            self._file.write(line)
            self.written += 1
            self._pending += 1
            if self._pending >= self.interval:
                self._flush()

    def _drain(self) -> None:
        q = self._queue
        while (record := q.get()) is not None:
            try:
                self._write(record)
                if q.empty():  # caught up: the lines go to the OS, and a killed rank keeps them
                    with self._lock:  # (the steps before a hang are the ones to read)
                        self._file.flush()
            except BaseException as e:  # noqa: BLE001 - handed to the writing thread
                self._error = e
                return
        if self._given_up:  # close() stopped waiting for this thread: the file is its own
            with contextlib.suppress(OSError):
                self._close_file()

    def _join_while_writing(self) -> bool:
        """Waits for the thread to end while it goes on writing records; False once it has
        written none for CLOSE_STALL_S."""
        poll = min(1.0, CLOSE_STALL_S)
        seen, idle = self.written, 0.0
        while True:
            self._thread.join(poll)
            if not self._thread.is_alive():
                return True
            seen, idle = self.written, (idle + poll if self.written == seen else 0.0)
            if idle >= CLOSE_STALL_S:
                return False

    def _disown(self) -> None:
        """In a forked child: the file descriptor to /dev/null, so that the child's copy of the
        buffer, flushed when it exits, is not written a second time into the parent's file."""
        if self._file is not None:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._file.fileno())
            finally:
                os.close(null)

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"telemetry writer for {self.path} failed: {self._error!r}") \
                from self._error

    def flush(self) -> None:
        """Flushes what has been written so far (in background mode: what the thread has
        written so far)."""
        self._raise_failure()
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._pending = 0

    def close(self) -> None:
        if self._pid != os.getpid() or self._given_up:
            return  # a forked child's copy (`_disown`), or a file left to a stuck thread
        if self._thread is not None:
            if self._queue.qsize() * self._record_mb > CLOSE_NOTICE_MB:
                warn(f"gpupace: writing the {self._queue.qsize()} telemetry records "
                     f"still queued to {self.path}")
            self._queue.put(None)  # after every queued record
            done = self._join_while_writing()
            self._finalizer.cancel()
            if not done:
                self._given_up = True  # the thread closes the file, if it gets there
                _writing.pop(self._resolved, None)
                warn(f"gpupace: the telemetry writer wrote nothing to {self.path} for "
                     f"{CLOSE_STALL_S:.0f} s (a hung file system?): stopped waiting for the "
                     f"{max(self._queue.qsize() - 1, 0)} records still queued; the file keeps "
                     f"what reached it")
                if self._thread.is_alive():
                    return  # it holds the file, and maybe the lock
            self._thread = None
        if self.end is not None and self._error is None:
            self._write_end()
        self._close_file()
        if self.dropped > self._dropped_told:  # dropped after the last record written
            warn(f"gpupace: the telemetry writer dropped the last "
                 f"{self.dropped - self._dropped_told} records of {self.path}, falling "
                 f"behind the steps")
            self._dropped_told = self.dropped
        self._raise_failure()

    def _write_end(self) -> None:
        """The end line, after every record: `end`'s fields, what was written and dropped, and
        an exception the process exits on (an uncaught one sets sys.last_value) where the
        owner saw none."""
        end = dict(self.end)
        if end.get("how", "exit") == "exit":
            end["how"] = exit_failure() or "exit"
        end.update(records=self.written, dropped=self.dropped)
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps(json_safe({"gpupace": "end", **end}),
                                            default=str) + "\n")

    def _close_file(self) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._flush()
            finally:  # a failed flush or close (disk full) still frees the file and path
                file, self._file = self._file, None
                _writing.pop(self._resolved, None)
                file.close()


@dataclass(slots=True)
class Telemetry:
    """A header and the records of one run, as read from a file."""

    header: dict[str, Any]
    records: list[StepRecord]
    skipped: list[str]  # one line per unreadable line: "line N: why"
    end: dict[str, Any] | None = None  # the end line (`TelemetryWriter`'s `end`), if any


def read_telemetry(path: str | os.PathLike) -> Telemetry:
    """Reads a telemetry file. A missing or empty file, or a first line that is not a gpupace
    header, raises ValueError naming the file. Later lines that are cut short (a crash in the
    middle of a write) or corrupt are skipped and listed in `skipped`."""
    skipped: list[str] = []
    ends: list[dict[str, Any]] = []
    header = read_header(path)
    records = list(iter_records(path, skipped, ends))
    return Telemetry(header=header, records=records, skipped=skipped,
                     end=ends[-1] if ends else None)


def iter_records(path: str | os.PathLike, skipped: list[str],
                 ends: list[dict[str, Any]] | None = None) -> Iterator[StepRecord]:
    """The step records of a telemetry file one at a time, so that a reader that keeps arrays
    holds one record's lists at once, not the whole file's (Python lists take ~4x the JSON's
    size). Lines cut short or corrupt are appended to `skipped` ("line N: why"), end lines
    (`{"gpupace": "end", ...}`) to `ends`."""
    path = Path(path)
    with _open(path) as f:
        _header(f, path)
        for lineno, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if isinstance(obj, dict) and obj.get("gpupace") == "end":
                    if ends is not None:
                        ends.append(obj)
                    continue
                if isinstance(obj, dict) and obj.get("gpupace") == "telemetry":
                    skipped.append(f"line {lineno}: a second header (two runs in one file, "
                                   "joined by hand?): its records are read as the first's")
                    continue
                record = StepRecord.from_dict(obj)
            except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
                skipped.append(f"line {lineno}: {type(e).__name__}: {str(e)[:120]}")
                continue
            yield record


class NotTelemetry(ValueError):
    """A file whose first line is no gpupace telemetry header, or empty: another tool's (a
    gpupace writer writes its header as it opens the file), not a damaged or newer gpupace
    file; or one cut short inside its header, which holds no run either."""


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header of a telemetry file alone (its first line), checked as `read_telemetry` does."""
    path = Path(path)
    with _open(path) as f:
        return _header(f, path)


def _open(path: Path) -> TextIO:
    if path.is_dir():
        raise ValueError(f"telemetry file {path} is a directory: give one .jsonl file in it")
    if not path.exists():
        raise ValueError(f"telemetry file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"telemetry file {path} is not a regular file")
    return open(path, encoding="utf-8", errors="replace")


MAX_WORLD_SIZE = 1 << 20  # a header past it is corrupt (the simulator stops at 65536 ranks)
# Compressors' magic numbers as a first line read as UTF-8 with errors replaced shows them.
COMPRESSED = (("\x1f\ufffd", "gzip"), ("(\ufffd/\ufffd", "zstd"), ("\ufffd7zXZ", "xz"),
              ("BZh", "bzip2"))


def _compressed(first: str) -> str | None:
    return next((kind for magic, kind in COMPRESSED if first.startswith(magic)), None)


def _header(f: TextIO, path: Path) -> dict[str, Any]:
    first = f.readline()
    if not first.strip():  # a gpupace writer writes its header when it opens the file
        raise NotTelemetry(f"telemetry file {path} is empty")
    try:
        header = json.loads(first)
    except json.JSONDecodeError as e:
        if (kind := _compressed(first)) is not None:
            raise NotTelemetry(f"{path} is {kind}-compressed: decompress it first, gpupace "
                               "reads plain JSON lines") from None
        if first.startswith('{"gpupace": "telemetry"') and not first.endswith("\n"):
            raise NotTelemetry(f"{path} ends inside its header, cut short: its writer "
                               "stopped as it opened the file (no step was written)") from None
        raise NotTelemetry(f"{path}: line 1 is not a gpupace telemetry header ({e})") from None
    if not isinstance(header, dict) or header.get("gpupace") != "telemetry":
        raise NotTelemetry(f"{path}: line 1 is not a gpupace telemetry header")
    for name in ("format", "world_size", "rank"):  # what the reader sizes and sorts by
        v = header.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"{path}: header field {name!r} must be a non-negative integer, "
                             f"got {v!r:.40}")
    if (header.get("world_size") or 0) > MAX_WORLD_SIZE:  # null: not said, as if absent
        raise ValueError(f"{path}: header world_size {header['world_size']} is past the "
                         f"{MAX_WORLD_SIZE} ranks gpupace reads")
    if (header.get("format") or 0) > FORMAT_VERSION:
        raise ValueError(f"{path}: format {header.get('format')} is newer than this gpupace "
                         f"reads ({FORMAT_VERSION}); upgrade gpupace")
    return header


# A record's size in memory: float64 arrays, 8 bytes a value, and ~1 KB for the rest (the
# array headers and the scalars; tracemalloc: 1.0 KB at 2 ranks x 4 sites, 132 KB at 4096).
RECORD_BYTES_PER_VALUE = 8
RECORD_BYTES_FIXED = 1000


def record_bytes(world_size: int, n_sites: int) -> int:
    """A record's size in memory, estimated: four values per rank, one per site."""
    return RECORD_BYTES_FIXED + RECORD_BYTES_PER_VALUE * (4 * world_size + n_sites)


def ring_capacity(max_records: int, memory_mb: float, world_size: int, n_sites: int) -> int:
    """How many records a ring keeps: at most `max_records`, and as many as fit in
    `memory_mb` at this world size, at least one."""
    return max(1, min(int(max_records), int(memory_mb * 1e6 // record_bytes(world_size, n_sites))))


class Ring:
    """The last `capacity` records, for summaries without reading the file back."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._records: deque[StepRecord] = deque(maxlen=self.capacity)

    def append(self, record: StepRecord) -> None:
        self._records.append(record)

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


def make_record(step: int, time_s: float, stats: StepStats, steps: np.ndarray,
                rank: int) -> StepRecord:
    """A telemetry record from one policy update (`stats`, whose inputs it reads: make it
    before they change) and the step times: step scalars at the site of largest spread,
    per-rank arrays copied out of the update's buffers (which the next update reuses). Every
    rank makes one each step, so its arrays come from one compiled pass (`_record_arrays`):
    NumPy's ~20 calls took 75-90 us at 2 ranks and 0.44-0.48 ms at 4096 x 4 in
    bench/cpu_telemetry on the 2-core VM (cache left cold by the JSON encoding between)."""
    if not _record_ready:
        prepare_record()
    spread = stats.spread
    arrays = np.empty((4, len(stats.valid)))
    w, d, steps_us = stats.wait, stats.applied, np.asarray(steps, dtype=np.float64)
    try:
        s = _record_arrays(w, d, steps_us, spread, stats.lowest, stats.valid, arrays)
    except TypeError:  # read-only inputs (the NumPy update passes them through): copies
        w, d, steps_us, spread, lowest = (np.array(a, dtype=np.float64) for a in
                                          (w, d, steps_us, spread, stats.lowest))
        valid = np.array(stats.valid, dtype=bool)
        s = _record_arrays(w, d, steps_us, spread, lowest, valid, arrays)
    return StepRecord(
        step=step,
        time_s=time_s,
        step_time_us=float(steps[rank]),
        spread_us=float(spread[s]),
        residual_us=float(stats.residual[s]),
        transfer_us=float(stats.transfer[s]),
        straggler=int(stats.straggler[s]),
        active=bool(stats.active.any()),
        earliness_us=arrays[0],
        wait_us=arrays[1],
        delay_us=arrays[2],
        step_times_us=arrays[3],
        site_spread_us=spread.copy(),
    )


_record_ready = False  # set by `prepare_record`


def prepare_record() -> None:
    """Compiles `_record_arrays` for its one signature (or loads it from Numba's disk cache),
    then no other (`jit.compile_once`), as `policy.prepare_fused` does for the update: the
    host backend calls both when it starts, so that no compile lands in the step loop."""
    global _record_ready
    from numba import types as nt

    f, strided = nt.float64, nt.float64[:, :]
    compile_once(_record_arrays, (strided, strided, f[:], f[::1], f[:], nt.boolean[::1],
                                  f[:, ::1]))
    _record_ready = True


@njit(cache=True, nogil=True, error_model="numpy")
def _record_arrays(w, d, steps, spread, lowest, valid, out):
    """Fills out [4, N] with each rank's earliness at the site of largest spread (NaN for a
    rank the policy found invalid: not a tie with the last arrival), its wait and applied
    delay summed over sites (NaN counted as 0, as np.nansum) and its step time; returns that
    site, the first of largest spread (a NaN spread, fewer than 2 valid ranks, counts as -1)."""
    n, s = w.shape
    site, best = 0, -np.inf
    for k in range(s):
        x = spread[k] if spread[k] == spread[k] else -1.0
        if x > best:
            site, best = k, x
    lo = lowest[site]
    for i in range(n):
        tw, td = 0.0, 0.0
        for k in range(s):
            x, y = w[i, k], d[i, k]
            tw += x if x == x else 0.0
            td += y if y == y else 0.0
        out[0, i] = w[i, site] + d[i, site] - lo if valid[i] else np.nan
        out[1, i], out[2, i], out[3, i] = tw, td, steps[i]
    return site
