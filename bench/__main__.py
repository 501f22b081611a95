"""Entry point: `python -m bench --suite cpu|gpu|all [--quick] [--out DIR] [--only NAME]`.

Runs the chosen suites, prints progress and the targets on stderr, and writes each suite's
result files. The GPU suite skips cleanly, with a one-line reason, where CUDA is absent, and
then writes nothing: no GPU figure is ever produced without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gpupace.cli import check_output_dir

from .harness import RESULTS_DIR, Harness, Machine, description

Bench = Callable[[Harness], None]


def cpu_benchmarks() -> dict[str, Bench]:
    from .cpu_allreduce import bench_allreduce
    from .cpu_host_path import bench_host_path
    from .cpu_policy import bench_policy
    from .cpu_telemetry import bench_telemetry

    return {"allreduce": bench_allreduce, "policy": bench_policy, "telemetry": bench_telemetry,
            "host_path": bench_host_path}


def gpu_benchmarks() -> dict[str, Bench]:
    # Order matters: `stamp` measures the timer tick that `spin` judges its error against.
    from .gpu_collective import bench_nccl, bench_site
    from .gpu_kernels import bench_spin, bench_stamp, bench_update
    from .gpu_vcluster import bench_vcluster

    return {
        "stamp": bench_stamp,
        "spin": bench_spin,
        "update": bench_update,
        "site": bench_site,
        "nccl": bench_nccl,
        "vcluster": bench_vcluster,
    }


def gpu_missing() -> str | None:
    """Why the GPU suite cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def run_suite(suite: str, *, quick: bool, out: Path, note: str, only: list[str] | None) -> int:
    if suite == "gpu":
        # As the device check and the GPU tests run: a hardware queue per stream (up to 32,
        # read when CUDA starts; the default 8 serialises the virtual cluster's ranks).
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
        why = gpu_missing()
        if why:
            print(f"[bench gpu] SKIP the GPU suite: {why}", file=sys.stderr, flush=True)
            return 0
    benches = cpu_benchmarks() if suite == "cpu" else gpu_benchmarks()
    mine = tuple(n for n in (only or ()) if n in benches)  # `main` checked every name
    if only and not mine:
        return 0  # --suite all --only spin: nothing of the CPU suite
    h = Harness(suite, quick=quick, out_dir=out, machine=Machine.probe(note), only=mine)
    h.progress(
        f"{h.machine.cpu} ({h.machine.cores} cores), GPU {h.machine.gpu}, "
        f"load average {h.machine.load_avg:.2f}; writing {out / h.stem}.*"
    )
    failed = 0
    for name, fn in benches.items():
        if only and name not in only:
            continue
        try:
            fn(h)
        except Exception as e:  # noqa: BLE001 - one broken benchmark must not lose the others
            failed += 1
            h.skip(
                name,
                f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
            )
        h.write()  # after every benchmark: a suite killed half-way keeps what it measured
    for p in h.write():
        h.progress(f"wrote {p}")
    missed = [c.name for c in h.checks if not c.met]
    if missed:
        h.progress(f"targets missed: {missed}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=description(__doc__))
    ap.add_argument("--suite", choices=("cpu", "gpu", "all"), default="cpu")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="few sizes and repeats: a smoke run, its files are named *-quick_*",
    )
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"default {RESULTS_DIR}")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    ap.add_argument(
        "--note", default="", help="free text stored in every row, e.g. 'VM shared with other jobs'"
    )
    args = ap.parse_args(argv)
    try:  # before the benchmarks: a path that cannot be written must not cost their figures
        check_output_dir("--out", str(args.out))
    except ValueError as e:
        ap.error(str(e))
    suites = ("cpu", "gpu") if args.suite == "all" else (args.suite,)
    known = set().union(*(set(cpu_benchmarks() if s == "cpu" else gpu_benchmarks())
                          for s in suites))
    unknown = set(args.only or ()) - known
    if unknown:  # each name against the suites asked for, before any of them runs
        ap.error(f"--only: unknown benchmark(s) {sorted(unknown)} for --suite {args.suite}; "
                 f"known: {sorted(known)}")
    rc = 0
    for suite in suites:
        rc = max(
            rc, run_suite(suite, quick=args.quick, out=args.out, note=args.note, only=args.only)
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
