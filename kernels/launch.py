"""Launching a Triton kernel on the hot path without the JIT's work on every call.

The JIT binds, specialises and looks the kernel up at each call: 16-17 us of host time a
launch of the exit stamp on the H200 machine of 2026-11-30 (Triton 3.6; 12.5 us in that
evening's first run, 34 in a slow one), against 6.2-6.5 us through the compiled kernel's own
launcher (11.2) and 6.1-6.4 us for a one-element torch add (10.1) (`bench/launch_cost.py`,
in the five device checks' files of that evening, git history); the
update kernel, 40 arguments, took 43 us through the JIT in that first run's quick GPU suite.

`Hot` fixes every argument of a launch but one at most, which the kernel declares
`do_not_specialize`. Its first call goes through the JIT, which compiles (or finds) the
variant these arguments select. Nothing that selects a variant can change afterwards (the
same tensors, the same values, the free argument unspecialised), so later calls go straight
to that compiled kernel's launcher (`CompiledKernel.run`), on torch's current stream (a
capturing one included), with two savings more: the tensors' data pointers, taken once, go
as integers, which Triton's launcher passes through (for a tensor it calls `data_ptr()` and
asks the driver about the pointer, `cuPointerGetAttribute`, at every launch: five of each
for the enter kernel); and no launch metadata or hooks, unless a Triton launch hook (a
profiler's) is set when the kernel is bound: then calls go through the compiled kernel's
runner, which calls the hooks. Not yet measured on a GPU against the runner
(`bench/launch_cost.py` times both). Where the JIT returns no compiled kernel (the
interpreter), or `GPUPACE_DIRECT_LAUNCH=0`, every call goes through the JIT.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

DIRECT_LAUNCH_ENV = "GPUPACE_DIRECT_LAUNCH"
# Compile options of every kernel here. Fused multiply-add on: Triton up to 3.9 compiles so by
# default, and so ran every GPU figure and float32 agreement check so far. Triton 3.10 turns
# the default off, and 3.9 warns while TRITON_DEFAULT_FP_FUSION is unset: pinned per launch,
# so that neither changes these kernels under a user, nor the user's own kernels (as setting
# the variable would). TRITON_FORCE_DISABLE_FP_FUSION=1 still turns it off.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable: "1" or "0", `default` when unset or empty."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return default if value == "" else value == "1"


def direct_wanted() -> bool:
    """Whether launches skip the JIT after their first call (`GPUPACE_DIRECT_LAUNCH=0`: no)."""
    return env_switch(DIRECT_LAUNCH_ENV, True)


def current_stream(device: int) -> int:
    """torch's current CUDA stream on `device`, as the raw handle Triton and CuPy take (no
    Stream object made: it runs once a launch)."""
    return torch._C._cuda_getCurrentRawStream(device)


def launch_hooks_set() -> bool:
    """Whether a Triton launch hook is set (a profiler's, such as proton's)."""
    import triton

    knobs = getattr(triton, "knobs", None)  # triton >= 3.4
    holder = knobs.runtime if knobs is not None else triton.compiler.CompiledKernel
    hooks = (getattr(holder, "launch_enter_hook", None), getattr(holder, "launch_exit_hook", None))
    # Triton >= 3.5 keeps each in a HookChain, whose `calls` are empty when none is set.
    return any(h is not None and getattr(h, "calls", True) for h in hooks)


class Hot:
    """`fn[grid](*args, **meta)` with `args[free]` given at each call (none when `free` is
    None)."""

    def __init__(self, fn: Any, grid: tuple[int, ...], args: list[Any], free: int | None,
                 meta: dict[str, Any]):
        self._fn, self._grid, self._args, self._free, self._meta = fn, grid, list(args), free, meta
        self._compiled: Any = None  # kept: Triton 3.9 unloads its module on __del__ (3.6 never)
        self._run: Any = None  # its run, once bound without hooks
        self._head: tuple = ()  # what `run` takes before the stream: the grid
        self._tail: tuple = ()  # and after it: the function, its metadata, no hooks
        self._raw: list[Any] = []  # the arguments, tensors as their data pointers
        self._runner: Any = None  # the compiled kernel's runner, once bound with hooks set
        self._device = next((a.device.index for a in args if hasattr(a, "device")
                             and a.device.type == "cuda"), None)
        self._direct = direct_wanted() and self._device is not None

    def __call__(self, value: Any = None) -> None:
        if self._run is not None:
            args = self._raw
            if self._free is not None:
                args = args.copy()
                args[self._free] = value
            self._run(*self._head, current_stream(self._device), *self._tail, *args)
            return
        args = self._args
        if self._free is not None:
            args = args.copy()
            args[self._free] = value
        if self._runner is not None:
            self._runner(*args, stream=current_stream(self._device))
            return
        compiled = self._fn[self._grid](*args, **self._meta)
        if self._direct and all(hasattr(compiled, a) for a in ("run", "function",
                                                               "packed_metadata")):
            grid = (*self._grid, 1, 1)[:3]
            runner = compiled[grid]  # loads the module: `function` is set from here on
            self._compiled = compiled
            if launch_hooks_set():
                self._runner = runner
                return
            self._head, self._tail = grid, (compiled.function, compiled.packed_metadata,
                                            None, None, None)
            # self._args keeps the tensors, and so their memory, alive
            self._raw = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in self._args]
            self._run = compiled.run

    @property
    def direct(self) -> bool:
        """Whether calls now go straight to the compiled kernel."""
        return self.path != "jit"

    @property
    def path(self) -> str:
        """How calls launch now: "run" (the compiled kernel's launcher, pointers as integers),
        "runner" (its runner: a launch hook was set) or "jit"."""
        return "run" if self._run is not None else "runner" if self._runner is not None else "jit"


def site_launcher(hot: Hot, n_sites: int) -> Callable[[int], None]:
    """`hot` called with a site index, checked against the buffers' `n_sites` sites."""

    def launch(site: int) -> None:
        if not 0 <= site < n_sites:
            raise ValueError(f"site must be in [0, {n_sites}), got {site}")
        hot(int(site))

    launch.hot = hot  # type: ignore[attr-defined]  # the GPU tests read hot.direct
    return launch
