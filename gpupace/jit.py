"""Numba kernels compiled for their one signature, once, before a training loop calls them;
and a place for Numba's disk cache where the install has none."""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

_compiling = threading.Lock()


def compile_once(kernel: Any, signature: tuple) -> None:
    """Compiles `kernel` (an njit dispatcher) for `signature`, or loads it from Numba's disk
    cache, and turns further compiles off, so that an argument of another type raises
    TypeError instead of compiling inside a training loop. Does nothing once compiled. Under a
    lock: a second thread would otherwise find compiling already disabled by the first, and
    raise."""
    with _compiling:
        if not kernel.signatures:
            kernel.compile(signature)
            kernel.disable_compile()


def _probe() -> int:
    return 0


def ensure_numba_cache() -> str | None:
    """gpupace's kernels are `njit(cache=True)`, and Numba refuses to decorate one (a
    RuntimeError at import) when it can write neither beside the source (a read-only install,
    a container image) nor in the user's cache folder (no writable HOME), unless
    NUMBA_CACHE_DIR names a place. Then this names one, under the system's temp folder (for
    this process and the ranks it spawns), and says so once. Returns that folder, or None
    when Numba had a place. Decorating a function of this file finds out as Numba would for
    the kernels' files beside it, without compiling anything."""
    import numba

    try:
        numba.njit(cache=True)(_probe)
        return None
    except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        path = os.path.join(tempfile.gettempdir(), f"gpupace-numba-cache-{uid}")
        os.environ["NUMBA_CACHE_DIR"] = path
        numba.config.CACHE_DIR = path
        from .warn import warn

        warn(f"gpupace: Numba can write its compiled kernels neither beside gpupace "
             f"({os.path.dirname(os.path.abspath(__file__))}) nor in the user's cache folder: "
             f"they are cached in {path} (set NUMBA_CACHE_DIR to choose a place)")
        return path
