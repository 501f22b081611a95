"""`run_ranks` on real ranks: a signal to the parent ends the ranks too; each run's ranks see the caller's
environment and directory of the moment."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gpupace.launch import run_ranks

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from gpupace.launch import run_ranks

    def sleeper(rank, world, pid_dir):
        with open(os.path.join(pid_dir, str(rank)), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(100)

    if __name__ == "__main__":
        run_ranks(sleeper, 2, sys.argv[1], timeout_s=100)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_parent_ends_its_ranks(tmp_path, sig):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    parent = subprocess.Popen([sys.executable, str(script), str(pids)])
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 or any(p.stat().st_size == 0 for p in pids.iterdir()):
            assert time.monotonic() < deadline, "the ranks did not start"
            assert parent.poll() is None, f"the parent exited early: {parent.returncode}"
            time.sleep(0.1)
        ranks = [int(p.read_text()) for p in pids.iterdir()]
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == 128 + sig
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks), "a rank outlived its parent"
    finally:
        parent.kill()


def _env_and_cwd(rank, world):
    return os.environ.get("RANKS_ENV_PROBE"), os.getcwd()


def test_ranks_take_the_callers_environment_and_directory_of_the_moment(tmp_path, monkeypatch):
    """Forked ranks come from a server started at the first run, with that moment's
    environment: each run's ranks must see the caller's, as spawned ones do."""
    monkeypatch.delenv("RANKS_ENV_PROBE", raising=False)
    before = run_ranks(_env_and_cwd, 2)  # starts the fork server, if it is not running yet
    assert [env for env, _ in before] == [None, None]
    monkeypatch.setenv("RANKS_ENV_PROBE", "set later")
    monkeypatch.chdir(tmp_path)
    assert run_ranks(_env_and_cwd, 2) == [("set later", str(tmp_path))] * 2
