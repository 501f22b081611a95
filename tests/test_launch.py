"""`run_ranks` on real spawned ranks: a signal to the parent ends the ranks too."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

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
