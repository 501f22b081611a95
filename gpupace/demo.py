"""`gpupace demo`: a real multi-rank DDP run on this machine, baseline against paced.

It spawns N local ranks (gloo on CPU; NCCL with one GPU per rank where there are enough GPUs),
injects straggler work from a named scenario, trains the same model with the same seed as a
baseline (measured, never delayed) and paced, in four alternating phases (baseline, paced,
paced, baseline; see `demo_worker`), and prints the two sides side by side.

`--wait sleep` is gloo as it is: a waiting rank sleeps, so there is none of the coupling that
pacing works through on GPUs, and pacing can at best break even. `--wait spin` makes waiting ranks
poll their collectives in a busy loop, as NCCL's kernels poll on SMs, so early ranks take cores
from the late ones; pacing early ranks (they sleep through their delay) gives those back.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .cli import check_output_dir, check_output_file
from .config import PaceConfig
from .launch import run_ranks
from .report.compare import gap_pct
from .report.diagnose import MIN_STEPS
from .summary import SUMMARY_ROWS
from .telemetry import json_safe

SCENARIOS = ("persistent", "random", "locality", "mixed")
WAITS = ("sleep", "spin")
DEFAULT_STEPS = 160
EXTRA_STEPS = 40  # by default, beyond the fewest a run may have: 10 more measured a phase
WARMUP_STEPS = 10
# The fewest measured steps of a phase: what `gpupace report` needs to diagnose a phase's file.
STATS_STEPS = MIN_STEPS
MAX_RANKS = 256  # one process a rank, on this machine
# A rank's memory, its share of shared pages counted (Pss): 316 MB at 4 ranks, 266 MB while 12
# started, on the 2-core VM (2026-12-01; torch, a gloo group, the model and its optimizer).
RANK_BYTES = 320 * 2**20
# A sample's memory in a step, forward and backward: 10.9 KB a sample at a batch of 20,000
# (peak RSS, one process, 2026-12-01); a batch of 10^8 failed in the ranks, 102 GB asked for.
SAMPLE_BYTES = 16 * 2**10
MAX_SEED = 2**32  # torch's generators take seed * 1000 + rank; NumPy's any size


def settle_steps(config: PaceConfig, ranks: int) -> int:
    """Steps at the start of a phase by which its fresh pacer can delay any rank, whichever
    ranks were last: the warm-up, then the longer of the hysteresis' switch-on and the longest
    holdoff, holdoff_factor steps a rank of the job (`policy.holdoff`). Both sides leave them
    out of their statistics, on the same steps of the schedule, so that the comparison shows a
    settled pacer."""
    from .policy import PolicyParams

    holdoff = PolicyParams.from_config(config, ranks).holdoff_steps
    return config.warmup_steps + max(config.on_steps, holdoff)


def min_steps(config: PaceConfig, ranks: int) -> int:
    return 2 * (settle_steps(config, ranks) + STATS_STEPS)


def make_schedule(scenario: str, world: int, steps: int, straggle_ms: float,
                  seed: int) -> np.ndarray:
    """Milliseconds of injected work per step and rank, [steps, world]: the same for both runs.
    persistent: the last rank is slow by `straggle_ms` every step; random: heavy-tailed spikes
    (Pareto, shape 1.5) on a random rank on half the steps; locality: fixed offsets growing with
    the rank, 0 to `straggle_ms`; mixed: half the locality offsets plus the random spikes.
    Every scenario adds up to 0.3 ms of uniform noise per step and rank."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
    rng = np.random.default_rng(seed)
    ms = rng.uniform(0.0, 0.3, (steps, world))
    offsets = straggle_ms * np.arange(world) / max(world - 1, 1)
    spikes = np.zeros((steps, world))
    hit = rng.random(steps) < 0.5
    spike = np.minimum(straggle_ms * (0.5 + rng.pareto(1.5, steps)), 5 * straggle_ms)
    spikes[np.flatnonzero(hit), rng.integers(0, world, steps)[hit]] = spike[hit]
    if scenario == "persistent":
        ms[:, -1] += straggle_ms
    elif scenario == "random":
        ms += spikes
    elif scenario == "locality":
        ms += offsets
    else:
        ms += 0.5 * offsets + spikes
    return ms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=4, help="local ranks to spawn (default 4)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps of each side, baseline and paced, in two phases "
                   f"each: even, and enough for a fresh pacer to settle in a phase at that many "
                   f"ranks, said when too few (default {DEFAULT_STEPS}, or more where many ranks "
                   "need a longer holdoff before their pacer settles)")
    p.add_argument("--scenario", choices=SCENARIOS, default="persistent")
    p.add_argument("--wait", choices=WAITS, default="sleep",
                   help="how waiting ranks wait: gloo's sleep, or a busy poll like NCCL's kernels")
    p.add_argument("--straggle-ms", type=float, default=20.0,
                   help="size of the injected straggler work in ms of one core (default 20)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: nccl when there is one GPU per rank, else gloo")
    p.add_argument("--telemetry", metavar="DIR",
                   help="write DIR/{baseline,paced}-{1,2}.jsonl, one file per phase "
                   "(for gpupace report), replacing those of an earlier demo; a run that "
                   "fails leaves those, and its own in DIR/incomplete")
    p.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the run is abandoned (default 600)")


# What the demo sets itself, whatever GPUPACE_* says: each side's mode, and every step in its
# telemetry (the report needs 30 measured steps a phase).
PINNED = dict(mode="observe", warmup_steps=WARMUP_STEPS, telemetry_interval=20,
              telemetry_every=1, telemetry_path="")


def env_settings() -> list[str]:
    """The GPUPACE_* settings of the environment the demo's pacers take (`PINNED` aside)."""
    from . import config

    return config.env_settings(skip=PINNED)


def run(args: argparse.Namespace) -> int:
    config = PaceConfig(**PINNED)
    if args.steps is None:
        args.steps = max(DEFAULT_STEPS, min_steps(config, args.ranks) + EXTRA_STEPS)
    _check(args, config)
    backend = _backend(args)
    _make_outputs(args)
    cores = os.cpu_count() or 1
    floor_s = straggler_seconds(args)
    if floor_s > 0.5 * args.timeout:  # the rest of each step and the ranks' start come on top
        print(f"gpupace demo: warning: the straggler's work alone is {floor_s:.0f} s of the "
              f"run ({args.steps} steps a side), and the rest of each step and the ranks' "
              f"start come on top: the run may outlast --timeout ({args.timeout:.0f} s), "
              f"which ends it without results", file=sys.stderr, flush=True)
    if args.ranks > 4 * cores:
        print(f"gpupace demo: warning: {args.ranks} ranks share {cores} cores, and the steps "
              f"grow with the ranks ({args.steps} a side): the run may outlast --timeout "
              f"({args.timeout:.0f} s)", file=sys.stderr, flush=True)
    from . import policy
    from .demo_worker import ms_per_unit, run_abba

    # Once here, so that the ranks load the policy kernel from Numba's cache rather than
    # all compiling it at once on a first run.
    print("gpupace demo: loading the policy kernel (compiled once per machine: ~8 s the first "
          "time)", file=sys.stderr, flush=True)
    policy.prepare_fused()
    unit_ms = ms_per_unit()
    schedule = make_schedule(args.scenario, args.ranks, args.steps, args.straggle_ms, args.seed)
    settle = settle_steps(config, args.ranks)
    print(f"gpupace demo: scenario {args.scenario}, {args.ranks} ranks ({backend}, "
          f"wait={args.wait}), {args.steps} steps per run, straggler work {args.straggle_ms} ms; "
          "starting the ranks", file=sys.stderr, flush=True)
    if settings := env_settings():
        print(f"gpupace demo: pacer settings from the environment: {', '.join(settings)}",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    staging = _staging_dir(args)
    kept = None
    try:
        results = run_ranks(run_abba, args.ranks, backend=backend, timeout_s=args.timeout,
                            schedule=schedule, units_per_ms=1.0 / unit_ms, wait=args.wait,
                            batch=args.batch, seed=args.seed, config=config, stats_from=settle,
                            telemetry_dir=staging, scenario=args.scenario, show_progress=True)
        if staging is not None:
            _publish_telemetry(staging, args.telemetry)
    except BaseException:
        kept = _keep_incomplete(staging, args.telemetry) if staging is not None else None
        if kept is not None:
            print(f"gpupace demo: the telemetry this run wrote before it stopped is in {kept}",
                  file=sys.stderr, flush=True)
        raise
    finally:
        if staging is not None and kept != Path(staging):
            shutil.rmtree(staging, ignore_errors=True)
    result = comparison(args, backend, results[0], settle)
    print(format_table(result))
    print(f"({time.perf_counter() - t0:.1f} s; one unit of injected work measured at "
          f"{unit_ms * 1e3:.0f} us)", file=sys.stderr)
    if args.telemetry:
        files = Path(args.telemetry) / "{baseline,paced}-{1,2}.jsonl"
        print(f"telemetry: {files}  (gpupace report {args.telemetry} [--out DIR])",
              file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(json_safe(result), indent=2) + "\n")
    return 0


def _check(args: argparse.Namespace, config: PaceConfig) -> None:
    if args.ranks < 2:
        raise ValueError(f"--ranks must be >= 2 (pacing needs ranks to wait for each other), "
                         f"got {args.ranks}")
    if args.ranks > MAX_RANKS:
        raise ValueError(f"--ranks must be <= {MAX_RANKS} (one process a rank on this "
                         f"machine), got {args.ranks}")
    need = min_steps(config, args.ranks)
    if args.steps < need:
        raise ValueError(
            f"--steps must be >= {need} at {args.ranks} ranks, got {args.steps}: each of the two "
            f"phases of a side needs {settle_steps(config, args.ranks)} steps for its pacer to "
            f"settle (warm-up, then a holdoff of up to {config.holdoff_factor:g} steps a rank) "
            f"and {STATS_STEPS} more for its statistics")
    if args.steps % 2:
        raise ValueError(f"--steps must be even (two phases a side, half each), got {args.steps}")
    if not (args.straggle_ms >= 0 and math.isfinite(args.straggle_ms)):
        raise ValueError(f"--straggle-ms must be a finite number >= 0, got {args.straggle_ms}")
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if not 0 <= args.seed < MAX_SEED:
        raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):  # nan: no deadline at all
        raise ValueError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    # Every step of both sides waits for the straggler's work at least: a run that cannot end
    # before the deadline is refused now, not killed at it (a typo of 20000 for 20 ms).
    floor_s = straggler_seconds(args)
    if floor_s >= args.timeout:
        raise ValueError(f"--straggle-ms {args.straggle_ms:g} over {args.steps} steps a side is "
                         f"{floor_s:.0f} s of straggler work alone, past --timeout "
                         f"{args.timeout:g} s: use a smaller --straggle-ms or a larger --timeout")
    _check_outputs(args)
    have = available_memory()
    rank_bytes = RANK_BYTES + args.batch * SAMPLE_BYTES
    if have is not None and args.ranks * rank_bytes > 0.9 * have:
        most_batch = int((0.9 * have / args.ranks - RANK_BYTES) // SAMPLE_BYTES)
        batch = (f" with --batch {args.batch} (~{SAMPLE_BYTES >> 10} KB a sample)"
                 if args.batch * SAMPLE_BYTES > RANK_BYTES else "")
        most_ranks = int(0.9 * have // rank_bytes)
        fits = ([f"at most {most_ranks} ranks here"] if most_ranks >= 2 else []) + (
            [f"at most --batch {most_batch} at {args.ranks} ranks"] if batch and most_batch >= 1
            else [])
        raise ValueError(f"--ranks {args.ranks}{batch} needs about "
                         f"{args.ranks * rank_bytes / 2**30:.1f} GiB (~{rank_bytes / 2**20:,.0f} "
                         f"MB a rank), and this machine has {have / 2**30:.1f} GiB available"
                         + (": " + ", or ".join(fits) if fits else ""))


def straggler_seconds(args: argparse.Namespace) -> float:
    """The straggler's injected work over both sides' steps: the least any run can take."""
    return 2 * args.steps * args.straggle_ms / 1e3


def available_memory() -> int | None:
    """Bytes this process could still take, about: the kernel's MemAvailable, within the memory
    limit of its cgroup (a container's, a batch job's, whose own use is not subtracted: an upper
    bound there); None where neither says (not Linux)."""
    from .sim.simulate import machine_memory

    known = [m for m in (machine_memory(),) if m is not None]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(known) if known else None


def _check_outputs(args: argparse.Namespace) -> None:
    """Before the run, not after it: a bad path must not cost the results."""
    if args.telemetry is not None:  # '' too: refused, not read as no option
        check_output_dir("--telemetry", args.telemetry)
    if args.json is not None:
        check_output_file("--json", args.json)


def _make_outputs(args: argparse.Namespace) -> None:
    """The output folders, once every check has passed (a refused run leaves none behind);
    one that can't be made ends the run before it starts."""
    if args.telemetry:
        Path(args.telemetry).mkdir(parents=True, exist_ok=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)


def _staging_dir(args: argparse.Namespace) -> str | None:
    """A fresh hidden folder in --telemetry for the run's files: an earlier demo's stay in
    place until this run has succeeded (a run that fails or is interrupted replaces nothing:
    its own files go to `_keep_incomplete`'s folder)."""
    if not args.telemetry:
        return None
    return tempfile.mkdtemp(prefix=".gpupace-demo-", dir=args.telemetry)  # a name of its own


INCOMPLETE = "incomplete"  # --telemetry's folder for the files of a run that failed


def _keep_incomplete(staging: str, telemetry: str) -> Path | None:
    """Moves the files a failed or interrupted run wrote (a phase or two, one cut short) to
    `telemetry`/incomplete, replacing an earlier failed run's, so that they can still be read
    (`gpupace report DIR/incomplete`); where that cannot be done (the folder is a file, or
    cannot be removed), they stay in the staging folder. Returns where they are, None when it
    wrote none."""
    if not any(Path(staging).glob("*.jsonl")):
        return None
    dest = Path(telemetry) / INCOMPLETE
    try:
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staging, dest)
    except OSError:
        return Path(staging)
    return dest


def _publish_telemetry(staging: str, telemetry: str) -> None:
    """Moves the run's phase files into --telemetry, replacing an earlier demo's; each file's
    header names its final path, not the staging folder's, which is gone after the run."""
    from .demo_worker import telemetry_files

    for new, old in zip(telemetry_files(staging), telemetry_files(telemetry), strict=True):
        with open(new, encoding="utf-8") as f:
            header, rest = json.loads(f.readline()), f.read()
        if isinstance(header.get("config"), dict):
            header["config"]["telemetry_path"] = str(old)
        Path(new).write_text(json.dumps(header) + "\n" + rest, encoding="utf-8")
        os.replace(new, old)


def _backend(args: argparse.Namespace) -> str:
    """gloo or nccl; nccl only with one GPU per rank and a torch built with NCCL."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = gpus >= args.ranks and torch.distributed.is_nccl_available()
    if args.backend == "nccl" and not nccl:
        raise ValueError(f"--backend nccl needs one CUDA GPU per rank ({args.ranks}) and a torch "
                         f"built with NCCL; this machine has {gpus} GPU(s), NCCL "
                         f"{'available' if torch.distributed.is_nccl_available() else 'missing'}"
                         "; use --backend gloo")
    if args.backend == "auto":
        return "nccl" if nccl else "gloo"
    return args.backend


KEYS = ("throughput", "step_time_mean", "step_time_cv", "step_time_p50", "step_time_p99",
        "step_time_max", "spread_mean", "spread_p99", "entry_spread_mean", "entry_spread_p99",
        "delay_mean", "active_fraction", "delayed_fraction", "straggler_histogram", "steps")


def comparison(args: argparse.Namespace, backend: str, rank0: dict[str, Any],
               settle: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scenario": args.scenario, "world_size": args.ranks, "steps": args.steps,
        "wait": args.wait, "backend": backend, "batch_per_rank": args.batch, "seed": args.seed,
        "stats_from_step": settle, "phase_steps": args.steps // 2, "cores": os.cpu_count(),
        "units": "times in us, throughput in samples/s", "env_settings": env_settings(),
    }
    for side in ("baseline", "paced"):
        out[side] = {k: rank0[side][k] for k in KEYS}
    b, p = out["baseline"]["throughput"], out["paced"]["throughput"]
    out["throughput_gain_pct"] = gain_pct(b, p)
    phases = out["phase_throughput"] = dict(rank0["phase_throughput"])
    out["phase_cv"] = dict(rank0["phase_cv"])  # a side's step_time_cv is the mean of its two
    out["phase_spread_pct"] = {side: phase_spread_pct(phases[f"{side}-1"], phases[f"{side}-2"])
                               for side in ("baseline", "paced")}
    # ABBA: each paced phase against the baseline phase next to it
    out["pair_gain_pct"] = [gain_pct(phases[f"baseline-{k}"], phases[f"paced-{k}"])
                            for k in (1, 2)]
    return out


def gain_pct(before: float, after: float) -> float:
    """The change from `before` to `after` in %; NaN without a `before` to compare with."""
    return 100.0 * (after / before - 1.0) if before > 0 else float("nan")


def phase_spread_pct(a: float, b: float) -> float:
    """How far two phases of one side differ in throughput, in % of their mean. The baseline's
    ran the same code at the run's two ends: their difference is the machine's noise and
    drift. The paced phases' also holds how differently two fresh pacers settled."""
    return gap_pct([a, b])


NO_CHANGE_COLUMN = ("delay_mean", "active_fraction", "delayed_fraction")


def format_table(r: dict[str, Any]) -> str:
    lines = [f"scenario {r['scenario']}, {r['world_size']} ranks, {r['backend']}, "
             f"wait={r['wait']}, {r['steps']} steps a side; statistics over steps "
             f"{r['stats_from_step']}-{r['phase_steps'] - 1} of each phase (before them the "
             "pacer settles)",
             f"{'':28}{'baseline':>12}{'paced':>12}{'change':>10}"]
    for label, key, scale, fmt in SUMMARY_ROWS:
        b, p = r["baseline"][key] * scale, r["paced"][key] * scale
        change = f"{100 * (p / b - 1):+.1f}%" if b and math.isfinite(b) and math.isfinite(p) \
            and key not in NO_CHANGE_COLUMN else ""
        lines.append(f"{label:28}{fmt.format(b):>12}{fmt.format(p):>12}{change:>10}")
    for side in ("baseline", "paced"):
        lines.append(f"steps each rank arrived last (rank 0 first), {side}: "
                     f"{r[side]['straggler_histogram']}")
    lines.append(noise_line(r))
    if r.get("env_settings"):
        lines.append(f"pacer settings from the environment: {', '.join(r['env_settings'])}")
    if r["paced"]["delayed_fraction"] == 0:
        lines.append("pacing delayed nobody: the two sides ran the same code, so their "
                     "differences are this machine's noise")
    return "\n".join(lines)


def noise_line(r: dict[str, Any]) -> str:
    """What this run says of its own noise: the baseline's two phases (the same code at the
    run's two ends) against each other, and each paced phase against the baseline beside it."""
    spread, pairs = r["phase_spread_pct"], r["pair_gain_pct"]
    shared = (f"; {r['world_size']} ranks share {r['cores']} cores"
              if r.get("cores") and r["world_size"] > r["cores"] else "")
    if math.isfinite(spread["baseline"]):
        gauge = (f"the two baseline phases, the same code at the run's two ends, differ in "
                 f"throughput by {spread['baseline']:.1f}%: a change of about that size is this "
                 f"machine's noise")
    else:
        gauge = "this machine's noise could not be gauged (a baseline phase had no throughput)"
    each = ", ".join(f"{g:+.1f}%" if math.isfinite(g) else "n/a" for g in pairs)
    # In 3 of 6 runs without delays on the 2-core VM the change exceeded this gauge
    # (bench/results/demo_intel-xeon-2c_20261201.md): one run's gauge is a floor.
    return (f"{gauge} (each paced phase against the baseline beside it: {each}{shared}); "
            f"one run's gauge can understate it: repeat the run before reading a change as "
            f"pacing's")

