"""Simulator speed: 64 ranks x 10,000 steps and 4096 ranks x 1,000 steps of the `paper`
preset's workload (10 buckets), per policy, with Numba's compile time reported apart.

    python bench/sim_speed.py [--quick] [--repeats N] [--out DIR]

Targets (issue 5, on the 2-core CI machine): 64 x 10,000 in under 2 s, 4096 x 1,000 in
under 10 s. A run's time excludes compilation (`engine.warmup()` runs first); the time spent
inside `gpupace.policy` (update, oracle_delays) is reported as its own row, since the
simulator calls the real NumPy policy once per step and does not own its cost.
Compile time is measured in fresh processes: cold with an empty Numba cache directory, then
warm, loading what the cold run cached. Built on `bench/harness.py` (quantiles, machine,
result files); `--out` writes its CSV/JSON/Markdown there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (  # noqa: E402
    RESULTS_DIR,
    Harness,
    Machine,
    description,
    require_positive,
)

CASES = [(8, 10_000, 2.0), (512, 1_000, 10.0)]  # nodes (x 8 GPUs), steps, target seconds
POLICIES = ("none", "gpupace", "oracle")
_COMPILE = (
    "import time; t = time.perf_counter(); from gpupace.sim import engine; "
    "t1 = time.perf_counter(); engine.warmup(); "
    "print(t1 - t, time.perf_counter() - t1)"
)


def compile_seconds(cache_dir: str) -> tuple[float, float]:
    """(import seconds, compile-or-load seconds) of the Numba kernels in a fresh process."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), float(out[1])


def bench_sim(h: Harness, repeats: int = 3) -> None:
    from gpupace.sim import presets, simulate

    with tempfile.TemporaryDirectory(prefix="gpupace-numba-") as cache:
        cold = [compile_seconds(cache)]  # the first run fills the empty cache
        warm = [compile_seconds(cache) for _ in range(max(2, repeats))]
    for _ in range(repeats - 1 if not h.quick else 0):  # each cold compile in an empty cache
        with tempfile.TemporaryDirectory(prefix="gpupace-numba-") as cache:
            cold.append(compile_seconds(cache))
    h.record("sim", "numba compile, cold cache", [c for _, c in cold], unit="s")
    h.record("sim", "numba load, warm cache", [c for _, c in warm], unit="s")
    h.record("sim", "import gpupace.sim.engine (numba)", [i for i, _ in warm], unit="s")

    for nodes, steps, target in CASES:
        if h.quick:
            steps //= 10
        sc = presets.paper(nodes)
        for pol in POLICIES:
            wall, inside = [], []
            for r in range(repeats):
                res = simulate(sc, pol, steps=steps, seed=r, keep_sites=False)
                wall.append(res.elapsed_s)
                inside.append(res.policy_s)
            case = {"ranks": sc.ranks, "steps": steps, "buckets": sc.buckets, "policy": pol}
            h.record("sim", case, wall, metric="run", unit="s")
            if pol == "gpupace":  # the oracle's delays are computed inside the engine
                h.record("sim", case, inside, metric="in gpupace.policy", unit="s")
            if not h.quick:
                h.check(
                    f"{sc.ranks} ranks x {steps} steps, {pol}",
                    float(np.median(wall)),
                    target,
                    "s",
                    detail=f"median of {repeats}; policy share "
                    f"{float(np.median(inside)):.2f} s",
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--quick", action="store_true", help="a tenth of the steps, no targets")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (default 3)")
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    ap.add_argument("--note", default="", help="free text for the machine (a shared VM, say)")
    args = ap.parse_args(argv)
    require_positive(ap, args, "repeats")
    h = Harness("sim", quick=args.quick, machine=Machine.probe(args.note),
                out_dir=args.out or RESULTS_DIR)
    bench_sim(h, args.repeats)
    return h.finish(write=args.out is not None)


if __name__ == "__main__":
    sys.exit(main())
