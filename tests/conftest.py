"""Shared fixtures: the device kernels reloaded under TRITON_INTERPRET=1, so that every line but
the inline-asm clock runs on the CPU."""

import importlib
import os

import pytest
from hypothesis import settings

# CI draws the same examples on every run (a clean clone has no example database), so that a
# rare input found by chance cannot turn an unrelated change red; elsewhere each run explores.
# (Recent hypothesis loads such a profile itself when CI is set; this says it for any version.)
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True, scope="session")
def ranks_from_a_fork_server():
    """Ranks of `gpupace.launch.run_ranks` fork from a server that imported torch once (a
    spawned rank imports it anew: 6 s against 0.13 s for 4 ranks on the 2-core VM); the
    launch tests run both ways."""
    import multiprocessing

    from gpupace import launch

    if "forkserver" in multiprocessing.get_all_start_methods():
        launch.START_METHOD = "forkserver"
    yield


# clock first: the others import its jit functions
KERNEL_MODULES = ("clock", "stamp", "spin", "update", "reduce", "barrier")


def reload_kernels() -> dict:
    return {name: importlib.reload(importlib.import_module(f"gpupace.kernels.{name}"))
            for name in KERNEL_MODULES}


@pytest.fixture(scope="module")
def k():
    """The kernel modules, reloaded with TRITON_INTERPRET=1 (Triton reads it at import) for one
    test module, then reloaded back so that other modules see the normal build."""
    from gpupace.backends import interpreter_defect

    why = interpreter_defect()
    if why:
        pytest.skip(why)
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    mods = reload_kernels()
    assert mods["clock"].interpreting()
    yield mods
    mp.undo()
    reload_kernels()
