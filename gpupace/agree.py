"""Every rank must pace with the same settings: one all_gather when a `Pacer` is built checks it.

Ranks that disagree fail in ways that do not name the cause: a rank with `mode="off"` skips the
per-step exchange and the others wait in it until the process group's timeout (30 min on gloo
by default); a different `max_sites` changes the row size and gloo aborts on a size mismatch;
different control-law settings make the ranks' decisions diverge silently. A setting that
differs typically comes from a GPUPACE_* variable set on some hosts only.
"""

from __future__ import annotations

import secrets
import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .backends import cuda_device
from .config import CONTROL_LAW, MODES, PaceConfig, per_rank_path
from .warn import warn

# The settings that must match: whether and how wide the exchange runs, and every input of
# the control law. Telemetry and ring settings may differ between ranks (a rank whose
# telemetry file goes missing so is warned).
SHARED = ("mode", "max_sites", *CONTROL_LAW)
BACKEND_CODES = ("host", "device")
TELEMETRY_CODES = ("none", "one file", "a file a rank")  # what the rank's telemetry_path asks


def telemetry_code(config: PaceConfig) -> int:
    """The `TELEMETRY_CODES` index of what this rank's telemetry settings ask for."""
    path = config.telemetry_path if config.mode != "off" else ""
    return 0 if not path else 2 if per_rank_path(path) else 1


def settings_row(config: PaceConfig | None, backend: str | None, token: int = 0) -> np.ndarray:
    """The shared settings and the backend as float64, in `SHARED` order, backend next, then
    the telemetry asked for (`telemetry_code`) and this rank's `token` last (neither compared:
    the run's id is rank 0's); all NaN for a rank that could not make its settings (`config`
    None)."""
    if config is None or backend is None:
        return np.full(len(SHARED) + 3, np.nan)
    values = [MODES.index(config.mode)] + [getattr(config, k) for k in SHARED[1:]]
    return np.array(values + [BACKEND_CODES.index(backend), telemetry_code(config), token],
                    dtype=np.float64)


def telemetry_gap(codes: np.ndarray, rank: int) -> str | None:
    """A warning for `rank` when telemetry that ranks ask for is not written because the
    ranks' settings differ (`codes`: every rank's `telemetry_code`), else None. One file is
    rank 0's to write: a rank that names one, where rank 0 does not, is told its file is never
    written. With a file a rank, a rank with no path writes none: the first rank that names
    its own is told which ranks write none (one warning for the job)."""
    mine = codes[rank]
    if mine == 1 and rank != 0 and codes[0] != 1:
        theirs = "is not set" if codes[0] == 0 else "names a file a rank"
        return (f"gpupace: telemetry_path names one file on this rank (rank {rank}); rank 0 "
                f"writes that file, and its telemetry_path {theirs} "
                f"(GPUPACE_TELEMETRY_PATH set on some hosts only?): the file this rank names "
                f"is never written")
    none, own = np.flatnonzero(codes == 0), np.flatnonzero(codes == 2)
    if mine == 2 and none.size and rank == own[0]:
        return (f"gpupace: telemetry_path names a file a rank on rank(s) "
                f"{_first_ranks(own.tolist())} and is not set on rank(s) "
                f"{_first_ranks(none.tolist())} (GPUPACE_TELEMETRY_PATH set on some hosts "
                f"only?): those write no file, and a report reads only the files written")
    return None


def new_run_id() -> int:
    """A random id of 52 bits, which a float64 holds exactly."""
    return secrets.randbits(52)


def failed_ranks(rows: np.ndarray) -> list[int]:
    """The ranks whose gathered row says they could not make their settings."""
    return np.flatnonzero(np.isnan(rows).all(axis=1)).tolist()


def _first_ranks(ranks) -> str:
    """The first 8 of `ranks`, comma-separated, and " ..." where there are more."""
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")


def disagreements(rows: np.ndarray) -> list[str]:
    """One line per setting on which the gathered rows [N, len(SHARED) + 3] differ from
    rank 0's: the value there and on which ranks it differs."""
    names = [*SHARED, "backend"]
    out = []
    for j, name in enumerate(names):
        odd = np.flatnonzero(rows[:, j] != rows[0, j])
        if odd.size:
            out.append(f"{name}: {_show(name, rows[0, j])} on rank 0, "
                       f"{_show(name, rows[odd[0], j])} on rank(s) {_first_ranks(odd)}")
    return out


def check_ranks_agree(config: PaceConfig | None, backend: str | None, group: Any,
                      pg_backend: str, world_size: int, rank: int = 0) -> int:
    """Raises ValueError on every rank, naming the settings and ranks, when the ranks of
    `group` were built with different shared settings or backends; returns the run's id,
    rank 0's `new_run_id` (the report tells one run's rank files from another's by it). A
    collective: every rank builds its `Pacer`. A rank whose own settings failed (a bad
    GPUPACE_* value on its host) passes `config` None and raises its own error after this;
    the others raise here, naming it, instead of waiting for it in their first step. Warns
    (`telemetry_gap`) where this rank's telemetry is lost to the others' settings."""
    row = torch.from_numpy(settings_row(config, backend, new_run_id()))
    if pg_backend == "nccl":  # NCCL moves CUDA tensors only
        row = row.to(cuda_device(group))
    rows = [torch.empty_like(row) for _ in range(world_size)]
    try:  # NCCL's all_gather returns at once: its failure comes out of the copy to the host
        dist.all_gather(rows, row, group=group)
        gathered = torch.stack(rows).cpu().numpy()
    except RuntimeError as e:  # a timeout, most often: the others never came
        first = (str(e).splitlines() or [""])[0][:200]
        raise RuntimeError(
            "gpupace: building a Pacer is a collective (one all_gather of the settings) and it "
            "failed: most likely the ranks did not all take part (build it on every rank of "
            "its group, never inside `if rank == 0`), or another rank died (look at its log) "
            f"({type(e).__name__}: {first})") from e
    if config is None:
        return 0
    if failed := failed_ranks(gathered):
        raise ValueError(f"gpupace: rank(s) {_first_ranks(failed)} could not build their Pacer "
                         "(their error says why: a GPUPACE_* variable set on some hosts "
                         "only?), so no rank paces")
    lines = disagreements(gathered)
    if lines:
        raise ValueError("gpupace: the ranks were given different settings, and every rank must "
                         "pace with the same ones (a GPUPACE_* variable set on some hosts "
                         "only?):\n  " + "\n  ".join(lines))
    if gap := telemetry_gap(gathered[:, -2], rank):
        warn(gap)
    return int(gathered[0, -1])


def _show(name: str, value: float) -> str:
    if name == "mode":
        return repr(MODES[int(value)])
    if name == "backend":
        return repr(BACKEND_CODES[int(value)])
    return f"{value:g}"


def site_names_differ(names: list[str], group: Any, device: Any, world_size: int) -> str | None:
    """A warning when the ranks of `group` name as many paced sites this step otherwise than
    rank 0 does (each rank's count and names as a crc32, one all_gather: a collective, every
    rank calls it at the same step), None when they agree or their counts differ (which the
    step's exchange warns about). Sites are matched by order: ranks that pace
    different collectives, as many of them, compare one collective's arrival with another's
    without a word (a review's run read as "locality, likely")."""
    mine = [len(names), zlib.crc32("\0".join(names).encode())]
    h = torch.tensor(mine, dtype=torch.int64, device=device)
    out = [torch.empty_like(h) for _ in range(world_size)]
    dist.all_gather(out, h, group=group)
    counts, hashes = torch.stack(out).cpu().numpy().T
    odd = np.flatnonzero(hashes != hashes[0])
    if not odd.size or (counts != counts[0]).any():  # other counts: the step says so itself
        return None
    return (f"gpupace: rank(s) {_first_ranks(odd)} named their paced sites otherwise than rank 0 in this "
            f"step (this rank's: {names[:8]}{' ...' if len(names) > 8 else ''}): every rank "
            "must pace the same collectives in the same order, or the spread compares one "
            "collective's arrivals with another's")
