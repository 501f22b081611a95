"""`gpupace simulate`: the scaling table of a preset or of a fitted telemetry file.

    gpupace simulate --preset paper --nodes 4,8,16,32,64 --json out.json --plot out.png

Prints, per node count and policy: throughput, step-time CV, p99, gain over `none` in %, and
that gain in % of the oracle's. Progress goes to stderr (one line at a time on a terminal).
Output paths are checked before the simulation starts, which can take minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..cli import check_output_file
from ..config import CONTROL_LAW, PaceConfig, env_settings
from ..telemetry import make_header
from .calibrate import MAX_GPUS_PER_NODE, fit_telemetry
from .presets import PRESETS, get_preset
from .records import write_telemetry
from .scenario import (
    EAGER_SITE_US,
    EAGER_STEP_US,
    GRAPH_SITE_US,
    GRAPH_STEP_US,
    MAX_RANKS,
    NCCL_COUPLING,
    PERSISTENT_NCCL_COUPLING,
    PERSISTENT_SPIN_COUPLING,
    SPIN_COUPLING,
    Scenario,
)
from .simulate import (
    KEEP_SITES_LIMIT,
    MAX_STEPS,
    POLICIES,
    SimResult,
    check_memory,
    policy_start_step,
)
from .table import finite, format_table, plot_table, scaling_table

# The figures use the second half of a run; it should hold the policy's warm-up (5 steps by
# default) and 20 more measured steps at the least.
MIN_STEPS = 50
# PaceConfig's fields the simulated policy does not read (its mode is "pace", whatever
# GPUPACE_MODE says): left out of the note on the environment's settings.
NOT_SIMULATED = tuple(f.name for f in dataclasses.fields(PaceConfig)
                      if f.name not in CONTROL_LAW)
DEFAULT_GPUS = 8  # ranks per node: the study's, and the paper preset's calibration
STUDY = ("the study gpupace implements: 4-8 nodes +0.8%; 64 nodes CV 0.22 -> 0.09, "
         "8200 -> 9100 samples/s (+11.0%)")
# --coupling: (a waiting NCCL kernel's, a pacing spin's), both measured on an H200
# (gpupace.sim.scenario), or none.
COUPLINGS = {"batched": (NCCL_COUPLING, SPIN_COUPLING),
             "persistent": (PERSISTENT_NCCL_COUPLING, PERSISTENT_SPIN_COUPLING),
             "off": (0.0, 0.0)}
# --pacing-cost: (a paced collective's own, a paced step's), us, both measured on an H200
# (gpupace.sim.scenario), or none.
PACING_COSTS = {"graph": (GRAPH_SITE_US, GRAPH_STEP_US), "eager": (EAGER_SITE_US, EAGER_STEP_US),
                "off": (0.0, 0.0)}
PACING_COST_SOURCES = {
    "graph": "in a CUDA graph on an H200 (code of 975f711)",
    "eager": "eager on an H200 (code of 975f711, whose eager path has changed since, not yet "
             "measured on a GPU): host launch time, charged as a host-bound job pays it, whose "
             "GPU waits for the launches (a GPU-bound one hides them and pays its kernels' GPU "
             "time, not measured eager)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="scenario preset (default: paper, unless --from-telemetry)")
    parser.add_argument("--from-telemetry", metavar="FILE", default=None,
                        help="fit compute, locality and jitter from a telemetry file and "
                             "simulate that job at the given node counts")
    parser.add_argument("--nodes", default="4,8,16,32,64",
                        help=f"comma-separated node counts (default 4,8,16,32,64; nodes x "
                             f"GPUs per node at most {MAX_RANKS})")
    parser.add_argument("--gpus-per-node", type=int, default=DEFAULT_GPUS,
                        help=f"ranks per node, 1 to {MAX_GPUS_PER_NODE} (default {DEFAULT_GPUS})")
    parser.add_argument("--steps", type=int, default=2000,
                        help=f"steps per run, {MIN_STEPS} to {MAX_STEPS:,}; figures use the "
                             "second half (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--coupling", choices=sorted(COUPLINGS), default=None,
                        help="what a waiting collective and a pacing spin cost the overlapping "
                             "compute, as measured on an H200 beside batched matmuls "
                             f"({NCCL_COUPLING}, {SPIN_COUPLING}) or a persistent matmul "
                             f"({PERSISTENT_NCCL_COUPLING}, {PERSISTENT_SPIN_COUPLING}), or "
                             "none (default: the preset's; none for --from-telemetry)")
    parser.add_argument("--pacing-cost", choices=sorted(PACING_COSTS), default="graph",
                        help="what pacing's own kernels cost the gpupace and oracle rows, as "
                             f"measured on an H200: in a CUDA graph ({GRAPH_SITE_US} us a paced "
                             f"collective, {GRAPH_STEP_US} us a step; the default), eager "
                             f"({EAGER_SITE_US} and {EAGER_STEP_US} us of host time, as a "
                             "host-bound job pays it), or none")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the table as JSON")
    parser.add_argument("--plot", metavar="PATH.png", default=None,
                        help="plot throughput, CV and gain against nodes (any format "
                             "matplotlib writes: .png, .pdf, .svg, ...)")
    parser.add_argument("--telemetry", metavar="PATH", default=None,
                        help="write simulated telemetry (JSON lines); {nodes} and {policy} in "
                             "PATH give one file per run, else PATH holds the gpupace run at "
                             "the largest node count")


def parse_nodes(text: str) -> list[int]:
    """'4,8,16' -> [4, 8, 16], sorted, each once; ValueError naming the parameter and the
    allowed range."""
    try:
        nodes = [int(t) for t in text.split(",")]  # an empty item ('4,,8') fails here
    except ValueError:
        nodes = []
    if not nodes or any(not 1 <= n <= 4096 for n in nodes):
        raise ValueError(f"--nodes must be a comma-separated list of integers in [1, 4096], "
                         f"got {text!r}")
    return sorted(set(nodes))  # the table and the plot's lines go by size


def check_plot(path: str) -> None:
    """ValueError naming --plot unless matplotlib writes `path`'s extension."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in formats:
        raise ValueError(f"--plot must end in a format matplotlib writes "
                         f"({', '.join('.' + f for f in formats)}), got {path!r}")
    check_output_file("--plot", path)


def check_arguments(args: argparse.Namespace) -> list[int]:
    """Every argument, outputs included, before minutes of simulation; returns the nodes."""
    nodes = parse_nodes(args.nodes)
    if not 1 <= args.gpus_per_node <= MAX_GPUS_PER_NODE:
        raise ValueError(f"--gpus-per-node must be an integer in [1, {MAX_GPUS_PER_NODE}], got "
                         f"{args.gpus_per_node}")
    if max(nodes) * args.gpus_per_node > MAX_RANKS:
        raise ValueError(f"--nodes x --gpus-per-node must be at most {MAX_RANKS} ranks, got "
                         f"{max(nodes)} x {args.gpus_per_node} = {max(nodes) * args.gpus_per_node}")
    if not MIN_STEPS <= args.steps <= MAX_STEPS:
        raise ValueError(f"--steps must be an integer in [{MIN_STEPS}, {MAX_STEPS}] (the figures "
                         f"use the second half), got {args.steps}")
    if args.seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {args.seed}")
    # An unset shell variable ('--json $OUT') gives '': refused, not read as no option (it
    # wrote nothing, ran the paper preset, or failed on '.' after the whole run).
    for option, path in (("--from-telemetry", args.from_telemetry), ("--json", args.json),
                         ("--plot", args.plot), ("--telemetry", args.telemetry)):
        if path == "":
            raise ValueError(f"{option} must be a file path, got an empty string")
    if args.from_telemetry is not None and args.preset:
        raise ValueError("give --preset or --from-telemetry, not both")
    if args.json is not None:
        check_output_file("--json", args.json)
    if args.plot is not None:
        check_plot(args.plot)
    if args.telemetry is not None:
        tel = args.telemetry
        # Every node count runs three policies: a name without one of the two would be written
        # again by the next run, and hold the last one only.
        unknown = sorted(set(re.findall(r"\{[^{}]*\}", tel)) - {"{nodes}", "{policy}"})
        if unknown:
            raise ValueError(f"--telemetry knows the placeholders {{nodes}} and {{policy}}, got "
                             f"{', '.join(unknown)} in {tel!r}")
        if "{nodes}" in tel and "{policy}" not in tel:
            raise ValueError(f"--telemetry with {{nodes}} needs {{policy}} too (each node count "
                             f"runs none, gpupace and oracle), got {tel!r}")
        if "{policy}" in tel and "{nodes}" not in tel and len(nodes) > 1:
            raise ValueError(f"--telemetry with {{policy}} and {len(nodes)} node counts needs "
                             f"{{nodes}} too, got {tel!r}")
        check_output_file("--telemetry", tel.replace("{nodes}", "1").replace("{policy}", "none"))
    check_distinct_files(args, nodes)
    return nodes


def check_distinct_files(args: argparse.Namespace, nodes: list[int]) -> None:
    """ValueError naming both options when an output is the --from-telemetry file (the real
    job's telemetry, written over) or another output (one of the two lost)."""
    files = [(o, p, p) for o, p in (("--from-telemetry", args.from_telemetry),
                                    ("--json", args.json), ("--plot", args.plot)) if p is not None]
    tel = args.telemetry
    runs: list[tuple[str, str, str]] = []
    if tel is not None:  # every file a {nodes}/{policy} name expands to, a plain name once
        runs = list(dict.fromkeys(
            ("--telemetry", tel, tel.replace("{nodes}", str(n)).replace("{policy}", p))
            for n in nodes for p in POLICIES))
    # the runs' names differ from each other (check_arguments): each is compared with the
    # other options' files alone, not with thousands of runs at 4096 node counts
    for i, (option, given, path) in enumerate(files + runs):
        for other, other_given, other_path in files[:i]:
            if not _same_file(path, other_path):
                continue
            if given == other_given:
                got = f"{given!r} for both"
            else:
                shown = repr(given) if path == given else f"{given!r} ({path!r})"
                got = f"{option} {shown} and {other} {other_given!r}, one file"
            raise ValueError(f"{option} must not be the {other} file, which it would write "
                             f"over: got {got}")


def _same_file(a: str, b: str) -> bool:
    """Whether `a` and `b` name one file: the same inode when both exist (a link to it too),
    else the same absolute path with links resolved."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return Path(a).resolve() == Path(b).resolve()


def run(args: argparse.Namespace) -> int:
    nodes = check_arguments(args)
    coupling = {}
    if args.coupling is not None:
        collective, spin = COUPLINGS[args.coupling]
        coupling = dict(coupling=collective, paced_coupling=spin)
    fit_lines: list[str] = []  # what the fit read and left out: before the table, and in --json
    if args.from_telemetry:
        fit = fit_telemetry(args.from_telemetry, **coupling)  # compute matched with it
        name = fit.scenario(1, args.gpus_per_node).name
        title = f"fitted to {args.from_telemetry}"

        def make(n: int) -> Scenario:
            return fit.scenario(n, args.gpus_per_node)
        fit_lines = [f"fitted from {args.from_telemetry}: {fit.describe()}",
                     *(f"fit: {note}" for note in fit.notes)]
        if max(nodes) * args.gpus_per_node > fit.world_size:
            fit_lines.append(
                f"fit: scaled out, rank r takes the offset of the file's rank r % "
                f"{fit.world_size}: each of its late ranks is late once in every "
                f"{fit.world_size} ranks of the bigger job")
        fit_lines.append(f"fit: {unfitted(fit.stamped)}")
        print("\n".join(fit_lines))
    else:
        name = args.preset or "paper"
        title = f"preset {name}"

        def make(n: int) -> Scenario:
            return get_preset(name, n, args.gpus_per_node)
        if args.coupling is None:  # the preset's own, named as --coupling names it
            own = make(1)
            kind = next((k for k, v in COUPLINGS.items()
                         if v == (own.coupling, own.paced_coupling)), "custom")
            title += f", coupling {kind} (the preset's)"
    if args.coupling is not None:
        title += f", coupling {args.coupling}"
        make = with_changes(make, **coupling)
    site_cost, step_cost = PACING_COSTS[args.pacing_cost]
    make = with_changes(make, pacing_site_us=site_cost, pacing_step_us=step_cost)
    if args.pacing_cost != "graph":
        title += f", pacing cost {args.pacing_cost}"
    biggest = make(max(nodes))  # validate the largest scenario before minutes of simulation
    if args.telemetry and args.steps * biggest.ranks * biggest.buckets > KEEP_SITES_LIMIT:
        raise ValueError(
            f"--telemetry needs steps x ranks x buckets <= {KEEP_SITES_LIMIT:,}, got "
            f"{args.steps} x {biggest.ranks} x {biggest.buckets}; use fewer --steps or --nodes")
    tel = args.telemetry
    check_memory(args.steps, biggest, kept=int(keeps_a_result(tel)))

    keep_last: dict[str, SimResult] = {}
    written: list[str] = []
    n_last: dict[int, np.ndarray] = {}  # each gpupace run's stragglers counted, per site

    def kept(path: Path, aside: Path) -> None:
        print(f"telemetry: {path} already held a run: kept it as {aside}", file=sys.stderr)

    def on_result(res: SimResult) -> None:
        if res.policy == "gpupace":
            n_last[res.scenario.nodes] = res.extra["n_last"]
        if tel is None:
            return
        if "{nodes}" in tel or "{policy}" in tel:
            path = tel.replace("{nodes}", str(res.scenario.nodes)).replace("{policy}", res.policy)
            write_telemetry(res, path, on_kept=kept)
            written.append(path)
        elif res.policy == "gpupace" and res.scenario.nodes == max(nodes):
            keep_last["res"] = res

    PaceConfig()  # every GPUPACE_* setting read as a Pacer reads it: a bad one is named here
    policy = PaceConfig(mode="pace")  # the gpupace policy's, environment included, made once
    t0 = time.perf_counter()
    rows = scaling_table(make, nodes, steps=args.steps, seed=args.seed, config=policy,
                         progress=_Progress(), on_result=on_result)
    if sys.stderr.isatty():  # clears the progress line; a log keeps its lines as they are
        print(f"\r{' ' * 60}\r", end="", file=sys.stderr)
    print(f"{title}, {args.gpus_per_node} GPUs per node, {args.steps} steps, seed {args.seed}"
          f" ({time.perf_counter() - t0:.1f} s)")
    print(format_table(rows))
    late = policy_too_late(policy, nodes, args.gpus_per_node, args.steps, n_last)
    notes = [late] if late else []
    if settings := env_settings(skip=NOT_SIMULATED):  # the README's figures are the defaults
        notes.append("note: the gpupace policy ran with settings from the environment: "
                     f"{', '.join(settings)} (the README's figures are the defaults')")
    if not any(biggest.locality_pattern_us) and name in ("paper", "mixed"):
        notes.append(f"note: with {args.gpus_per_node} GPU a node, {name} has no locality "
                     "(its handicap falls on far ranks of a node): three failure modes of four")
    notes.append(pacing_cost_note(args.pacing_cost))
    if biggest.coupling == 0.0 and args.coupling != "off":
        notes.append(no_coupling_note(name))
    for note in notes:
        print(note)
    if name == "paper" and args.gpus_per_node == DEFAULT_GPUS and args.coupling is None:
        print(STUDY)  # the calibrated job alone
    if "res" in keep_last:
        write_telemetry(keep_last["res"], tel, on_kept=kept)
        written.append(tel)
    if written:
        print(f"telemetry: {', '.join(written)}  (gpupace report FILE [--out DIR])",
              file=sys.stderr)
    if args.json:
        made = make_header(source="sim", world_size=0)  # versions, host, date: the run's
        out: dict[str, Any] = {"preset": name, "notes": fit_lines + notes,
                               "policy_config": policy.to_dict(),
                               "steps": args.steps, "seed": args.seed,
                               "gpus_per_node": args.gpus_per_node,
                               "coupling": {"collective": biggest.coupling,
                                            "spin": biggest.paced_coupling},
                               "pacing_cost": {"site_us": biggest.pacing_site_us,
                                               "step_us": biggest.pacing_step_us},
                               "units": ROW_UNITS, "versions": made["versions"],
                               "host": made["host"], "date": made["started"],
                               "rows": [{k: finite(v) if isinstance(v, float) else v
                                         for k, v in r.items()} for r in rows]}
        if args.from_telemetry:  # the whole fit, every rank's offset with it
            out["fit"] = {k: finite(v) if isinstance(v, float) else v
                          for k, v in fit.to_dict().items()}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_table(rows, args.plot, title=f"gpupace simulate, {title}")
    return 0


# The units of a --json row's figures.
ROW_UNITS = {"throughput": "samples/s", "step_time_cv": "fraction",
             "step_time_p99": "us", "gain_pct": "% of none's throughput",
             "oracle_fraction": "fraction of the oracle's gain"}


def keeps_a_result(telemetry: str | None) -> bool:
    """Whether a run holds a result to its end: --telemetry without placeholders is written
    from the gpupace run at the largest node count, after the others have run."""
    return bool(telemetry) and "{nodes}" not in telemetry and "{policy}" not in telemetry


def with_changes(make: Callable[[int], Scenario], **changes: Any) -> Callable[[int], Scenario]:
    """`make` with `changes` to its scenarios' fields."""
    return lambda n: make(n).replace(**changes)


def unfitted(stamped: str) -> str:
    """What a fit leaves out, said beside every fitted table: one file of a few ranks on one
    host cannot show it, and scaled out to 64 nodes the paper preset's own 4-node file
    predicts 9382 samples/s at CV 0.02 where the preset gives 8009 at 0.25 (regimes and the
    fabric make nearly all of it; bench/results/sim_fit_gap_amd-epyc-2c_20261202.md)."""
    short = ("; and a rank's lateness reads short at later collectives (its arrival on the "
             "stream waits for the one before), so handicaps may be under-read"
             if stamped == "stream" else "")
    return ("not fitted, as one file of a few ranks shows none of them: fabric contention, "
            "regime switches, the coupling, the gradients' size (25 MB a collective assumed)"
            f"{short}; and which late rank is late from before the backward and which falls "
            "behind through it: one share of the two is fitted for all (their mix, one late "
            "each way, is the amplification pacing works on: in four simulated 8-rank cases of "
            "it, one-off runs, the fit kept between none and half of the oracle's gain of "
            "+0.06% to +0.53%). Scaled out, the figures leave all of these out")


def pacing_cost_note(kind: str) -> str:
    """What the paced rows paid for pacing's own kernels, said under every table."""
    if kind == "off":
        return ("note: the gpupace and oracle rows leave out pacing's own cost (--pacing-cost "
                f"off): in a CUDA graph on an H200 {GRAPH_SITE_US} us a paced collective and "
                f"{GRAPH_STEP_US} us a step, which a tie with none would lose")
    site, step = PACING_COSTS[kind]
    return (f"note: the gpupace and oracle rows pay pacing's own cost, delay or none: {site} us "
            f"a paced collective before its entry and {step} us a step before the next "
            f"forward, measured {PACING_COST_SOURCES[kind]}, the step's exchange without a "
            "network (one rank); a collective's is seen where it cannot overlap the backward "
            "(the last bucket's, a transfer-bound step's)")


def policy_too_late(cfg: PaceConfig, nodes: list[int], gpus_per_node: int, steps: int,
                    n_last: dict[int, np.ndarray] | None = None) -> str | None:
    """A note when, at some node counts, the gpupace policy (`cfg`) could act in less than 90%
    of the measured steps (the second half): before `policy_start_step` it delays nobody, so
    its rows there show little or nothing of it. `n_last`: per node count, the ranks its
    gpupace run counted last at each site (the holdoff it reached); without it, the longest
    holdoff."""
    n_last = n_last or {}
    measured = steps - steps // 2
    start = {n: policy_start_step(cfg, n * gpus_per_node, n_last.get(n)) for n in nodes}
    acting = {n: min(1.0, max(0.0, (steps - start[n]) / measured)) for n in nodes}
    late = [n for n, f in acting.items() if f < 0.9]
    if not late:
        return None
    # The holdoff grows as more ranks take their turn last: the longest it can be, to be sure.
    need = policy_start_step(cfg, max(late) * gpus_per_node)
    shares = ", ".join(f"{n} node(s) {100 * acting[n]:.0f}% (no delay before step "
                       f"{start[n]}, where the holdoff this run reached ends)" for n in late)
    return (f"note: the gpupace policy could delay ranks in only part of the measured steps "
            f"({steps // 2} on): {shares}. A rank is delayed only once it has been on time for "
            f"the holdoff, 5 steps for each rank that has been last at the site (up to 5 per "
            f"rank), so gpupace's rows there show little of it. Use --steps {2 * need + 200} "
            f"or more: the holdoff reaches step {need} at {max(late)} node(s) where every rank "
            f"takes its turn last.")


def no_coupling_note(name: str) -> str:
    """Why none, gpupace and oracle agree on an uncoupled scenario, and how to add a coupling."""
    return (f"note: {name} has no coupling (Scenario.coupling = 0): without one, pacing cannot "
            "shorten a bulk-synchronous step, so the oracle and gpupace at best tie none less "
            "pacing's own cost, and gpupace loses a little more where a delayed rank turns out "
            "last (README, 'What if the job ran on 512 GPUs'). No telemetry file shows a "
            "coupling; to take one measured on an H200, add --coupling batched (or persistent), "
            "or see --preset amplification.")


class _Progress:
    """Progress on stderr, at most every 2 s, so short runs print nothing."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()

    def __call__(self, msg: str) -> None:
        now = time.perf_counter()
        if now - self.t0 > 2.0 and now - self.last > 2.0:
            end = "\r" if sys.stderr.isatty() else "\n"
            print(f"{msg} ({now - self.t0:.0f} s)", end=end, file=sys.stderr, flush=True)
            self.last = now
