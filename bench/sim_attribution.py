"""The report's lost-time split against each cause's cost in the simulator, where the causes
are known: each preset runs without pacing, `gpupace report`'s diagnosis reads its telemetry,
and the same run runs again with one cause switched off at a time, every other random draw
kept (the simulator draws from one generator, so a cause is switched off by taking its effect
away, not its draws: `noise_sigma=0` would have shifted the stalls, contention and regimes
drawn after it); the mean step time that saves, over the steps the report measures, is what
the cause cost. The report should rank them alike. "all" switches every cause off at once.

Causes switched off, and the report's mode each one should show up in:
  locality  fixed per-rank offsets (placement, input)     -> locality
  fabric    oversubscribed uplinks, switch contention      -> fabric_contention
  noise     per-bucket compute noise: random late ranks    -> sync_amplification
  stalls    heavy-tailed stalls                            -> runtime_jitter (sync_amplification
                                                              for the part the coupling spreads)
  regimes   communication-bound regimes                    -> runtime_jitter
  coupling  waiting collectives slow overlapping compute   -> sync_amplification
The report measures lost time against the run's own fastest steps (5th percentile), so a cost
that every step pays stays inside its ideal step: that is the gap this benchmark shows.

    python bench/sim_attribution.py [--presets mixed,paper] [--nodes N] [--steps N]
                                    [--seeds N] [--out DIR]

Figures in ms per step, over the steps the report measures. Built on `bench/harness.py`.
"""

from __future__ import annotations

import argparse
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

TINY = 1e-12  # a size that keeps a random process drawn and takes its effect away
MAX_NODES = 512
MAX_STEPS = 100_000


def _has_locality(sc) -> bool:
    return any(sc.locality_pattern_us) or any(sc.input_pattern_us) or sc.rank_speed_sigma > 0


# cause -> (whether the scenario has it, the fields that take its effect away, draws kept)
CAUSES = {
    "locality": (_has_locality,
                 lambda sc: dict(locality_pattern_us=(0.0,) * len(sc.locality_pattern_us),
                                 input_pattern_us=(0.0,) * len(sc.input_pattern_us),
                                 rank_speed_sigma=min(sc.rank_speed_sigma, TINY))),
    "fabric": (lambda sc: sc.oversubscription > 1 or sc.contention_mean > 0,
               lambda sc: dict(oversubscription=1.0,
                               contention_mean=min(sc.contention_mean, TINY))),
    "noise": (lambda sc: sc.noise_sigma > 0, lambda sc: dict(noise_sigma=TINY)),
    "stalls": (lambda sc: sc.spike_prob > 0, lambda sc: dict(spike_us=TINY)),
    "regimes": (lambda sc: sc.regime_on_prob > 0 and sc.regime_comm_factor != 1.0,
                lambda sc: dict(regime_comm_factor=1.0)),
    "coupling": (lambda sc: sc.coupling > 0 or sc.paced_coupling > 0,
                 lambda sc: dict(coupling=0.0, paced_coupling=0.0)),
}


def switched_off(sc, causes: list[str]):
    """`sc` with `causes` switched off, every random draw kept."""
    changes: dict = {}
    for cause in causes:
        changes.update(CAUSES[cause][1](sc))
    return sc.replace(**changes)


def mean_step_ms(res, first: int) -> float:
    """The mean step time (ms) from step `first` on (the report's measured steps)."""
    return float(np.nanmean(res.step_us[first:])) / 1e3


def bench_preset(h: Harness, preset: str, nodes: int, steps: int, seeds: int) -> None:
    from gpupace.report.diagnose import diagnose
    from gpupace.report.load import load_runs
    from gpupace.sim import presets, simulate
    from gpupace.sim.records import write_telemetry

    sc = presets.get_preset(preset, nodes)
    split: dict[str, list[float]] = {}
    cost: dict[str, list[float]] = {}
    for seed in range(seeds):
        h.progress(f"{preset}: {sc.ranks} ranks x {steps} steps, seed {seed}")
        base = simulate(sc, "none", steps=steps, seed=seed, keep_sites=True)
        with tempfile.TemporaryDirectory() as tmp:
            d = diagnose(load_runs([write_telemetry(base, Path(tmp) / f"{preset}.jsonl")])[0])
        n = d.summary["measured_steps"]
        split.setdefault("lost (all)", []).append(d.summary["lost_us"] / n / 1e3)
        for m in d.modes:
            split.setdefault(m.mode, []).append(m.lost_us / n / 1e3)
        split.setdefault("unattributed", []).append(d.summary["unattributed_us"] / n / 1e3)
        first = d.summary["warmup_steps_left_out"]
        ref = mean_step_ms(base, first)
        present = [cause for cause, (has, _) in CAUSES.items() if has(sc)]
        for cause in present + (["all"] if len(present) > 1 else []):
            alt = simulate(switched_off(sc, present if cause == "all" else [cause]), "none",
                           steps=steps, seed=seed)
            cost.setdefault(cause, []).append(ref - mean_step_ms(alt, first))
    case = {"preset": preset, "ranks": sc.ranks, "steps": steps, "seeds": seeds}
    for mode, v in split.items():
        h.record("report_split", {**case, "mode": mode}, v, metric="lost per step", unit="ms")
    for cause, v in cost.items():
        h.record("cause_cost", {**case, "switched_off": cause}, v, metric="saved per step",
                 unit="ms")
    h.extras[preset] = {"report_ms_per_step": split, "switched_off_saves_ms_per_step": cost}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--presets", default="mixed,paper",
                    help="comma-separated presets (default mixed,paper)")
    ap.add_argument("--nodes", type=int, default=8, help="nodes of 8 ranks (default 8)")
    ap.add_argument("--steps", type=int, default=1000, help="steps per run (default 1000)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    args = ap.parse_args(argv)
    require_positive(ap, args, "nodes", "seeds")
    if args.nodes > MAX_NODES:
        ap.error(f"--nodes must be <= {MAX_NODES}, got {args.nodes}")
    if not 100 <= args.steps <= MAX_STEPS:
        ap.error(f"--steps must be in [100, {MAX_STEPS}] (the report needs 30 measured steps), "
                 f"got {args.steps}")
    from gpupace.sim.presets import PRESETS

    names = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in names if p not in PRESETS]
    if not names or unknown:
        ap.error(f"--presets must name presets of {sorted(PRESETS)}, got "
                 f"{', '.join(map(repr, unknown)) or 'none'} in {args.presets!r}")
    if args.out is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--out must be a folder that can be written, got {str(args.out)!r}: {e}")
    h = Harness("sim_attribution", machine=Machine.probe(), out_dir=args.out or RESULTS_DIR)
    for preset in names:
        bench_preset(h, preset, args.nodes, args.steps, args.seeds)
    return h.finish(write=args.out is not None)


if __name__ == "__main__":
    sys.exit(main())
