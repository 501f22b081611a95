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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..telemetry import StepRecord, first_measured_step, iter_records, read_header

# Files at least this large get a heartbeat on stderr while they are read.
PROGRESS_BYTES = 5_000_000

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    """The default progress sink: one line on stderr."""
    print(f"gpupace report: {message}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class Run:
    """One run's telemetry as arrays. Times in us; per-rank arrays are [steps, ranks], padded
    with NaN where a record holds fewer ranks than the run's world size."""

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

    @property
    def steps(self) -> int:
        return int(self.step.size)

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
    def warmup_steps(self) -> int:
        """Steps at the start that the figures leave out (`telemetry.first_measured_step`)."""
        return first_measured_step(self.header)

    @property
    def comm_backend(self) -> str:
        """The collective backend the run used, for wording advice: "nccl", "gloo", "mpi",
        "sim", or "" when the telemetry does not say. Read from the header's
        `process_group_backend` (the Pacer records it; older files lack it); else a
        simulated run is "sim", and a run whose torch is a CPU-only build ("+cpu") used gloo
        (such a build has no NCCL, and MPI needs a source build)."""
        for key in ("process_group_backend", "backend"):
            v = self.header.get(key)
            if isinstance(v, str) and v.lower() in ("nccl", "gloo", "mpi"):
                return v.lower()
        if self.header.get("source") == "sim":
            return "sim"
        torch_version = str((self.header.get("versions") or {}).get("torch", ""))
        return "gloo" if torch_version.endswith("+cpu") else ""

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
        v = self.header.get("samples_per_step")
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
        sc = (self.header.get("sim") or {}).get("scenario") or {}
        if isinstance(sc.get("samples_per_rank"), (int, float)):
            return float(sc["samples_per_rank"]) * self.world_size
        return None


def _matrix(rows: list[list[float]], width: int) -> np.ndarray:
    out = np.full((len(rows), width), np.nan)
    for k, row in enumerate(rows):
        n = min(len(row), width)
        if n:
            out[k, :n] = np.asarray(row[:n], dtype=np.float64)
    return out


def to_run(label: str, path: Path, header: dict[str, Any], records: Iterable[StepRecord],
           skipped: list[str], other_files: Sequence[Path] = ()) -> Run:
    """Arrays from records, taken one at a time (a generator such as `iter_records` keeps one
    record's lists in memory at once). Raises ValueError when no step record could be read."""
    scalars = {name: [] for name in _SCALARS}
    earliness, delay, site_spread = [], [], []
    world = int(header.get("world_size") or 0)
    dropped = 0
    for r in records:
        for name, values in scalars.items():
            values.append(getattr(r, name))
        earliness.append(np.asarray(r.earliness_us, dtype=np.float64))
        delay.append(np.asarray(r.delay_us, dtype=np.float64))
        site_spread.append(np.asarray(r.site_spread_us, dtype=np.float64))
        world = max(world, len(r.earliness_us), len(r.wait_us))
        dropped += r.dropped_before
    if not earliness:
        why = f"; {len(skipped)} lines skipped, first: {skipped[0]}" if skipped else ""
        raise ValueError(f"{path}: no step records{why}")
    steps = np.asarray(scalars["step"], dtype=np.int64)
    order = np.argsort(steps, kind="stable")
    # Two records of one step (two runs in one file: a restart appended to it, or files
    # joined by hand): the later in the file is kept, and the report says so.
    later = np.append(steps[order][1:] != steps[order][:-1], True)
    repeated = int(later.size - later.sum())
    order = order[later]

    def col(name: str, dtype=np.float64) -> np.ndarray:
        return np.asarray(scalars[name], dtype=dtype)[order]

    def matrix(rows: list[np.ndarray], width: int) -> np.ndarray:
        return _matrix([rows[k] for k in order], width)

    run = Run(
        label=label, path=path, header=header, world_size=world, skipped=list(skipped),
        other_files=list(other_files), step=col("step", np.int64), time_s=col("time_s"),
        step_time=col("step_time_us"), spread=col("spread_us"), residual=col("residual_us"),
        transfer=col("transfer_us"), straggler=col("straggler", np.int64),
        active=col("active", bool), earliness=matrix(earliness, world),
        delay=matrix(delay, world),
        site_spread=matrix(site_spread, max((r.size for r in site_spread), default=0)),
    )
    if repeated:
        run.notes.append(f"{path.name}: {repeated} records repeat the step number of an "
                         "earlier one (two runs in one file?): the later record of each step "
                         "is kept")
    if dropped:
        run.notes.append(f"{path.name}: the writer dropped {dropped} records, falling behind "
                         f"the steps; this report covers the {run.steps} written")
    return run


_SCALARS = ("step", "time_s", "step_time_us", "spread_us", "residual_us", "transfer_us",
            "straggler", "active")


def _read_run(label: str, path: Path, header: dict[str, Any], other_files: Sequence[Path],
              progress: Progress | None) -> Run:
    """`to_run` over the file's records as they are read, with a heartbeat for large files."""
    skipped: list[str] = []
    with _heartbeat(path, progress):
        return to_run(label, path, header, iter_records(path, skipped), skipped, other_files)


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
    """Files with the same key and different ranks are one run's rank files."""
    sim = header.get("sim") or {}
    key = {k: header.get(k) for k in ("source", "label", "world_size", "sites", "config")}
    key["sim"] = {k: sim.get(k) for k in ("preset", "policy", "seed", "steps")} \
        if isinstance(sim, dict) else None
    return json.dumps(key, sort_keys=True, default=str)


def expand(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The files to read: a directory stands for its *.jsonl files, sorted (what
    `gpupace demo --telemetry DIR` writes: baseline-1.jsonl, paced-1.jsonl, ...)."""
    if not paths:
        raise ValueError("no telemetry files given")
    files: list[Path] = []
    for given in paths:
        if not str(given).strip():  # Path("") is ".": the current folder, not what was meant
            raise ValueError("a telemetry path is empty")
        p = Path(given)
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise ValueError(f"{p} is a directory with no .jsonl telemetry files")
            files += found
        else:
            files.append(p)
    return files


def load_runs(paths: Sequence[str | os.PathLike], progress: Progress | None = None) -> list[Run]:
    """One `Run` per run among `paths` (files, or directories of *.jsonl files), in the order
    first given. Raises ValueError for a missing, empty or non-gpupace file, or one with no
    readable step record; lines cut short or corrupt are skipped and listed in `Run.skipped`."""
    files = expand(paths)
    # Grouped by their headers first: of one run's rank files (each holds every rank's rows)
    # only the lowest rank's is read, not all N.
    groups: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    order: list[list[tuple[Path, dict[str, Any]]]] = []
    for path in files:
        header = read_header(path)
        key = _run_key(header)
        group = groups.get(key)
        ranks = {h.get("rank") for _, h in group} if group else set()
        if group is None or header.get("rank") in ranks:
            group = groups[key] = []  # a new run (same rank twice: not rank files of one run)
            order.append(group)
        group.append((path, header))
    runs, labels = [], set()
    for group in order:
        group.sort(key=lambda ph: int(ph[1].get("rank") or 0))
        path, header = group[0]
        label = str(header.get("label") or "") or path.stem
        if label in labels:
            label = f"{label} ({path.stem})"
        if label in labels:
            label = f"{label} #{len(runs) + 1}"
        labels.add(label)
        run = _read_run(label, path, header, [p for p, _ in group[1:]], progress)
        if run.other_files:
            run.notes.append(f"{len(group)} rank files of one run; read rank "
                             f"{header.get('rank') or 0}'s ({path.name}): each holds every "
                             f"rank's rows")
        if run.skipped:
            run.notes.append(f"{path.name}: {len(run.skipped)} unreadable lines skipped "
                             f"(first: {run.skipped[0]})")
        if progress is not None:
            progress(f"{path.name}: {run.steps} steps, {run.world_size} ranks, label {label!r}")
        runs.append(run)
    return runs
