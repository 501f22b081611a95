"""Numba kernels compiled for their one signature, once, before a training loop calls them;
and a place for Numba's disk cache where the install has none."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from typing import Any

_compiling = threading.Lock()


def compile_once(kernel: Any, signature: tuple) -> None:
    """Compiles `kernel` (an njit dispatcher) for `signature`, or loads it from Numba's disk
    cache, and turns further compiles off, so that an argument of another type raises
    TypeError instead of compiling inside a training loop. Does nothing once compiled. Under a
    lock: a second thread would otherwise find compiling already disabled by the first, and
    raise. Under NUMBA_DISABLE_JIT=1 (a debugging run) the kernel is the plain Python function:
    nothing to compile."""
    if not hasattr(kernel, "signatures"):
        return
    with _compiling:
        if not kernel.signatures:
            kernel.compile(signature)
            kernel.disable_compile()


def _probe() -> int:
    return 0


def ensure_numba_cache() -> str | None:
    """gpupace's kernels are `njit(cache=True)`, and Numba refuses to decorate one (a
    RuntimeError at import) when it can write neither beside the source (a read-only install,
    a container image) nor in the user's cache folder (no writable HOME), nor in
    NUMBA_CACHE_DIR when that is set. Then this names a folder of this user's alone under the
    system's temp folder, in NUMBA_CACHE_DIR too (so the ranks a process spawns take it), and
    says so once. Returns that folder, or None when Numba had a place.
    Decorating a function of this file finds out as Numba would for the kernels' files beside
    it, without compiling anything."""
    import numba

    try:
        numba.njit(cache=True)(_probe)
        return None
    except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
        pass
    given = os.environ.get("NUMBA_CACHE_DIR")
    path = _private_cache_dir()
    numba.config.CACHE_DIR = path
    os.environ["NUMBA_CACHE_DIR"] = path
    try:  # not a change of the environment that Numba re-reads all its settings on
        numba.core.config._env_reloader.old_environ["NUMBA_CACHE_DIR"] = path
    except (AttributeError, TypeError):  # another Numba: at worst, it re-reads them once
        pass
    from .warn import warn

    where = (f"NUMBA_CACHE_DIR ({given})" if given else
             f"beside gpupace ({os.path.dirname(os.path.abspath(__file__))}) or in the "
             f"user's cache folder")
    warn(f"gpupace: Numba cannot write its compiled kernels {'in ' if given else ''}{where}: "
         f"they are cached in {path} (set NUMBA_CACHE_DIR to a writable folder to choose)")
    return path


def _private_cache_dir() -> str:
    """gpupace-numba-cache-<uid> in the temp folder, if it is a folder of this user's that no
    one else can write (Numba unpickles its index files: a folder another user made first
    would let them run code here; lstat, so a symlink is not one), made private if others
    could read it; else a fresh folder of a random name, a cold cache for this process."""
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None:
        path = os.path.join(tempfile.gettempdir(), f"gpupace-numba-cache-{uid}")
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022:
                if st.st_mode & 0o077:
                    os.chmod(path, 0o700)
                return path
        except OSError:  # not made, gone since (a temp-folder clean-up), or not ours to chmod
            pass
    return tempfile.mkdtemp(prefix="gpupace-numba-cache-")
