"""The `gpupace` command. Each subcommand lives in its own module, which provides
`add_arguments(parser)` and `run(args) -> int`; modules are imported only when their
subcommand runs, so `gpupace --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# name -> (module, one-line help)
COMMANDS = {
    "demo": ("gpupace.demo", "real multi-rank training run: baseline against paced, side by side"),
    "simulate": ("gpupace.sim.cli", "simulate a cluster (1 to 4096 nodes) with and without pacing"),
    "report": ("gpupace.report.cli", "HTML report and failure-mode diagnosis from telemetry files"),
    "doctor": ("gpupace.doctor", "which backends this machine supports, and why not"),
}
ALIASES = {"sim": "simulate"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ALIASES:
        argv[0] = ALIASES[argv[0]]
    parser = argparse.ArgumentParser(
        prog="gpupace", description="Measure and explain synchronisation jitter in "
        "data-parallel training, and pace early ranks.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"gpupace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False,
                       aliases=[a for a, to in ALIASES.items() if to == name])
    if not argv:  # a usage error, as argparse's own: the help, to stderr, and status 2
        parser.print_help(sys.stderr)
        return 2
    if argv[0] not in COMMANDS:
        parser.parse_args(argv)  # exits: 0 for --help, 2 for an unknown command
        return 2
    module_name = COMMANDS[argv[0]][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(f"gpupace {argv[0]}: not available in this version", file=sys.stderr)
            return 2
        raise
    cmd = argparse.ArgumentParser(prog=f"gpupace {argv[0]}", description=COMMANDS[argv[0]][1])
    module.add_arguments(cmd)
    args = cmd.parse_args(argv[1:])
    stdout = sys.stdout
    if stdout is not None:  # None: started with stdout closed, where print() writes nothing
        sys.stdout = _UntilReaderGone(stdout)
    try:
        return int(module.run(args) or 0)
    except (ValueError, OSError, TimeoutError, RuntimeError) as e:
        # Bad input, a path that can't be written, or a failed rank: the message (with a
        # rank's traceback), not ours.
        print(f"gpupace {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # a size past this machine's memory (--steps 1e10)
        print(f"gpupace {argv[0]}: error: out of memory ({type(e).__name__}: {e}): ask for "
              "less (fewer steps, ranks or a smaller batch)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gpupace {argv[0]}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = stdout


class _UntilReaderGone:
    """A command's stdout that, once its reader has gone (`gpupace report ... | head -1`),
    writes nothing more: the command goes on to write its files and exit 0. A closed pipe
    otherwise failed the report before it wrote anything ("error: [Errno 32] Broken pipe",
    status 2), or after, with "Exception ignored" at exit (status 120)."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            self._stream.write(text)
            if "\n" in text:  # as a terminal's line buffering would: a closed pipe shows here
                self._stream.flush()
        except BrokenPipeError:
            self._gone()
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        # The stream's descriptor now writes to /dev/null, so that its buffered text and the
        # interpreter's flush at exit raise nothing.
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
            pass
        self._stream = open(os.devnull, "w")  # noqa: SIM115  # for the command's lifetime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def check_output_file(option: str, path: str) -> None:
    """ValueError naming `option` unless `path` can be written as a file: not a directory,
    and its nearest existing parent a writable directory (the missing ones are created).
    For the subcommands, before a run whose results a bad path would cost."""
    if not path:  # an unset shell variable: nothing would be written, and nothing said
        raise ValueError(f"{option} must be a file path, got an empty string")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{option} must be a file path, got the directory {path!r}")
    if (folder := _unwritable(p.parent)) is not None:
        raise ValueError(f"{option} must be a path whose folder can be created and written, "
                         f"got {path!r} ({folder} is not a writable directory)")
    if p.exists():  # opened to append: nothing created, nothing cut (a FIFO: no wait)
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NONBLOCK", 0)))
        except OSError as e:
            raise ValueError(f"{option} must be a file that can be written, got {path!r} "
                             f"({e.strerror})") from None


def check_output_dir(option: str, path: str) -> None:
    """ValueError naming `option` unless `path` can be written as a folder: not a file, and
    its nearest existing folder (itself, or a parent) writable."""
    if not path:  # Path('') is '.': an unset shell variable wrote into the current folder
        raise ValueError(f"{option} must be a folder path, got an empty string")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{option} must be a folder, got the file {path!r}")
    if (folder := _unwritable(p)) is not None:
        raise ValueError(f"{option} must be a folder that can be created and written, got "
                         f"{path!r} ({folder} is not a writable directory)")


def _unwritable(folder: Path) -> Path | None:
    """`folder`'s nearest existing self or parent when that is not a writable directory (the
    missing folders below it could not be made), else None. Found by writing a file there:
    os.access says yes to root everywhere, /proc and read-only mounts included."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return folder
    try:  # a named file, closed and removed (an unnamed one can linger on some mounts)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".gpupace-probe-")
    except OSError:
        return folder
    os.close(fd)
    os.unlink(probe)
    return None


if __name__ == "__main__":
    sys.exit(main())
