"""Numba kernels compiled for their one signature, once, before a training loop calls them."""

from __future__ import annotations

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
