"""Simulated runs as telemetry: the same JSON-lines format as `Pacer`, header source "sim".

Every tool that reads a real run reads a simulated one. Each single-mode preset
(`gpupace.sim.presets`: quiet, jitter, locality, fabric, amplification) gives a file with one
known failure mode: the header's `label` is the preset's name, and its `sim` entry holds the
ground truth: preset, policy, seed, scenario, slow ranks, and `failure_modes`, every
mechanism switched on (amplification's random stragglers also count as "jitter").

    from gpupace.sim import labelled_telemetry
    labelled_telemetry("locality", "locality.jsonl", nodes=2, steps=400, seed=1)

or, with control over the scenario:

    from gpupace.sim import presets, simulate, write_telemetry
    res = simulate(presets.locality(nodes=4), policy="none", steps=500, seed=1)
    write_telemetry(res, "locality.jsonl")     # header["sim"]["slow_ranks"] == [6, 7, 14, ...]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import policy as pol
from ..telemetry import StepRecord, TelemetryWriter, make_header, make_record
from .simulate import SimResult


def sim_header(result: SimResult, label: str | None = None) -> dict[str, Any]:
    """The telemetry header of a simulated run, with a `sim` entry describing the ground truth.
    The label, unless given: the preset, the size and the policy ("locality 4x8 gpupace"),
    so that a report of several simulated runs tells them apart."""
    sc = result.scenario
    if label is None:
        label = f"{sc.name} {sc.nodes}x{sc.gpus_per_node} {result.policy}"
    header = make_header(source="sim", world_size=sc.ranks, rank=0, label=label,
                         sites=[f"bucket{b}" for b in range(sc.buckets)],
                         config=result.config.to_dict())
    header["sim"] = {
        "preset": sc.name,
        "policy": result.policy,
        "seed": result.seed,
        "steps": result.steps,
        "failure_modes": sc.failure_modes(),
        "slow_ranks": list(result.slow_ranks),
        "scenario": sc.to_dict(),
        "stamped": result.stamped,
    }
    return header


def to_records(result: SimResult) -> Iterator[StepRecord]:
    """One `StepRecord` per simulated step. The estimator fields (earliness, spread, residual,
    transfer, straggler) come from `gpupace.policy.update` in observe mode on the simulated
    (wait, delay) rows, exactly as a pacer computes them; `active` is what the run's policy
    decided. Needs the per-site arrays (`simulate(..., keep_sites=True)`)."""
    if result.site_wait_us is None or result.site_delay_us is None:
        raise ValueError("this result has no per-site arrays; rerun simulate(..., keep_sites=True)"
                         " (or with fewer steps x ranks x buckets)")
    from ..config import PaceConfig

    n, nb = result.ranks, result.scenario.buckets
    params = pol.PolicyParams.from_config(PaceConfig(mode="observe"), n)
    state = pol.init_state(n, nb)
    time_s = np.nancumsum(result.step_us) * 1e-6
    for k in range(result.steps):
        w, d = result.site_wait_us[k], result.site_delay_us[k]
        steps = np.full(n, result.step_us[k])
        stats = pol.update_in_place(params, state, w, d, steps)
        stats.active = result.active[k].copy()
        yield make_record(k, float(time_s[k]), stats, steps, 0)


def write_telemetry(result: SimResult, path: str | os.PathLike, *, label: str | None = None,
                    interval: int = 1000, on_kept: Callable[[Path, Path], None] | None = None
                    ) -> Path:
    """Writes `result` as a telemetry JSON-lines file readable by
    `gpupace.telemetry.read_telemetry`. `label` defaults to "<preset> <nodes>x<gpus> <policy>"
    (`sim_header`). A file already at `path` (a real job's, perhaps) is kept, renamed
    `path.1` (then .2, ...), as the Pacer keeps one, and `on_kept(path, kept)` told. Returns
    the path."""
    writer = TelemetryWriter(path, sim_header(result, label), interval=interval,
                             keep_previous=True)
    if writer.kept is not None and on_kept is not None:
        on_kept(Path(path), writer.kept)
    try:
        for rec in to_records(result):
            writer.write(rec)
    finally:
        writer.close()
    return Path(path)


def labelled_telemetry(preset: str, path: str | os.PathLike, *, nodes: int = 2,
                       gpus_per_node: int = 8, steps: int = 400, seed: int = 0,
                       policy: str = "none") -> Path:
    """Simulates preset `preset` (see `gpupace.sim.presets.PRESETS`) and writes its telemetry
    to `path` (labelled "<preset> <nodes>x<gpus> <policy>"): test data with a known failure
    mode."""
    from .presets import get_preset
    from .simulate import simulate

    res = simulate(get_preset(preset, nodes, gpus_per_node), policy, steps=steps, seed=seed,
                   keep_sites=True)
    return write_telemetry(res, path)
