"""gpupace where its install cannot be written: a read-only package folder (a container image)
and no writable HOME. Numba's disk cache then has no place unless gpupace names one; without
it, `import gpupace` raised ("cannot cache function ...: no locator available")."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpupace

SCRIPT = """
import warnings
warnings.simplefilter("always")
import numpy as np
import numba
import gpupace
from gpupace.policy_fast import median_known
print(median_known(np.array([1.0, 2.0, 3.0])), numba.config.CACHE_DIR, gpupace.__file__)
"""


def _read_only_mounts_work(folder: Path) -> bool:
    """Whether this machine lets a private mount namespace remount a folder read-only (root,
    util-linux's unshare): the only way to make a folder unwritable for root."""
    if shutil.which("unshare") is None:
        return False
    probe = (f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} {folder} "
             f"&& ! touch {folder}/x 2>/dev/null")
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True,
                          timeout=30).returncode == 0


def test_a_read_only_install_without_a_writable_home_imports_and_caches_in_the_temp_folder(
        tmp_path):
    pkg, tmp = tmp_path / "site", tmp_path / "tmp"
    pkg.mkdir()
    tmp.mkdir()
    if not _read_only_mounts_work(pkg):
        pytest.skip("this machine cannot remount a folder read-only (needs root and unshare)")
    shutil.copytree(Path(gpupace.__file__).parent, pkg / "gpupace",
                    ignore=shutil.ignore_patterns("__pycache__"))
    run = (f"mount --bind {pkg} {pkg} && mount -o remount,ro,bind {pkg} {pkg} && "
           f"env -u NUMBA_CACHE_DIR HOME=/proc/no-home TMPDIR={tmp} PYTHONPATH={pkg} "
           f"{sys.executable} -c '{SCRIPT}'")
    out = subprocess.run(["unshare", "-m", "sh", "-c", run], capture_output=True, text=True,
                         timeout=120, cwd=tmp)  # not the checkout's folder: its gpupace first
    assert out.returncode == 0, out.stderr[-3000:]
    median, cache_dir, where = out.stdout.split()
    assert float(median) == 2.0 and Path(where).is_relative_to(pkg)
    assert Path(cache_dir).parent == tmp and cache_dir.startswith(str(tmp / "gpupace-numba-cache"))
    assert "they are cached in" in out.stderr and "set NUMBA_CACHE_DIR" in out.stderr
    assert list(Path(cache_dir).rglob("*median_known*.nbi"))  # compiled, and cached there
