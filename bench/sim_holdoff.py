"""How soon the policy paces, measured in the simulator: the holdoff of a rank never last at a
site (`gpupace.policy.holdoff`) is 5 calm steps for each rank that has been, so a job whose
last arrival is always one rank (`locality`: the slow ranks 6 and 7 of every node, the first of
them always last) is paced within tens of steps at any size, one whose slow ranks take turns
(the same with 1% compute noise) after 5 steps for each of them, while one whose stalls fall on
any rank (`jitter`) is held off for at least about 5 steps a rank, as before.

Per preset and size, one gpupace run and one without pacing, same seed:
  first_delay    the first step at which the policy delayed any rank
  paced_ranks    % of ranks delayed at least once in the last 10% of the steps
  n_last         ranks that have been last, at the end (the most over the sites)
  holdoff_5n     the step before which no rank could be delayed under the rule before
                 2026-12-01 (5 steps per rank of the job): computed, not measured
  gain           throughput over no pacing, %, over the second half, or from `holdoff_5n` on
                 where that is later and leaves a fifth of the run: random stalls must cost
                 nothing once ranks pass the holdoff by chance; pacing's own cost is left out
                 (the scenario's `pacing_site_us` and `pacing_step_us` 0)

    python bench/sim_holdoff.py [--out DIR]

Built on `bench/harness.py`: `--out` writes CSV, JSON and Markdown there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import RESULTS_DIR, Harness, Machine, description  # noqa: E402

# (preset, nodes of 8 ranks, steps, compute noise): a persistent straggler up to 4096 ranks, a
# few hundred steps; the slow ranks (2 a node) taking turns; random stalls long enough to pass
# the 5-steps-a-rank holdoff, plus 1500.
CASES = (("locality", 8, 400, 0.0), ("locality", 64, 400, 0.0), ("locality", 512, 400, 0.0),
         ("locality", 8, 1500, 0.01), ("locality", 64, 1500, 0.01),
         ("jitter", 8, 5 * 64 + 1500, None), ("jitter", 64, 5 * 512 + 1500, None))


def bench_holdoff(h: Harness, cases=CASES) -> None:
    from gpupace import PaceConfig
    from gpupace.sim import presets, simulate
    from gpupace.sim.simulate import policy_start_step

    cfg = PaceConfig(mode="pace")
    for name, nodes, steps, noise in cases:
        # when the policy acts, not what its kernels cost: their cost left out
        sc = presets.get_preset(name, nodes, 8).replace(pacing_site_us=0.0, pacing_step_us=0.0)
        if noise is not None:
            sc = sc.replace(noise_sigma=noise)
        h.progress(f"{name}, {sc.ranks} ranks x {steps} steps, noise {sc.noise_sigma}")
        none, paced = (simulate(sc, p, config=cfg, steps=steps, seed=0)
                       for p in ("none", "gpupace"))
        delayed = paced.delay_us > 0  # [steps, ranks]
        any_step = np.flatnonzero(delayed.any(axis=1))
        old_rule = policy_start_step(cfg, sc.ranks)
        skip = max(old_rule, steps // 2) if old_rule <= 0.8 * steps else steps // 2
        gain = 100.0 * (paced.summary(skip)["throughput"] / none.summary(skip)["throughput"] - 1)
        case = {"preset": name, "noise": sc.noise_sigma, "ranks": sc.ranks, "steps": steps}
        h.record("first_delay", case, [any_step[0] if any_step.size else np.nan],
                 metric="step", unit="step")
        h.record("paced_ranks", case, [100.0 * delayed[-steps // 10:].any(axis=0).mean()],
                 metric="share", unit="%")
        h.record("n_last", case, [int(paced.extra["n_last"].max())], metric="ranks",
                 unit="ranks")
        h.record("holdoff_5n", case, [old_rule], metric="step (computed)", unit="step")
        h.record("gain", {**case, "from_step": skip}, [gain], metric="gain", unit="%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    args = ap.parse_args(argv)
    h = Harness("sim_holdoff", machine=Machine.probe(), out_dir=args.out or RESULTS_DIR)
    bench_holdoff(h)
    return h.finish(write=args.out is not None)


if __name__ == "__main__":
    sys.exit(main())
