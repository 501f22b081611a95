"""Loads telemetry files for the report: one `Run` per run, its records as NumPy arrays.

Several files can describe one run: a `Pacer` with "{rank}" in its telemetry path writes one
file per rank, and each holds every rank's gathered rows, so the report reads the lowest
rank's file and lists the others. Files from different runs (a baseline and a paced run, a
real job and a simulated one) stay separate runs, in the order given.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from ..telemetry import (
    NotTelemetry,
    StepRecord,
    comm_backend,
    first_measured_step,
    header_batch,
    iter_records,
    positive_number,
    read_header,
    unended,
)

# Files at least this large get a heartbeat on stderr while they are read.
PROGRESS_BYTES = 5_000_000

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    """The default progress sink: one line on stderr."""
    print(f"gpupace report: {message}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class Run:
    """One run's telemetry as arrays. Times in us; per-rank arrays are [steps, ranks], NaN
    where a record left the array out (a record holding another number of ranks than the
    run's world size is skipped: `to_run`)."""

    label: str
    path: Path
    header: dict[str, Any]
    world_size: int
    skipped: list[str]
    other_files: list[Path]  # further rank files of this run, not read (same rows)
    step: np.ndarray
    time_s: np.ndarray
    step_time: np.ndarray
    spread: np.ndarray
    residual: np.ndarray
    transfer: np.ndarray
    straggler: np.ndarray  # int, -1 when unknown
    active: np.ndarray  # bool
    earliness: np.ndarray
    delay: np.ndarray
    site_spread: np.ndarray  # [steps, sites]
    notes: list[str] = field(default_factory=list)
    # How the run did not finish, in a few words ("" when it did, or its files cannot say):
    # a rank file without its end line, or an end on an error.
    unfinished: str = ""

    @property
    def steps(self) -> int:
        return int(self.step.size)

    @property
    def record_gap(self) -> int:
        """Steps from one record to the next: 1, or k where the writer kept one step in k
        (`telemetry_every`, from 128 ranks on): the header's, else the usual gap in the file
        (a file that lost records would read as written one step in 2)."""
        every = self.header.get("telemetry_every")
        if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
            return every
        gaps = np.diff(self.step)
        gaps = gaps[gaps > 0]
        return max(1, int(np.median(gaps))) if gaps.size else 1

    @property
    def mode(self) -> str:
        """The pacing mode from the header's config ("observe", "pace", ...), or "". A
        simulated run's config is the policy's even when it ran unpaced: its `sim.policy`
        decides."""
        sim = self.header.get("sim")
        if isinstance(sim, dict) and sim.get("policy"):
            return "observe" if sim["policy"] == "none" else "pace"
        cfg = self.header.get("config") or {}
        return str(cfg.get("mode", "")) if isinstance(cfg, dict) else ""

    @property
    def first_measured_step(self) -> int:
        """The first step the figures count, a step number (after a restart at step 100 and a
        warm-up of 5: 105): `telemetry.first_measured_step`."""
        return first_measured_step(self.header)

    @property
    def comm_backend(self) -> str:
        """The collective backend the run used, for wording advice (`telemetry.comm_backend`)."""
        return comm_backend(self.header)

    @property
    def gpus_per_node(self) -> int | None:
        """Ranks per node when the header says (the simulator's scenario, or a
        `gpus_per_node` entry a job added), else None."""
        sim = self.header.get("sim") or {}
        g = (sim.get("scenario") or {}).get("gpus_per_node") if isinstance(sim, dict) else None
        g = g if g is not None else self.header.get("gpus_per_node")
        return int(g) if isinstance(g, (int, float)) and g >= 1 else None

    @property
    def samples_per_step(self) -> float | None:
        """Samples per step when the header says, else None (throughput is then steps/s)."""
        batch = header_batch(self.header)
        if batch is None:
            return None
        per, value = batch
        return value if per == "step" else value * self.world_size


def _matrix(rows: list[list[float]], width: int) -> np.ndarray:
    out = np.full((len(rows), width), np.nan)
    for k, row in enumerate(rows):
        n = min(len(row), width)
        if n:
            out[k, :n] = np.asarray(row[:n], dtype=np.float64)
    return out


def to_run(label: str, path: Path, header: dict[str, Any], records: Iterable[StepRecord],
           skipped: list[str], other_files: Sequence[Path] = (),
           ends: Sequence[dict[str, Any]] = ()) -> Run:
    """Arrays from records, taken one at a time (a generator such as `iter_records` keeps one
    record's lists in memory at once). A record with an absurd time, or with per-rank arrays
    of another length than the run's world size (`_world_size`), is skipped and listed in
    `Run.skipped` after the unreadable lines: one such record made the report count 3 ranks
    in a 2-rank run, or a mean step of 300 digits. Raises ValueError when no step record
    could be read. `ends`: the file's end lines (`iter_records` fills it as it reads), which
    say whether and how the run ended."""
    scalars = {name: [] for name in _SCALARS}
    earliness, delay, site_spread, widths = [], [], [], []
    rejected: list[str] = []
    rejected_steps: list[int] = []  # recorded steps all the same, for `end_notes`
    dropped = 0
    for r in records:
        dropped += r.dropped_before  # the writer's count, whatever this record holds
        if why := _absurd(r):
            rejected.append(f"step {r.step}: {why}")
            rejected_steps.append(r.step)
            continue
        for name, values in scalars.items():
            values.append(getattr(r, name))
        earliness.append(np.asarray(r.earliness_us, dtype=np.float64))
        delay.append(np.asarray(r.delay_us, dtype=np.float64))
        site_spread.append(np.asarray(r.site_spread_us, dtype=np.float64))
        widths.append(tuple(len(getattr(r, name)) for name in _PER_RANK))
    world = _world_size(header, widths, path)
    fits = []
    for k, lengths in enumerate(widths):
        if why := _misfit(lengths, world):
            rejected.append(f"step {scalars['step'][k]}: {why}")
            rejected_steps.append(scalars["step"][k])
        else:
            fits.append(k)
    skipped = [*skipped, *rejected]
    if not fits:
        why = f"; {len(skipped)} lines skipped, first: {skipped[0]}" if skipped else ""
        raise NoRecords(f"{path}: no step records{why}")
    fits = np.asarray(fits, dtype=np.int64)
    steps = np.asarray(scalars["step"], dtype=np.int64)[fits]
    order = np.argsort(steps, kind="stable")
    # Two records of one step (two runs in one file: a restart appended to it, or files
    # joined by hand): the later in the file is kept, and the report says so.
    later = np.append(steps[order][1:] != steps[order][:-1], True)
    repeated = int(later.size - later.sum())
    order = fits[order[later]]

    def col(name: str, dtype=np.float64) -> np.ndarray:
        return np.asarray(scalars[name], dtype=dtype)[order]

    def matrix(rows: list[np.ndarray], width: int) -> np.ndarray:
        return _matrix([rows[k] for k in order], width)

    run = Run(
        label=label, path=path, header=header, world_size=world, skipped=skipped,
        other_files=list(other_files), step=col("step", np.int64), time_s=col("time_s"),
        step_time=col("step_time_us"), spread=col("spread_us"), residual=col("residual_us"),
        transfer=col("transfer_us"), straggler=col("straggler", np.int64),
        active=col("active", bool), earliness=matrix(earliness, world),
        delay=matrix(delay, world),
        site_spread=matrix(site_spread, max((site_spread[k].size for k in order), default=0)),
    )
    if repeated:
        run.notes.append(f"{path.name}: {repeated} records repeat the step number of an "
                         "earlier one (two runs in one file?): the later record of each step "
                         "is kept")
    if dropped:
        run.notes.append(f"{path.name}: the writer dropped {dropped} records, falling behind "
                         f"the steps; this report covers the {run.steps} written")
    gap = run.record_gap
    if gap > 1:
        from .spells import SPELL_STEPS  # here: spells reads Run from this module
        run.notes.append(f"{path.name}: one record in {gap} steps (the writer's "
                         f"telemetry_every): step-to-step figures are read between consecutive "
                         f"records, and late spells shorter than {SPELL_STEPS * gap} steps are "
                         f"not resolved")
    outside = int(((run.straggler < -1) | (run.straggler >= world)).sum())
    if outside:  # -1: none (fewer than two ranks known)
        run.notes.append(f"{path.name}: {outside} of {run.steps} records name a last rank "
                         f"outside ranks 0-{world - 1}: counted as no one's")
    if header.get("source") == "sim":  # the same run's figures differ between the two
        run.notes.append(f"{path.name}: simulated; every step is counted here, where `gpupace "
                         "simulate`'s table counts the second half (the policy's start left out)")
    run.notes += end_notes(path.name, header, ends[-1] if ends else None, run, dropped,
                           rejected_steps, unread=len(skipped) - len(rejected))
    given = header.get("first_measured_step")
    if given is not None and not (isinstance(given, (int, float))
                                  and not isinstance(given, bool) and given >= 0):
        run.notes.append(f"{path.name}: the header's first_measured_step {given!r:.40} is no "
                         f"step number: the figures start at step {run.first_measured_step} "
                         "(the config's warm-up)")
    size = header.get("world_size")
    if size is not None and _ranks(size) is None:
        run.notes.append(f"{path.name}: the header's world_size {size!r:.40} is no number of "
                         f"ranks: the records' {world} are counted")
    batch = header.get("samples_per_step")
    if batch is not None and not positive_number(batch) and run.samples_per_step is None:
        run.notes.append(f"{path.name}: the header's samples_per_step {batch!r:.40} is no "
                         "batch size: throughput is counted in steps/s")
    return run


def _ranks(v: Any) -> int | None:
    """`v` as a number of ranks (a whole number >= 1), or None."""
    return int(v) if positive_number(v) and v == int(v) else None


def end_notes(name: str, header: dict[str, Any], end: dict[str, Any] | None, run: Run,
              dropped: int = 0, skipped_steps: Sequence[int] = (), unread: int = 0) -> list[str]:
    """What a file's end line (or its absence, where the header promised one) says of the run:
    cut short, ended on an error, or steps that have no record. `skipped_steps`: steps whose
    records were skipped as implausible, which were recorded all the same; `unread`: lines
    skipped as unreadable, whose steps are unknown."""
    if not header.get("end_mark"):  # an older writer's file, or one written whole
        return []
    recorded = np.union1d(run.step, np.asarray(skipped_steps, dtype=np.int64))
    last = int(recorded[-1])
    if end is None:
        run.unfinished = f"{name} has no end mark after step {last}"
        return [f"{name}: {unended(last)}"]
    notes = []
    how, steps = str(end.get("how", "")), end.get("steps")
    if how.startswith("error"):
        run.unfinished = f"it ended on an error, {how.removeprefix('error: ')}"
        notes.append(f"{name}: the run ended on an error ({how.removeprefix('error: ')})"
                     + (f" after {steps} steps" if isinstance(steps, int) else ""))
    gap = run.record_gap
    inside = int(np.maximum(np.diff(recorded) - gap, 0).sum()) - dropped * gap
    # Records the writer dropped after its last written one are counted in the end line alone
    late_drops = end.get("dropped", 0) - dropped if isinstance(end.get("dropped"), int) else 0
    if late_drops > 0:
        notes.append(f"{name}: the writer dropped its last {late_drops} records, falling "
                     "behind the steps")
    after = (steps - 1 - last - (gap - 1) - max(late_drops, 0) * gap
             if isinstance(steps, int) else 0)
    if inside > 0 or after > 0:
        unclosed = how == "exit" and header.get("pacer_backend") == "device"
        notes.append(f"{name}: {max(inside, 0) + max(after, 0)} steps have no record"
                     + (f", the last {after} of them (the run went on to step {steps - 1})"
                        if after > 0 else "")
                     + ": steps with no paced collective, or that the ranks disagreed on "
                     "(the ranks' warnings say when)"
                     + (f", or among the {unread} lines skipped as unreadable" if unread else "")
                     + ("; or records still on the GPU when the process exited without "
                        "pacer.close()" if unclosed and after > 0 else ""))
    return notes


def group_note(ranks: list[int]) -> str:
    """What the report's rank numbers are on a data-parallel subgroup: the group's, each a
    global rank, as a formula where the group is evenly spaced, else listed in full (a group
    rank must be found again in it)."""
    head = f"a data-parallel group of the job: the ranks named here are its ranks 0-{len(ranks) - 1}"
    steps = {b - a for a, b in zip(ranks, ranks[1:], strict=False)}
    if len(ranks) > 8 and len(steps) == 1:
        first, (stride,) = ranks[0], steps
        return f"{head}, global rank {first} + {stride} x the rank named ({first}-{ranks[-1]})"
    return f"{head}, global ranks {ranks}, in that order"


TAIL_FILES = 64  # rank files of a run up to which each one's last step is read
TAIL_BYTES = 1 << 20  # what is read of a file's end for it: lines of 125 KB at 4096 ranks


def _tail(path: Path) -> tuple[int, dict[str, Any] | None]:
    """The step of the last whole record line in the file's last TAIL_BYTES, -1 if none
    (lines cut short or corrupt are passed over, as the reader skips them), and the end line
    after it, if any."""
    start = max(0, _size(path) - TAIL_BYTES)
    try:
        with path.open("rb") as f:
            f.seek(start)
            tail = f.read(TAIL_BYTES)
    except OSError:
        return -1, None
    lines = tail.split(b"\n")[1 if start else 0:]  # the first is cut by the seek
    end = None
    for line in reversed(lines):  # a line cut short does not parse
        try:
            obj = json.loads(line)
            step = obj.get("step")
        except (ValueError, AttributeError):
            continue
        if obj.get("gpupace") == "end":
            end = end or obj
        elif isinstance(step, int) and not isinstance(step, bool):
            return step, end
    return -1, end


def _unended(run: Run, files: Sequence[tuple[Path, dict[str, Any]]],
             tails: dict[Path, tuple[int, dict[str, Any] | None]]) -> list[str]:
    """The note on the run's other rank files that were cut short (no end line where the
    header promised one) or ended on an error: which rank died, and when."""
    cut, failed = [], []
    for p, h in files:
        if not h.get("end_mark") or p not in tails:  # no end line due, or its tail not read
            continue
        last, end = tails[p]
        how = str(end.get("how", "")) if end is not None else ""
        if end is None:
            cut.append(f"{p.name} (after step {last})")
        elif how.startswith("error"):
            failed.append(f"{p.name} ({how.removeprefix('error: ')})")
    notes = []
    if cut:
        notes.append(f"no end mark in {_some(cut)}: those ranks' writers stopped there (killed "
                     "or crashed, a full disk, or still going)")
    if failed:
        notes.append(f"ended on an error: {_some(failed)}")
    if (cut or failed) and not run.unfinished:
        run.unfinished = f"no end mark in {cut[0]}" if cut else f"ended on an error: {failed[0]}"
    return notes


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# The per-rank arrays of a record: each holds one value per rank of the run, or none (a
# record from a writer that left it out).
_PER_RANK = ("earliness_us", "wait_us", "delay_us", "step_times_us")
# The times of a record in microseconds. NaN is a time the writer did not know (the first
# step's); an infinite one, or one of IMPLAUSIBLE_US or more, is a broken clock or a corrupted
# row. Not the policy's ABSURD_US (1000 s): a step with a 20-minute evaluation in it is real.
IMPLAUSIBLE_US = 1e13  # ~4 months
_TIMES_US = ("step_time_us", "spread_us", "residual_us", "transfer_us")
_NON_NEGATIVE = ("step_time_us", "spread_us")  # a duration, a latest minus an earliest
_ARRAYS_US = (*_PER_RANK, "site_spread_us")


def _absurd(r: StepRecord) -> str:
    """Why the record's times cannot be measurements (the first such field and value), or
    "" when they can. NaN passes: an unknown time, which the figures leave out. Costs 18 us
    a record at 4096 ranks, against 5.3 ms to parse its line (2-core VM)."""
    for name in _TIMES_US:
        v = getattr(r, name)
        if abs(v) >= IMPLAUSIBLE_US:
            return f"{name} is {v!r}, expected a time of |t| < {IMPLAUSIBLE_US:.0e} us"
        if v < 0 and name in _NON_NEGATIVE:  # left out of the figures unsaid, as no time
            return f"{name} is {v!r}, expected a time >= 0"
    for name in _ARRAYS_US:
        a = np.asarray(getattr(r, name), dtype=np.float64)
        bad = np.abs(a) >= IMPLAUSIBLE_US  # False for NaN
        if bad.any():
            return (f"{name} holds {float(a[bad][0])!r}, expected times of "
                    f"|t| < {IMPLAUSIBLE_US:.0e} us")
    return ""


def _misfit(lengths: tuple[int, ...], world: int) -> str:
    """Why a record whose `_PER_RANK` arrays have these lengths (0: absent) does not fit a
    run of `world` ranks, or "" when it does."""
    for name, n in zip(_PER_RANK, lengths, strict=True):
        if n and n != world:
            return f"{name} holds {n} values, expected {world} (one per rank)"
    return ""


def _world_size(header: dict[str, Any], widths: Sequence[tuple[int, ...]], path: Path) -> int:
    """The run's ranks: the header's world_size, when some record's per-rank arrays hold that
    many values; without it, the length most records have (`widths`: each record's
    `_PER_RANK` lengths). Not the longest: one corrupted record must not add a rank. Raises
    ValueError when the header names a size that no record has."""
    held = Counter(max(lengths) for lengths in widths if any(lengths))  # records per width
    common = held.most_common(1)[0][0] if held else 0
    said = _ranks(header.get("world_size")) or 0  # not a size: the records say (a note)
    if said and held and said not in held:
        raise ValueError(f"{path}: the header's world_size is {said}, but no record holds "
                         f"{said} ranks' values: they hold {common} (a header from another "
                         "run?)")
    # No record holds per-rank values (a foreign writer's): the report still makes its
    # [steps, ranks] matrices, of NaN, two of them: a header of 1M ranks wanted 8 GB a 500 steps.
    empty = 2 * 8 * len(widths) * said  # bytes
    if not held and empty > UNCONFIRMED_BYTES:
        raise ValueError(f"{path}: the header's world_size is {said}, and no record holds "
                         f"per-rank values to confirm it: {len(widths)} steps of {said} ranks "
                         f"would take {empty / 2**30:.1f} GiB of empty matrices")
    return said or common


UNCONFIRMED_BYTES = 256 * 2**20  # what a header alone may have the report allocate


_SCALARS = ("step", "time_s", "step_time_us", "spread_us", "residual_us", "transfer_us",
            "straggler", "active")


def _read_run(label: str, path: Path, header: dict[str, Any], other_files: Sequence[Path],
              progress: Progress | None) -> Run:
    """`to_run` over the file's records as they are read, with a heartbeat for large files."""
    skipped: list[str] = []
    ends: list[dict[str, Any]] = []
    with _heartbeat(path, progress):
        return to_run(label, path, header, iter_records(path, skipped, ends), skipped,
                      other_files, ends)


@contextlib.contextmanager
def _heartbeat(path: Path, progress: Progress | None) -> Iterator[None]:
    """Says every 2 s how long a file of PROGRESS_BYTES or more has been read."""
    size = path.stat().st_size if path.is_file() else 0
    if progress is None or size < PROGRESS_BYTES:
        yield
        return
    done = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not done.wait(2.0):
            progress(f"reading {path.name} ({size / 1e6:.0f} MB): "
                     f"{time.perf_counter() - t0:.0f} s")

    progress(f"reading {path.name} ({size / 1e6:.0f} MB)")
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _run_key(header: dict[str, Any]) -> str:
    """Files of one run's ranks have the same key (`_joins` tells two runs of one key apart)."""
    sim = header.get("sim") or {}
    # group_ranks: a pacer on a data-parallel subgroup; each group's files are a run of their
    # own; run_id: a Pacer's, one a run (files written before it had none); resumed_at_step:
    # a job restarted from a checkpoint (its old files, kept aside as .1, have none)
    key = {k: header.get(k) for k in ("source", "label", "world_size", "sites", "config",
                                      "group_ranks", "run_id", "resumed_at_step")}
    key["sim"] = {k: sim.get(k) for k in ("preset", "policy", "seed", "steps")} \
        if isinstance(sim, dict) else None
    return json.dumps(key, sort_keys=True, default=str)


JOB_START_S = 120  # one job's pacers start within this of each other (the ranks meet at once)


def settings_of(header: dict[str, Any]) -> dict[str, Any]:
    """A header's pacer settings without its telemetry path (each group's, each restart's own)."""
    cfg = header.get("config")
    return {k: v for k, v in cfg.items() if k != "telemetry_path"} if isinstance(cfg, dict) \
        else {}


def _joins(group: list[tuple[Path, dict[str, Any]]], header: dict[str, Any]) -> bool:
    """Whether the file of `header` is another rank's file of the run of `group` (files of
    one `_run_key`): its rank is not in the group yet and, without a run id (files written
    before it), it started within JOB_START_S of the group's first."""
    if header.get("rank") in {h.get("rank") for _, h in group}:
        return False
    return bool(header.get("run_id")) or _start_gap(group[0][1], header) <= JOB_START_S


def _start_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Seconds between two headers' starts; 0 when either is unreadable."""
    ta, tb = started_s(a), started_s(b)
    return 0.0 if ta is None or tb is None else abs(ta - tb)


def groups_of_one_job(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two headers are one job's pacers on two data-parallel groups: other
    `group_ranks`, the same size and settings (a telemetry path or label of each group's own
    aside), started together. Parts of the job, not two tries to compare."""
    ga, gb = a.get("group_ranks"), b.get("group_ranks")
    if not (isinstance(ga, list) and isinstance(gb, list) and ga != gb):
        return False
    if a.get("source") != b.get("source") or a.get("world_size") != b.get("world_size"):
        return False
    if settings_of(a) != settings_of(b):
        return False
    ta, tb = started_s(a), started_s(b)
    return ta is None or tb is None or abs(ta - tb) <= JOB_START_S


def started_s(header: dict[str, Any]) -> float | None:
    """The header's start time in seconds (`make_header`'s format), None when unreadable."""
    try:
        return datetime.strptime(str(header.get("started")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


class NoRecords(ValueError):
    """A telemetry file with a header and no step record it can read (a job that stopped
    before its first step)."""


def expand(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], set[Path]]:
    """The files to read: a directory stands for its *.jsonl files, sorted (what
    `gpupace demo --telemetry DIR` writes: baseline-1.jsonl, paced-1.jsonl, ...); and which
    of them only a directory stood for, none named too (another tool's .jsonl there is passed
    over; one named is refused)."""
    if not paths:
        raise ValueError("no telemetry files given")
    files: list[Path] = []
    listed: set[Path] = set()  # resolved, as `named`
    named: set[Path] = set()
    for given in paths:
        if not str(given).strip():  # Path("") is ".": the current folder, not what was meant
            raise ValueError("a telemetry path is empty")
        p = Path(given)
        if p.is_dir():
            found = sorted(f for f in p.glob("*.jsonl") if f.is_file())  # not a folder, a FIFO
            if not found:
                others = [f.name for f in _dotted(p)]
                said = (f" (it holds {_some(others)}: name a file to report it; a compressed "
                        "one decompressed)" if others else "")
                raise ValueError(f"{p} is a directory with no .jsonl telemetry files{said}")
            files += found
            listed.update(f.resolve() for f in found)
        else:
            files.append(p)
            named.add(p.resolve())
    return files, listed - named


def kept_aside(paths: Sequence[str | os.PathLike], files: Sequence[Path]) -> list[Path]:
    """The earlier runs a directory among `paths` holds, kept aside as `<name>.jsonl.<k>` when
    a pacer started again on a path (`telemetry.keep_aside`), and not among `files`: the
    directory stands for its *.jsonl files alone, and a restarted job's report covered the
    part after the restart without a word."""
    given = {f.resolve() for f in files}
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += [f for f in _dotted(p) if f.suffix[1:].isdigit() and f.resolve() not in given]
    return out


def _run_ids(files: Sequence[Path]) -> set[str]:
    """The run ids (a Pacer's header's `run_id`) of telemetry files, those that have one."""
    ids = set()
    for f in files:
        with contextlib.suppress(ValueError, OSError):
            run_id = read_header(f).get("run_id")
            if isinstance(run_id, str):
                ids.add(run_id)
    return ids


def _dotted(folder: Path) -> list[Path]:
    """A folder's files named <name>.jsonl.<suffix>, sorted: runs a restart kept aside (.1,
    .2), and compressed or renamed ones (.gz, .bak), which the folder does not stand for."""
    return sorted(f for f in folder.glob("*.jsonl.*") if f.is_file())


def _some(names: Sequence[str], shown: int = 4) -> str:
    """The first `shown` names, and " ..." where there are more."""
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")


def _once_each(files: Sequence[Path]) -> tuple[list[Path], dict[Path, int]]:
    """`files` with each file once, at its first place (the same file by another name
    counts: `runs/paced-1.jsonl runs` names paced-1 twice, and read twice it was paired
    with a baseline in place of paced-2, or compared with itself), and how many more
    times each kept path was given."""
    first: dict[Path, Path] = {}  # resolved path -> the path first given for it
    repeats: dict[Path, int] = {}
    for path in files:
        kept = first.setdefault(path.resolve(), path)
        if kept is not path:
            repeats[kept] = repeats.get(kept, 0) + 1
    return list(first.values()), repeats


def _label(header: dict[str, Any], path: Path, taken: dict[str, Path], number: int) -> str:
    """The run's label: the header's, else the file's name. When an earlier run (its path in
    `taken`) has it, what tells the two apart follows in brackets: the file's name, or when
    both files have one name (`gpupace report runs runs2`), the shortest end of the
    directory that differs ("baseline-1 (runs2)"); failing both, the run's `number`."""
    label = str(header.get("label") or "") or _name(path)
    if label not in taken:
        return label
    other = taken[label]
    hint = _name(path) if _name(path) != _name(other) else _distinct_dir(path, other)
    if hint and f"{label} ({hint})" not in taken:
        return f"{label} ({hint})"
    return f"{label} #{number}"


def _name(path: Path) -> str:
    """A file's name without its .jsonl: "run" for run.jsonl, "run.jsonl.1" for the earlier
    run a restarted Pacer kept aside (its stem, "run.jsonl", named the file it was not)."""
    return path.name[:-len(".jsonl")] if path.name.endswith(".jsonl") else path.name


def _distinct_dir(path: Path, other: Path) -> str:
    """The fewest last parts of `path`'s directory that `other`'s does not end with: "runs2"
    for runs2/x.jsonl against runs/x.jsonl, "b/runs" for b/runs/x.jsonl against
    a/runs/x.jsonl; "" when the directories are one."""
    mine, theirs = path.resolve().parent.parts, other.resolve().parent.parts
    for n in range(1, len(mine) + 1):
        if mine[-n:] != theirs[-n:]:
            return str(Path(*mine[-n:]))
    return ""


def load_runs(paths: Sequence[str | os.PathLike], progress: Progress | None = None) -> list[Run]:
    """One `Run` per run among `paths` (files, or directories of *.jsonl files), in the order
    first given. Raises ValueError for a missing, empty or non-gpupace file named, or one with
    no readable step record; a directory's .jsonl file that is not telemetry (another tool's
    log) or holds no step record (a job that stopped before its first step) is passed over,
    with a note on the first run; lines cut short or corrupt are skipped and listed in
    `Run.skipped`."""
    given, listed = expand(paths)
    files, repeats = _once_each(given)
    aside = kept_aside(paths, given)
    aside_runs = _run_ids(aside)
    with_aside: list[str] = []  # a folder's .jsonl files of a run kept aside
    # Grouped by their headers first: of one run's rank files (each holds every rank's rows)
    # only the lowest rank's is read, not all N.
    groups: dict[str, list[list[tuple[Path, dict[str, Any]]]]] = {}  # key -> its runs' files
    order: list[list[tuple[Path, dict[str, Any]]]] = []
    passed_over: list[str] = []  # a directory's .jsonl files that hold no run

    def pass_over(path: Path, why: ValueError) -> None:
        """Notes why a file a directory stood for holds no run; raises it for one named (the
        user meant it)."""
        if path.resolve() not in listed:
            raise why
        passed_over.append(str(why))

    for path in files:
        try:
            header = read_header(path)
        except NotTelemetry as e:
            pass_over(path, e)
            continue
        if header.get("run_id") in aside_runs and path.resolve() in listed:
            # A restart on fewer ranks keeps aside the files of the ranks it has: the earlier
            # run's higher ranks' files stay, and read as a run of their own, the current one
            with_aside.append(path.name)
            continue
        # Of the runs this file could belong to, the one started nearest: a shell's run.*
        # lists a restarted job's run.0.jsonl, run.0.jsonl.1, run.1.jsonl, run.1.jsonl.1
        runs_of_key = groups.setdefault(_run_key(header), [])
        group = min((g for g in runs_of_key if _joins(g, header)),
                    key=lambda g: _start_gap(g[0][1], header), default=None)
        if group is None:
            group = []
            runs_of_key.append(group)
            order.append(group)
        group.append((path, header))
    runs: list[Run] = []
    labels: dict[str, Path] = {}
    for group in order:
        # Each rank file holds every rank's rows: read the lowest rank's of those that reach
        # the run's last step (`_tail`: a writer that stopped early, by 5 steps of 240,
        # was read without a word), unless another is larger by more than the few bytes that
        # the writers' own times make (its writer dropped records).
        group.sort(key=lambda ph: int(ph[1].get("rank") or 0))
        tails = {p: _tail(p) for p, _ in group} if 1 < len(group) <= TAIL_FILES else {}
        end = {p: step for p, (step, _) in tails.items()}
        last = max(end.values(), default=None)
        longer = end.get(group[0][0], last) != last
        if longer:  # the lowest rank of those that reach the last step
            group.sort(key=lambda ph: end[ph[0]] != last)
        largest = max(group, key=lambda ph: _size(ph[0]))
        fuller = _size(largest[0]) > 1.02 * _size(group[0][0]) and \
            end.get(largest[0], last) == last
        if fuller:
            group.remove(largest)
            group.insert(0, largest)
        path, header = group[0]
        label = _label(header, path, labels, len(runs) + 1)
        try:
            run = _read_run(label, path, header, [p for p, _ in group[1:]], progress)
        except NoRecords as e:  # a job that stopped before its first step
            pass_over(path, e)
            continue
        labels[label] = path
        run.notes += [f"{p} was given {repeats[p] + 1} times (by name and again in its "
                      "directory, or twice by name): read once" for p, _ in group
                      if p in repeats]
        run.notes += _unended(run, group[1:], tails)
        if run.other_files:
            run.notes.append(f"{len(group)} rank files of one run; read rank "
                             f"{header.get('rank') or 0}'s ({path.name}"
                             f"{', the largest' if fuller else ''}"
                             f"{', the one that runs longest' if longer and not fuller else ''}"
                             "): each holds every rank's rows")
        dp_ranks = header.get("group_ranks")
        if isinstance(dp_ranks, list) and dp_ranks:
            run.notes.append(group_note(dp_ranks))
        if run.skipped:
            run.notes.append(f"{path.name}: {len(run.skipped)} unreadable or implausible "
                             f"lines skipped (first: {run.skipped[0]})")
        if progress is not None:
            progress(f"{path.name}: {run.steps} steps, {run.world_size} ranks, label {label!r}")
        runs.append(run)
    if not runs:
        raise ValueError("no gpupace telemetry among the files given: "
                         + "; ".join(passed_over + [f"{name} is of a run kept aside (name it to "
                                                    "report it)" for name in with_aside]))
    runs[0].notes += [f"passed over: {why}" for why in passed_over]
    named = {f.resolve() for f in given}
    packed = [f.name for d in map(Path, paths) if d.is_dir() for f in _dotted(d)
              if not f.suffix[1:].isdigit() and f.resolve() not in named]
    if packed:  # run.jsonl.gz, .bak: the directory stands for its .jsonl files alone
        runs[0].notes.append(f"left out: {_some(packed)}, not named .jsonl (name one to read "
                             "it; a compressed one, decompressed)")
    if aside:
        names = _some([p.name for p in aside] + with_aside)
        runs[0].notes.append(f"left out: {names}, earlier runs kept aside when a pacer started "
                             "again on their path (a restarted job; of a run kept aside, a rank "
                             "file not renamed, as a restart on fewer ranks leaves): name them "
                             "to report them")
    for i, run in enumerate(runs):
        siblings = [r.label for r in runs[:i] if groups_of_one_job(r.header, run.header)]
        if siblings:
            run.notes.append(f"another data-parallel group of the same job as "
                             f"{', '.join(siblings)}: not compared with it")
    return runs
