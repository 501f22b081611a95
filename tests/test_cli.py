"""The `gpupace` command itself: no command, --help, an unknown command."""

import pytest

from gpupace.cli import main


def test_no_command_is_a_usage_error_that_shows_the_commands(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: gpupace" in err and "demo" in err and "report" in err


def test_help_exits_0_and_an_unknown_command_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "usage: gpupace" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["dmeo"])
    assert e.value.code == 2 and "invalid choice: 'dmeo'" in capsys.readouterr().err


def test_version_and_python_dash_m(capsys):
    import subprocess
    import sys

    import gpupace

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"gpupace {gpupace.__version__}\n"
    # where the console script is not on PATH
    out = subprocess.run([sys.executable, "-m", "gpupace", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == f"gpupace {gpupace.__version__}\n"


def test_an_output_file_that_exists_must_be_writable(tmp_path):
    import os

    from gpupace.cli import check_output_file

    mine = tmp_path / "out.json"
    mine.write_text("kept")
    check_output_file("--json", str(mine))  # may be written over: fine
    assert mine.read_text() == "kept"  # the check opened it without cutting it
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".gpupace-probe-")]
    if os.geteuid() == 0:
        pytest.skip("root may write a read-only file")
    mine.chmod(0o444)
    with pytest.raises(ValueError, match="--json must be a file that can be written"):
        check_output_file("--json", str(mine))


def test_a_command_started_with_stdout_closed_runs():
    """`gpupace doctor >&-`: Python sets sys.stdout to None, where print() writes nothing;
    the wrapper for a reader that has gone took None for a stream and raised (a review)."""
    import shlex
    import subprocess
    import sys

    out = subprocess.run(f"{shlex.quote(sys.executable)} -m gpupace doctor >&-", shell=True,
                         capture_output=False, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr
