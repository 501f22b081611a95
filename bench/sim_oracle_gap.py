"""Why the policy captures little of the oracle's gain, measured in the simulator: the `paper`
preset at 4 nodes (32 ranks), 2,000 steps, over seeds; figures over the steady state (the
second half of the steps, as `SimResult.summary`).

Per bucket, over the ranks other than that bucket's last arrival (the early ranks):
  wait   the time an early rank waits inside the collective without pacing: what a delay
         could take over
  delay  what the policy delays it by (overshoot_risk 0.1, the default, and 1.0), and what
         the oracle, with perfect foresight, delays it by
and each run's throughput gain over no pacing, in %, pacing's own cost left out (the
scenario's `pacing_site_us` and `pacing_step_us` 0; it takes 0.011% from both).

    python bench/sim_oracle_gap.py [--nodes N] [--steps N] [--seeds N] [--out DIR]

Built on `bench/harness.py`: `--out` writes CSV, JSON and Markdown there.
"""

from __future__ import annotations

import argparse
import sys
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

RISKS = (0.1, 1.0)  # overshoot_risk of the policy runs: the default, and ten times it


def early_ranks(wait: np.ndarray, delay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Waits and delays [steps, ranks, sites] of every rank but each bucket's last natural
    arrival (the lowest wait + delay), flattened."""
    natural = wait + delay
    steps, _, sites = wait.shape
    early = np.ones(wait.shape, dtype=bool)
    k, b = np.meshgrid(np.arange(steps), np.arange(sites), indexing="ij")
    early[k, natural.argmin(axis=1), b] = False
    return wait[early], delay[early]


def bench_gap(h: Harness, nodes: int, steps: int, seeds: int) -> None:
    from gpupace import PaceConfig
    from gpupace.sim import presets, simulate

    # the control law's decisions, as its kernels' cost shifts policy and oracle alike
    sc = presets.paper(nodes).replace(pacing_site_us=0.0, pacing_step_us=0.0)
    runs = {"none": ("none", None), "oracle": ("oracle", None)}
    for risk in RISKS:
        runs[f"gpupace, overshoot_risk {risk}"] = ("gpupace",
                                                   PaceConfig(mode="pace", overshoot_risk=risk))
    gains: dict[str, list[float]] = {name: [] for name in runs if name != "none"}
    for seed in range(seeds):
        h.progress(f"{sc.ranks} ranks x {steps} steps, seed {seed}: {list(runs)}")
        res = {name: simulate(sc, pol, config=cfg, steps=steps, seed=seed, keep_sites=True)
               for name, (pol, cfg) in runs.items()}
        skip = steps // 2
        base = res["none"].summary()["throughput"]
        for name, r in res.items():
            wait, delay = early_ranks(r.site_wait_us[skip:], r.site_delay_us[skip:])
            case = {"ranks": sc.ranks, "seed": seed, "run": name}
            if name == "none":
                h.record("early_rank_per_bucket", {**case, "what": "wait"}, wait)
            else:
                h.record("early_rank_per_bucket", {**case, "what": "delay"}, delay)
                gains[name].append(100.0 * (r.summary()["throughput"] / base - 1.0))
    for name, g in gains.items():
        h.record("gain_over_none", {"ranks": sc.ranks, "run": name, "seeds": seeds}, g,
                 metric="gain", unit="%")
    h.extras["gain_over_none_percent"] = gains


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--nodes", type=int, default=4, help="nodes of 8 ranks (default 4)")
    ap.add_argument("--steps", type=int, default=2000, help="steps per run (default 2000)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    args = ap.parse_args(argv)
    require_positive(ap, args, "nodes", "seeds")
    if args.steps < 50:
        ap.error(f"--steps must be at least 50 (the figures use the second half), got {args.steps}")
    h = Harness("sim_oracle_gap", machine=Machine.probe(),
                out_dir=args.out or RESULTS_DIR)
    bench_gap(h, args.nodes, args.steps, args.seeds)
    return h.finish(write=args.out is not None)


if __name__ == "__main__":
    sys.exit(main())
