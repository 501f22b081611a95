"""gpupace's Numba kernels in unusual installs: a read-only package folder (a container image)
with no writable HOME, where Numba's disk cache has no place unless gpupace names one (without
it, `import gpupace` raised "cannot cache function ...: no locator available"); and Numba's
JIT switched off for debugging."""

import os
import shlex
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
numba.config.THREADING_LAYER = "workqueue"  # the user's own Numba setting
import gpupace
from gpupace.policy_fast import median_known
print(median_known(np.array([1.0, 2.0, 3.0])), numba.config.CACHE_DIR, gpupace.__file__,
      numba.config.THREADING_LAYER)
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


@pytest.mark.parametrize("squatted", [False, True])
def test_a_read_only_install_without_a_writable_home_imports_and_caches_in_the_temp_folder(
        tmp_path, squatted):
    """`squatted`: the temp folder's gpupace-numba-cache-<uid> exists and others can write it
    (made first by another user, say): Numba unpickles what it finds there, so a folder of a
    random name is used instead."""
    pkg, tmp = tmp_path / "site", tmp_path / "tmp"
    pkg.mkdir()
    tmp.mkdir()
    if not _read_only_mounts_work(pkg):
        pytest.skip("this machine cannot remount a folder read-only (needs root and unshare)")
    shutil.copytree(Path(gpupace.__file__).parent, pkg / "gpupace",
                    ignore=shutil.ignore_patterns("__pycache__"))
    usual = tmp / f"gpupace-numba-cache-{os.getuid()}"
    if squatted:
        usual.mkdir()
        usual.chmod(0o777)
    run = (f"mount --bind {pkg} {pkg} && mount -o remount,ro,bind {pkg} {pkg} && "
           f"env -u NUMBA_CACHE_DIR HOME=/proc/no-home TMPDIR={tmp} PYTHONPATH={pkg} "
           f"{sys.executable} -c {shlex.quote(SCRIPT)}")
    out = subprocess.run(["unshare", "-m", "sh", "-c", run], capture_output=True, text=True,
                         timeout=120, cwd=tmp)  # not the checkout's folder: its gpupace first
    assert out.returncode == 0, out.stderr[-3000:]
    median, cache_dir, where, layer = out.stdout.split()
    assert float(median) == 2.0 and Path(where).is_relative_to(pkg)
    assert layer == "workqueue"  # Numba did not re-read its settings from the environment
    assert Path(cache_dir).parent == tmp and cache_dir.startswith(str(tmp / "gpupace-numba-cache"))
    assert (Path(cache_dir) == usual) != squatted
    assert Path(cache_dir).stat().st_mode & 0o777 == 0o700
    assert "they are cached in" in out.stderr and "set NUMBA_CACHE_DIR" in out.stderr
    assert list(Path(cache_dir).rglob("*median_known*.nbi"))  # compiled, and cached there


def test_a_pacer_runs_with_numba_jit_disabled():
    """NUMBA_DISABLE_JIT=1 (a debugging run) makes the kernels plain functions: Pacer() raised
    AttributeError ('function' object has no attribute 'signatures')."""
    script = ("from gpupace import Pacer, PaceConfig\n"
              "p = Pacer(PaceConfig(mode='pace', warmup_steps=0))\n"
              "for _ in range(3):\n"
              "    with p.site('x'):\n"
              "        pass\n"
              "    p.step()\n"
              "print(p.summary()['steps'])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NUMBA_DISABLE_JIT": "1"},
                         cwd=Path(gpupace.__file__).parent.parent)
    assert out.returncode == 0 and out.stdout.split() == ["3"], out.stderr[-2000:]


@pytest.mark.parametrize("there", ["nothing", "own 0755", "own 0777", "symlink", "file",
                                   "another user's"])
def test_the_numba_cache_folder_is_this_users_alone(tmp_path, monkeypatch, there):
    """The usual folder when it is, or can be made, this user's alone (made private if others
    could read it: a run before this check made it 0755); a fresh one when anyone else could
    write it, it is a link or a file, or another user owns it (Numba unpickles what it finds
    there)."""
    import tempfile

    from gpupace.jit import _private_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    usual = tmp_path / f"gpupace-numba-cache-{os.geteuid()}"
    if there.startswith("own"):
        usual.mkdir()
        usual.chmod(int(there.split()[1], 8))
    elif there == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        usual.symlink_to(tmp_path / "elsewhere")
    elif there == "file":
        usual.write_text("")
    elif there == "another user's":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user needs root")
        usual.mkdir(mode=0o700)
        os.chown(usual, 65534, 65534)
    got = Path(_private_cache_dir())
    assert (got == usual) == (there in ("nothing", "own 0755")), got
    assert got.parent == tmp_path and got.is_dir() and not got.is_symlink()
    assert got.stat().st_mode & 0o777 == 0o700 and got.stat().st_uid == os.geteuid()


def test_without_a_numba_cache_place_one_is_named_and_numba_keeps_its_settings(tmp_path,
                                                                              monkeypatch):
    """The fallback in this process, with Numba's refusal stood in for (the real one needs a
    read-only mount: the test above, as root): NUMBA_CACHE_DIR and Numba's config name the
    folder, and Numba does not take that for a change of its environment, which would re-read
    every setting the user made in code."""
    import tempfile

    import numba
    import numba.core.config as numba_config

    from gpupace import jit

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    monkeypatch.delenv("NUMBA_CACHE_DIR")  # restored as it was after the test
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(numba.config, "THREADING_LAYER", "workqueue")
    reloader = numba_config._env_reloader
    monkeypatch.setattr(reloader, "old_environ", dict(reloader.old_environ))

    def no_place(**_):
        raise RuntimeError("cannot cache function '_probe': no locator available for file")

    monkeypatch.setattr(numba, "njit", no_place)
    with pytest.warns(RuntimeWarning, match="they are cached in .*gpupace-numba-cache"):
        path = jit.ensure_numba_cache()
    assert os.environ["NUMBA_CACHE_DIR"] == numba.config.CACHE_DIR == path
    assert Path(path).parent == tmp_path
    numba_config.reload_config()  # what Numba runs before each compile
    assert numba.config.THREADING_LAYER == "workqueue" and numba.config.CACHE_DIR == path
