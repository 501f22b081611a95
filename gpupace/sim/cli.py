"""`gpupace simulate`: the scaling table of a preset or of a fitted telemetry file.

    gpupace simulate --preset paper --nodes 4,8,16,32,64 --json out.json --plot out.png

Prints, per node count and policy: throughput, step-time CV, p99, gain over `none` in %, and
that gain as a fraction of the oracle's. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .calibrate import fit_telemetry
from .presets import PRESETS, get_preset
from .records import write_telemetry
from .scenario import Scenario
from .simulate import KEEP_SITES_LIMIT, SimResult
from .table import finite, format_table, plot_table, scaling_table

STUDY = ("study (PAPER.md): 4-8 nodes +0.8%; 64 nodes CV 0.22 -> 0.09, "
         "8200 -> 9100 samples/s (+11.0%)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="scenario preset (default: paper, unless --from-telemetry)")
    parser.add_argument("--from-telemetry", metavar="FILE", default=None,
                        help="fit compute, locality and jitter from a telemetry file and "
                             "simulate that job at the given node counts")
    parser.add_argument("--nodes", default="4,8,16,32,64",
                        help="comma-separated node counts (default 4,8,16,32,64)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8)")
    parser.add_argument("--steps", type=int, default=2000,
                        help="steps per run; figures use the second half (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the table as JSON")
    parser.add_argument("--plot", metavar="PATH.png", default=None,
                        help="plot throughput and CV against nodes")
    parser.add_argument("--telemetry", metavar="PATH", default=None,
                        help="write simulated telemetry (JSON lines); {nodes} and {policy} in "
                             "PATH give one file per run, else PATH holds the gpupace run at "
                             "the largest node count")


def parse_nodes(text: str) -> list[int]:
    """'4,8,16' -> [4, 8, 16]; ValueError naming the parameter and the allowed range."""
    try:
        nodes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        nodes = []
    if not nodes or any(not 1 <= n <= 4096 for n in nodes):
        raise ValueError(f"--nodes must be a comma-separated list of integers in [1, 4096], "
                         f"got {text!r}")
    return nodes


def run(args: argparse.Namespace) -> int:
    nodes = parse_nodes(args.nodes)
    if not 1 <= args.gpus_per_node <= 64:
        raise ValueError(f"--gpus-per-node must be an integer in [1, 64], got {args.gpus_per_node}")
    if args.from_telemetry and args.preset:
        raise ValueError("give --preset or --from-telemetry, not both")
    if args.from_telemetry:
        fit = fit_telemetry(args.from_telemetry)
        name = fit.scenario(1, args.gpus_per_node).name

        def make(n: int) -> Scenario:
            return fit.scenario(n, args.gpus_per_node)
        print(f"fitted from {args.from_telemetry}: {json.dumps(fit.to_dict())}")
    else:
        name = args.preset or "paper"

        def make(n: int) -> Scenario:
            return get_preset(name, n, args.gpus_per_node)
    biggest = make(max(nodes))  # validate the largest scenario before minutes of simulation
    if args.telemetry and args.steps * biggest.ranks * biggest.buckets > KEEP_SITES_LIMIT:
        raise ValueError(
            f"--telemetry needs steps x ranks x buckets <= {KEEP_SITES_LIMIT:,}, got "
            f"{args.steps} x {biggest.ranks} x {biggest.buckets}; use fewer --steps or --nodes")

    tel = args.telemetry
    keep_last: dict[str, SimResult] = {}

    def on_result(res: SimResult) -> None:
        if tel is None:
            return
        if "{nodes}" in tel or "{policy}" in tel:
            path = tel.replace("{nodes}", str(res.scenario.nodes)).replace("{policy}", res.policy)
            write_telemetry(res, path)
        elif res.policy == "gpupace" and res.scenario.nodes == max(nodes):
            keep_last["res"] = res

    t0 = time.perf_counter()
    rows = scaling_table(make, nodes, steps=args.steps, seed=args.seed,
                         progress=_Progress(), on_result=on_result)
    print(f"\r{' ' * 60}\r", end="", file=sys.stderr)
    print(f"preset {name}, {args.gpus_per_node} GPUs per node, {args.steps} steps, seed {args.seed}"
          f" ({time.perf_counter() - t0:.1f} s)")
    print(format_table(rows))
    if name == "paper":
        print(STUDY)
    if "res" in keep_last:
        write_telemetry(keep_last["res"], tel)
    if args.json:
        out: dict[str, Any] = {"preset": name,
                               "rows": [{k: finite(v) if isinstance(v, float) else v
                                         for k, v in r.items()} for r in rows]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_table(rows, args.plot, title=f"gpupace simulate --preset {name}")
    return 0


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
