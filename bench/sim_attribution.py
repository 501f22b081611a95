"""The report's lost-time split against each cause's cost in the simulator, where the causes
are known: each preset runs without pacing, `gpupace report`'s diagnosis reads its telemetry,
and the same run (same seed, same draws) runs again with one cause switched off at a time;
the mean step time that saves is what the cause cost. The report should rank them alike.

Causes switched off, and the report's mode each one should show up in:
  locality  fixed per-rank offsets (placement, input)     -> locality
  fabric    oversubscribed uplinks, switch contention      -> fabric_contention
  noise     per-bucket compute noise: random late ranks    -> sync_amplification
  stalls    heavy-tailed stalls                            -> runtime_jitter (sync_amplification
                                                              for the part the coupling spreads)
  regimes   communication-bound regimes                    -> runtime_jitter
  coupling  waiting collectives slow overlapping compute   -> sync_amplification
The savings do not add up: causes compound (a stall costs more where the coupling passes it
on, a late rank more where the others' noise is already paid). And the report measures lost
time against the run's own fastest steps (5th percentile), so a cost that every step pays
stays inside its ideal step: that is the gap this benchmark shows.

    python bench/sim_attribution.py [--presets mixed,paper] [--nodes N] [--steps N]
                                    [--seeds N] [--out DIR]

Figures in ms per step, over the measured steps (the report's: warm-up left out; the
simulator's: the second half). Built on `bench/harness.py`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import RESULTS_DIR, Harness, Machine, require_positive  # noqa: E402

# cause -> the Scenario fields that switch it off
CAUSES = {
    "locality": lambda sc: dict(locality_pattern_us=(0.0,) * len(sc.locality_pattern_us),
                                input_pattern_us=(0.0,) * len(sc.input_pattern_us),
                                rank_speed_sigma=0.0),
    "fabric": lambda sc: dict(oversubscription=1.0, contention_mean=0.0),
    "noise": lambda sc: dict(noise_sigma=0.0),
    "stalls": lambda sc: dict(spike_prob=0.0),
    "regimes": lambda sc: dict(regime_on_prob=0.0),
    "coupling": lambda sc: dict(coupling=0.0, paced_coupling=0.0),
}


def mean_step_ms(res) -> float:
    st = res.step_us[res.steps // 2:]
    return float(np.nanmean(st)) / 1e3


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
        ref = mean_step_ms(base)
        for cause, off in CAUSES.items():
            changes = off(sc)
            if all(getattr(sc, k) == v for k, v in changes.items()):
                continue  # not in this preset
            alt = simulate(sc.replace(**changes), "none", steps=steps, seed=seed)
            cost.setdefault(cause, []).append(ref - mean_step_ms(alt))
    case = {"preset": preset, "ranks": sc.ranks, "steps": steps, "seeds": seeds}
    for mode, v in split.items():
        h.record("report_split", {**case, "mode": mode}, v, metric="lost per step", unit="ms")
    for cause, v in cost.items():
        h.record("cause_cost", {**case, "switched_off": cause}, v, metric="saved per step",
                 unit="ms")
    h.extras[preset] = {"report_ms_per_step": split, "switched_off_saves_ms_per_step": cost}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="mixed,paper",
                    help="comma-separated presets (default mixed,paper)")
    ap.add_argument("--nodes", type=int, default=8, help="nodes of 8 ranks (default 8)")
    ap.add_argument("--steps", type=int, default=1000, help="steps per run (default 1000)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    args = ap.parse_args(argv)
    require_positive(ap, args, "nodes", "seeds")
    if args.steps < 100:
        ap.error(f"--steps must be at least 100 (the report needs 30 measured steps, the "
                 f"simulator's figures use the second half), got {args.steps}")
    from gpupace.sim.presets import PRESETS

    names = [p for p in args.presets.split(",") if p]
    unknown = [p for p in names if p not in PRESETS]
    if not names or unknown:
        ap.error(f"--presets must name presets of {sorted(PRESETS)}, got {args.presets!r}")
    h = Harness("sim_attribution", machine=Machine.probe(), out_dir=args.out or RESULTS_DIR)
    for preset in names:
        bench_preset(h, preset, args.nodes, args.steps, args.seeds)
    return h.finish(write=args.out is not None)


if __name__ == "__main__":
    sys.exit(main())
