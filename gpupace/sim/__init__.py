"""Cluster simulator: bulk-synchronous data-parallel steps of up to 65,536 ranks under the
study's four failure modes, run with no pacing, the real gpupace policy, or an oracle.

    from gpupace.sim import presets, simulate, write_telemetry
    res = simulate(presets.paper(nodes=64), policy="gpupace", steps=2000, seed=0)
    res.summary()                       # throughput, step-time CV, p99, ...
    write_telemetry(res, "paper64.jsonl")

Modules: `scenario` (parameters and sources), `fabric` (all-reduce time and contention),
`draws` (random inputs), `engine` (Numba hot loops), `simulate` (policies and results),
`records` (telemetry), `presets`, `calibrate` (fits), `table` (scaling table, plot), `cli`.
"""

from .calibrate import TelemetryFit, fit_telemetry
from .presets import PRESETS, get_preset
from .records import labelled_telemetry, sim_header, to_records, write_telemetry
from .scenario import Scenario
from .simulate import POLICIES, SimResult, simulate
from .table import scaling_table

__all__ = [
    "POLICIES", "PRESETS", "Scenario", "SimResult", "TelemetryFit", "fit_telemetry",
    "get_preset", "labelled_telemetry", "scaling_table", "sim_header", "simulate", "to_records",
    "write_telemetry",
]
