"""What a pacer has learnt, as a checkpoint's entry (`Pacer.state_dict`, `load_state_dict`).

A job restarted from a checkpoint would otherwise learn everything again: where the last
arrival moves among many ranks, no rank is paced before 5 calm steps for each of them
(`policy.holdoff`: up to 20,480 steps at 4096 ranks), and restarts at that scale come every
few hours. The state kept is the policy's learning: per rank and site the earliness floor,
the holdoff's calm counter, the running mean and variance of earliness and whether the rank
has been the site's straggler (every rank holds all ranks' flags: each gives its own row);
per site the on/off switch and its hysteresis counters; and the pacer's step count, so that
a resumed job's telemetry and TensorBoard steps go on from it. A state saved before the
flags were kept (2026-12-01) loads with every rank flagged: the holdoff of that time,
holdoff_factor x N for all, and for good, as flags never clear (a job takes the shorter
holdoff of ranks never last only if it starts without that state). Not kept: the next delays
(the first step after a load applies none), the policy's own step count (its warm-up runs
again: its steps measure, as at any start, before the floors move or anything is paced) and
the timing of the sites (clock readings of the old processes).

Each rank holds its own rank's state (an update computes that one alone), so `gather` is a
collective: an all_gather of the site counts, then one of the rows. A data-parallel
subgroup's state names its global ranks, and loads only into that group's pacer. The dict
holds tensors and plain values only, so that `torch.load(weights_only=True)`, torch's
default, reads it back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

FORMAT = "gpupace.pacer_state/1"
PER_RANK = ("floor", "calm", "mean", "var", "last_seen")  # [N, S]: each rank's own
PER_SITE = ("active", "above", "below")  # [S]: the same on every rank
FIELDS = PER_RANK + PER_SITE
COUNTERS = ("calm", "above", "below")  # integers
FLAGS = ("active", "last_seen")  # booleans
# What `unpack` adds, from the fields: the ranks flagged at each site, [S].
LOADED = FIELDS + ("n_last",)


def _row(state: dict[str, np.ndarray] | None, width: int) -> np.ndarray:
    """One rank's state as float64 [len(FIELDS) * width]: each field padded to `width` sites
    (counters below 2^53 travel exactly)."""
    row = np.zeros(len(FIELDS) * width)
    n = 0 if state is None else len(state["floor"])
    for i, name in enumerate(FIELDS):
        if n:
            row[i * width:i * width + n] = state[name]
    return row


def _all_rows(row: np.ndarray, world_size: int, group: Any, device: torch.device) -> torch.Tensor:
    """[world_size, len(row)]: every rank's `row` (one all_gather; none at world size 1)."""
    mine = torch.from_numpy(row)
    if world_size == 1:
        return mine[None, :]
    from .backends import gather_rows

    out = torch.empty(world_size * mine.numel(), dtype=torch.float64, device=device)
    try:
        gather_rows(out, mine.to(device), group)
    except RuntimeError as e:  # a timeout, most often: the others never came
        raise RuntimeError("gpupace: Pacer.state_dict() is a collective and the ranks did not "
                           "all take part: call it on every rank, never inside `if rank == 0` "
                           f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
    return out.cpu().reshape(world_size, -1)


def gather(state: dict[str, np.ndarray] | None, *, steps: int, world_size: int, group: Any,
           device: torch.device, group_ranks: list[int] | None = None) -> dict[str, Any]:
    """Every rank's `state` (this rank's, from its engine: the fields of PER_RANK and PER_SITE,
    [S] each; None before its first update) in one dict, the same on every rank but for
    `steps`, this rank's step count (the same on every rank of a job that steps together): two
    all_gathers, the site counts and then rows of that many sites (none at world size 1).
    `group_ranks`: the global ranks of a data-parallel subgroup, which a load must match."""
    n_mine = 0 if state is None else len(state["floor"])
    counts = _all_rows(np.array([float(n_mine)]), world_size, group, device)[:, 0].long()
    n = int(counts[0])
    if not bool((counts == n).all()):
        raise RuntimeError(f"gpupace: the ranks' policy states cover different numbers of sites "
                           f"({counts.tolist()}): they have not paced the same collectives")
    rows = _all_rows(_row(state, n), world_size, group, device)
    saved: dict[str, Any] = {"format": FORMAT, "world_size": world_size, "sites": n,
                             "steps": int(steps),
                             "group_ranks": list(group_ranks) if group_ranks else None}
    for i, name in enumerate(FIELDS):
        block = rows[:, i * n:(i + 1) * n]
        value = block if name in PER_RANK else block[0]
        saved[name] = (value.to(torch.int64) if name in COUNTERS
                       else value.bool() if name in FLAGS else value.clone())
    return saved


def _what(saved: Any) -> str:
    """What was given in place of a pacer state, for the error: a whole checkpoint names its
    pacer entry."""
    if not isinstance(saved, dict):
        return type(saved).__name__
    if saved.get("format") is not None:
        return f"format {saved.get('format')!r}"
    inner = [k for k, v in saved.items() if isinstance(v, dict) and v.get("format") == FORMAT]
    if inner:
        return f"a dict whose {inner[0]!r} entry is one: pass state[{inner[0]!r}]"
    return f"a dict with keys {sorted(map(str, saved))[:8]}"


def unpack(saved: Any, *, world_size: int, max_sites: int,
           group_ranks: list[int] | None = None) -> dict[str, np.ndarray] | None:
    """The state in `saved` (from `gather`) as NumPy arrays, per-rank fields [N, S] and per-site
    ones [S] (`LOADED`), S cut to `max_sites` (the first sites keep theirs); None when it holds
    no sites. A ValueError saying what is wrong with it otherwise: another world size, or
    another data-parallel group (`group_ranks`, None for the whole world)."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError(f"not a gpupace pacer state (Pacer.state_dict()): expected a dict with "
                         f"format {FORMAT!r}, got {_what(saved)}")
    # The group first: a whole-world pacer given a group's state (group= forgotten at the
    # restart) was told the job had another size, and to start without the state.
    theirs = saved.get("group_ranks") or None
    mine = list(group_ranks) if group_ranks else None
    if theirs != mine:
        def who(ranks):
            return f"data-parallel group {ranks}" if ranks else "the whole world"

        hint = ("build the pacer on that group, Pacer(..., group=ddp_model.process_group), "
                "or " if theirs and not mine else "")
        raise ValueError(f"this pacer state was saved by the pacer of {who(theirs)}, and this "
                         f"pacer's is {who(mine)}: {hint}each group has a state of its own (call "
                         f"state_dict() on every rank and save each group's, from one of its "
                         f"ranks)")
    if saved.get("world_size") != world_size:
        said = saved.get("world_size")
        raise ValueError(f"this pacer state was saved by a job of {said} ranks, and this pacer "
                         f"has {world_size}: each rank's state is its own, so it cannot be "
                         f"carried over; start without it" if isinstance(said, int) else
                         f"pacer state: 'world_size' must be the saving job's rank count, got "
                         f"{said!r}")
    n = _count(saved, "sites")
    if n == 0:
        return None
    out: dict[str, np.ndarray] = {}
    for name in FIELDS:
        value = saved.get(name)
        if value is None and name == "last_seen":  # saved before 2026-12-01: the holdoff
            value = torch.ones(world_size, n, dtype=torch.bool)  # of then, factor x N
        shape = (world_size, n) if name in PER_RANK else (n,)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"pacer state: {name!r} must be a tensor of shape {shape}, "
                             f"got {got}")
        a = value.detach().cpu().numpy()
        bad = ~np.isfinite(a.astype(np.float64)) | ((a < 0) if name != "var" else False)
        if bad.any():
            raise ValueError(f"pacer state: {name!r} holds {float(a[bad].flat[0])!r}, a value "
                             f"no pacer saves (negative or not finite)")
        out[name] = a[..., :max_sites].copy()  # not a view of the caller's tensors
    if (out["var"] < -1).any():
        raise ValueError("pacer state: 'var' holds values below -1 (-1 means no sample yet)")
    if (out["last_seen"] > 1).any():
        raise ValueError("pacer state: 'last_seen' holds values other than 0 and 1")
    out["last_seen"] = out["last_seen"].astype(bool)
    out["n_last"] = out["last_seen"].sum(axis=0)
    return out


def steps_of(saved: dict[str, Any]) -> int | None:
    """The step count in `saved` (a dict `unpack` has taken), None in a state saved before
    states held one; a ValueError for one that is no step count."""
    return None if saved.get("steps") is None else _count(saved, "steps")


def _count(saved: dict[str, Any], name: str) -> int:
    """`saved[name]`, an integer >= 0; a ValueError naming it otherwise."""
    value = saved.get(name)
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        raise ValueError(f"pacer state: {name!r} must be an integer >= 0, got {value!r:.40}")
    return value
