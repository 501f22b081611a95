"""`run_ranks` on real ranks, spawned or forked from the fork server: a signal to the parent ends
the ranks too; forked ranks see the caller's environment, directory, stdout and stderr of the
moment."""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gpupace import launch
from gpupace.launch import run_ranks

# above run_ranks' own 120 s: a hung rank fails with its message, which names the rank
pytestmark = pytest.mark.timeout(150)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from gpupace import launch
    from gpupace.launch import run_ranks

    def sleeper(rank, world, pid_dir):
        with open(os.path.join(pid_dir, str(rank)), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(100)

    if __name__ == "__main__":
        launch.START_METHOD = sys.argv[2]
        run_ranks(sleeper, 2, sys.argv[1], timeout_s=100)
""")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig,start", [(signal.SIGTERM, "spawn"), (signal.SIGHUP, "forkserver"),
                                       (signal.SIGKILL, "spawn"), (signal.SIGKILL, "forkserver")])
def test_a_signal_to_the_parent_ends_its_ranks(tmp_path, sig, start):
    """SIGKILL runs nothing in the parent (the OOM killer, a CI hard kill): its ranks trained
    on to the end of the run, printing into the terminal; now each watches its parent."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    tmp.mkdir()  # the ranks' store folder: a SIGKILLed parent leaves it, here and not in /tmp
    parent = subprocess.Popen([sys.executable, str(script), str(pids), start],
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, TMPDIR=str(tmp)))
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 or any(p.stat().st_size == 0 for p in pids.iterdir()):
            assert time.monotonic() < deadline, "the ranks did not start"
            assert parent.poll() is None, f"the parent exited early: {parent.returncode}"
            time.sleep(0.1)
        ranks = [int(p.read_text()) for p in pids.iterdir()]
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == (-sig if sig == signal.SIGKILL else 128 + sig)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks), "a rank outlived its parent"
        said = parent.stderr.read()
        assert (f"gpupace: {sig.name} received: stopping the ranks" in said) == (
            sig != signal.SIGKILL), said
        # a signal it handles ends the run as an error does: its store folder removed
        assert bool(list(tmp.glob("gpupace-ranks-*"))) == (sig == signal.SIGKILL)
    finally:
        parent.kill()


CTRL_C_SCRIPT = textwrap.dedent("""
    import faulthandler, os, sys, time
    from gpupace.launch import run_ranks

    def idle(rank, world):
        time.sleep(100)

    if __name__ == "__mp_main__":  # a rank importing its caller's module, as torch takes a while
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
        time.sleep(5)

    if __name__ == "__main__":
        faulthandler.dump_traceback_later(40, exit=True)  # a hang shows where, in the test
        try:
            run_ranks(idle, 2, timeout_s=100)
        except KeyboardInterrupt:
            print("caller interrupted", file=sys.stderr)
            sys.exit(130)
""")


def test_ctrl_c_while_the_ranks_import_is_the_callers_alone(tmp_path):
    """Ctrl-C reaches the whole foreground process group: spawned ranks still importing printed
    a KeyboardInterrupt traceback each, on top of their caller's clean stop (forked ones exit
    silently: the fork server's child catches Exception alone and exits 1)."""
    script = tmp_path / "job.py"
    script.write_text(CTRL_C_SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    # Ctrl-C as a terminal delivers it: with SIGINT at its default, which a harness started in
    # the background without job control has not (its shell ignores SIGINT, inherited here)
    parent = subprocess.Popen([sys.executable, str(script), str(pids)],
                              stderr=subprocess.PIPE, text=True, start_new_session=True,
                              preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2:
            assert time.monotonic() < deadline, "the ranks did not start"
            assert parent.poll() is None, f"the caller exited early: {parent.returncode}"
            time.sleep(0.05)
        ranks = [int(p.name) for p in pids.iterdir()]
        os.killpg(parent.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        _, said = parent.communicate(timeout=60)
        assert parent.returncode == 130, said
        assert "caller interrupted" in said and "Traceback" not in said, said
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks), "a rank outlived its caller"
    finally:
        parent.kill()


def test_a_ctrl_c_while_the_ranks_start_is_raised_after_not_lost():
    """Ignoring SIGINT while the ranks started (their inherited disposition) lost a Ctrl-C that
    came meanwhile: the run went on. Blocked, it waits and is raised on leaving the block."""
    reached = False
    # Python's handler, whatever this harness inherited (a background job ignores SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with launch._ctrl_c_to_caller():
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
                time.sleep(0.05)
                reached = True
    finally:
        signal.signal(signal.SIGINT, before)
    assert reached, "raised while blocked"


@pytest.fixture
def forked(monkeypatch):
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork server on this platform")
    monkeypatch.setattr(launch, "START_METHOD", "forkserver")


def _env_and_cwd(rank, world):
    return os.environ.get("RANKS_ENV_PROBE"), os.getcwd()


def test_forked_ranks_take_the_callers_environment_and_directory_of_the_moment(
        forked, tmp_path, monkeypatch):
    """Forked ranks come from a server started at the first run, with that moment's
    environment: each run's ranks must see the caller's, as spawned ones do."""
    monkeypatch.delenv("RANKS_ENV_PROBE", raising=False)
    before = run_ranks(_env_and_cwd, 2)  # starts the fork server, if it is not running yet
    assert [env for env, _ in before] == [None, None]
    monkeypatch.setenv("RANKS_ENV_PROBE", "set later")
    monkeypatch.chdir(tmp_path)
    assert run_ranks(_env_and_cwd, 2) == [("set later", str(tmp_path))] * 2


def _prints(rank, world):
    print(f"out of rank {rank}", flush=True)
    print(f"err of rank {rank}", file=sys.stderr, flush=True)


def test_forked_ranks_write_to_the_callers_stdout_and_stderr_of_the_moment(forked, capfd):
    """The server keeps the stdout and stderr it started with (here /dev/null, or an earlier
    test's capture): a rank must write to the caller's."""
    with open(os.devnull, "w") as null:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            run_ranks(_env_and_cwd, 1)  # starts the server with them, if it is not running
        finally:
            for fd, was in zip((1, 2), saved, strict=True):
                os.dup2(was, fd)
                os.close(was)
    capfd.readouterr()
    run_ranks(_prints, 2)
    out, err = capfd.readouterr()
    assert "out of rank 0" in out and "out of rank 1" in out, out
    assert "err of rank 0" in err and "err of rank 1" in err, err


def _refuse():
    raise RuntimeError("cannot be rebuilt in a rank")


class Unloadable:
    """Pickles, but raises when a rank unpickles it (as an argument of a module that fails
    to import there would)."""

    def __reduce__(self):
        return _refuse, ()


def test_a_forked_rank_that_cannot_unpickle_its_arguments_reports_why(forked):
    with pytest.raises(RuntimeError, match="(?s)rank 0 of 1 failed:.*cannot be rebuilt"):
        run_ranks(_env_and_cwd, 1, Unloadable())


def test_what_the_fork_server_imports_loads_no_triton():
    """Forked ranks inherit the server's modules: had it imported Triton (through a kernel),
    a rank that sets TRITON_INTERPRET first (tests/test_device_gloo.py) would get compiled
    kernels on a CPU."""
    code = (f"import sys\nfor m in {launch.PRELOAD!r}: __import__(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'cupy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]", out


def test_an_unknown_start_method_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(launch, "START_METHOD", "fork")
    with pytest.raises(ValueError, match="START_METHOD must be one of .* got 'fork'"):
        run_ranks(_env_and_cwd, 1)


def _one_rank_fails(rank, world, how):
    import signal

    import torch
    import torch.distributed as dist

    for _ in range(20):
        dist.all_reduce(torch.ones(4))
    if rank == world - 1:
        if how == "raise":
            raise ValueError("boom on the last rank")
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(20):  # the others go on, and fail for the rank that left
        dist.all_reduce(torch.ones(4))
    return rank


@pytest.mark.parametrize("how, message", [
    ("raise", r"(?s)rank 3 of 4 failed.*ValueError: boom on the last rank"),
    ("kill", r"rank 3 of 4 died \(killed by SIGKILL\) without reporting"),
])
def test_the_rank_that_failed_is_named_not_the_peers_it_took_down(how, message):
    """The failing rank ended its process group, its peers' collectives failed ("Connection
    closed by peer") and reported first: the error named a healthy rank, without the cause."""
    with pytest.raises(RuntimeError, match=message) as e:
        run_ranks(_one_rank_fails, 4, how, timeout_s=60, collective_timeout_s=20)
    assert not str(e.value).startswith(("rank 0", "rank 1", "rank 2")), str(e.value)[:300]


def _sigint_blocked(pid: int) -> bool:
    status = open(f"/proc/{pid}/status").read()
    blocked = int(next(ln for ln in status.splitlines() if ln.startswith("SigBlk:")).split()[1], 16)
    return bool(blocked & (1 << (signal.SIGINT - 1)))


def _my_sigint_blocked(rank, world):
    return _sigint_blocked(os.getpid())


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_forked_ranks_block_ctrl_c_and_leave_the_fork_server_as_it_was(forked):
    """Started by the first rank inside the block, the fork server kept SIGINT blocked for the
    caller's later forkserver children too."""
    assert run_ranks(_my_sigint_blocked, 2) == [True, True]
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    assert server is not None and not _sigint_blocked(server)
    assert not _sigint_blocked(os.getpid())  # nor the caller, after the ranks started
