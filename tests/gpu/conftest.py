"""GPU tests: every test here carries the `gpu` marker and skips without CUDA or triton; those
marked `cupy` (the reduction, the device backend, the virtual cluster) also skip without cupy,
so that a machine without it still measures the clock, the spin and the Triton kernels. Measured
figures go to the JSON file named by GPUPACE_FIGURES (bench/device_check.py sets it), so one
device run records every number it measured."""

from __future__ import annotations

import datetime
import json
import os
import tempfile

import pytest
import torch

from gpupace.backends import cupy_missing

# As the device check sets it: a hardware queue per stream (up to 32; read when CUDA starts),
# so that a plain pytest run measures what the check does. At the default 8, one such run on
# an H200 read the virtual cluster's site-0 spread as 381 us where the checks read 158.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _missing(mod: str) -> str | None:
    try:
        __import__(mod)
    except Exception as e:  # a broken install raises more than ImportError
        return (f"needs {mod} ({type(e).__name__}: {e}): pip install 'gpupace[cuda12]' "
                f"(or 'gpupace[cuda13]')")
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "cupy: a GPU test that also needs cupy")


def pytest_collection_modifyitems(config, items):
    why = "needs CUDA" if not torch.cuda.is_available() else _missing("triton")
    why_cupy = why or cupy_missing()
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            skip = why_cupy if item.get_closest_marker("cupy") else why
            if skip:
                item.add_marker(pytest.mark.skip(reason=skip))
    # Tests that need no NCCL first (stable: files keep their order otherwise), so that a hung
    # or aborted NCCL call loses none of the clock, spin, kernel and virtual-cluster figures.
    items.sort(key=lambda item: "nccl_group" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels():
    """GPU tests need compiled kernels: if a CPU test module reloaded them under the
    interpreter, it reloads them back on teardown; make sure the env var is not set here."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set: GPU tests need compiled kernels")
    yield


class Figures(dict):
    """A dict that writes itself into the JSON file named by GPUPACE_FIGURES at every
    assignment, merged with what is there: a device run killed half-way keeps each figure
    measured before the kill."""

    def __init__(self, path: str | None):
        super().__init__()
        self.path = path

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if not self.path:
            return
        old = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                old = json.load(f)
        old[key] = value
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(old, f, indent=2, default=float)
        os.replace(tmp, self.path)


@pytest.fixture(scope="session")
def figures():
    """figures[name] = value: recorded for the device check's result files."""
    return Figures(os.environ.get("GPUPACE_FIGURES"))


@pytest.fixture(scope="session")
def nccl_group():
    """A single-rank NCCL process group for the whole session."""
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    made = not dist.is_initialized()
    if made:
        store = tempfile.mktemp(prefix="gpupace-nccl-")
        # A hung NCCL call raises after a minute (its test fails) instead of holding the
        # session until the device check's deadline kills every test after it.
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0),
                                timeout=datetime.timedelta(seconds=60))
    yield dist.group.WORLD
    if made and dist.is_initialized():
        # A group left alive can keep pytest from exiting (NCCL's watchdog thread).
        torch.cuda.synchronize()
        dist.destroy_process_group()
