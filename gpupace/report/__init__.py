"""`gpupace report`: makes coordination costs visible from telemetry files.

Modules: `load` (files -> runs as arrays), `ranks` (who is late and what it cost a step),
`diagnose` (lost time split between the study's four failure modes), `text` (the headline and
the diagnosis in words), `advice` (suggested actions by backend), `compare` (paced runs
against their baselines), `plots` (PNGs), `html` (report.html, findings.json), `cli`, and
`tensorboard` (optional live logging of the same scalars).

    from gpupace.report import diagnose, load_runs
    for run in load_runs(["baseline.jsonl", "paced.jsonl"]):
        print(run.label, [(m.mode, round(m.share, 2), m.verdict) for m in diagnose(run).modes])
"""

from .diagnose import MODES, Diagnosis, ModeFinding, diagnose
from .load import Run, load_runs

__all__ = ["MODES", "Diagnosis", "ModeFinding", "Run", "diagnose", "load_runs"]
