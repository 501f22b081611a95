"""GPU benchmark of the virtual cluster (`gpupace.vcluster`, issue 3: N streams in one process
as N ranks with a device-side barrier): what pacing costs there, paced against unpaced steps.

The virtual cluster was not in the repository when this suite was written, so this benchmark
skips with a reason naming what is missing; it is to be written against its launcher API once
that exists (the suite records the skip, it never writes a figure it did not measure).
"""

from __future__ import annotations

from . import gpu_common as gc
from .harness import Harness


def bench_vcluster(h: Harness) -> None:
    why = gc.missing("cuda", "triton", "gpupace.vcluster")
    if why:
        h.skip("vcluster", why)
        return
    h.skip(
        "vcluster",
        "gpupace.vcluster exists but this benchmark predates its API: "
        "no measurement written for it yet (bench/gpu_vcluster.py)",
    )
