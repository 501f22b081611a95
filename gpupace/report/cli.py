"""`gpupace report RUN.jsonl [MORE.jsonl ...] [--out DIR [--json]]`: reads telemetry files (a
real job's, `gpupace demo`'s, the simulator's; several rank files of one run, or a baseline
and a paced run) and diagnoses each run; with `--out`, writes DIR/report.html with its PNG
plots, and with `--json` DIR/findings.json. Progress goes to stderr; to stdout, a headline per
run (who is late, the leading cause), its lost time and split, and the notes on what was read;
a line per paced-vs-baseline comparison, then the written paths. Without `--out` nothing is
written: the quick look from a terminal, without the plots' time. The files are made in a
folder of their own inside DIR and moved in when all are written, the page last, so that a
report interrupted while it reads, diagnoses or plots leaves the earlier one in DIR as it was
(one killed by SIGKILL leaves its hidden .gpupace-report-* folder too)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path

from ..cli import check_output_dir
from .compare import cli_line
from .diagnose import LOST_DEFINITION, diagnose
from .html import findings, render
from .load import load_runs, stderr_progress
from .plots import make_all
from .text import cost_line, headline, lost_line, split_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="RUN.jsonl",
                   help="telemetry files (a directory: its *.jsonl files); give a baseline "
                   "and a paced run to compare them")
    p.add_argument("--out", metavar="DIR", help="write DIR/report.html and its plots (without "
                   "it: the text alone)")
    p.add_argument("--json", action="store_true", help="also write DIR/findings.json")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    if args.json and args.out is None:
        raise ValueError("--json writes DIR/findings.json: give --out DIR with it")
    out = Path(args.out) if args.out is not None else None
    if out is not None:  # before the reading, which takes ~20 s at 4096 ranks
        check_output_dir("--out", args.out)
    progress = None if args.quiet else stderr_progress
    runs = load_runs(args.files, progress=progress)
    diags = [diagnose(r) for r in runs]
    doc = findings(runs, diags)
    for run_, d in zip(runs, diags, strict=True):  # who is late and why, then what it cost
        print(headline(d))
        if cost := cost_line(d):
            print(f"  {cost}")
        if "lost_fraction" in d.summary:
            print(f"  {lost_line(d)}")
            print(f"  {split_line(d)}")
        for note in run_.notes:  # which file was read, what the writer dropped or skipped
            print(f"  note: {note}")
    for comp in doc["comparisons"]:
        print(cli_line(comp))
    if any("lost_fraction" in d.summary for d in diags):  # a definition of a figure shown
        print(f"({LOST_DEFINITION})")
    if out is None:
        print("(--out DIR writes the HTML report, its plots and, with --json, findings.json)")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    # Written in a folder of its own and moved in at the end, the page last: an interrupted
    # report leaves the earlier one as it was, not half of each.
    staging = Path(tempfile.mkdtemp(prefix=".gpupace-report-", dir=out))
    try:
        if progress:
            progress(f"plotting {len(runs)} run(s)")
        plots = make_all(runs, diags, staging, progress)
        if args.json:
            (staging / "findings.json").write_text(json.dumps(doc, indent=1) + "\n",
                                                   encoding="utf-8")
        page = staging / "report.html"
        page.write_text(render(runs, diags, plots, staging), encoding="utf-8")
        if taken := sorted(p.name for p in staging.iterdir() if (out / p.name).is_dir()):
            raise ValueError(f"--out {out} holds folders named as the report's files "
                             f"({', '.join(taken)}): move them, or give another --out")
        _clear_earlier_report(out)
        for path in sorted(staging.iterdir(), key=lambda p: p == page):  # the page last
            path.replace(out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(out / "report.html")
    if args.json:
        print(out / "findings.json")
    return 0


def _clear_earlier_report(out: Path) -> None:
    """Removes what an earlier report wrote in `out` (its page, findings.json and the plots
    its page names), so that none of it is left beside the new one (a findings.json of other
    runs, a lateness plot of a fourth run). Other files are left alone."""
    page = out / "report.html"
    if not page.is_file():
        return
    names = re.findall(r"data-file='([^'/\\]+)'", page.read_text(encoding="utf-8",
                                                                   errors="replace"))
    # the page last: it lists the rest, for a later run to find if this one is interrupted
    for name in [*sorted({"findings.json", *names} - {"report.html"}), "report.html"]:
        path = out / name
        if not path.is_dir():  # a folder of the user's that the page names: not ours
            path.unlink(missing_ok=True)
