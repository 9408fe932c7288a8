"""The command-line parsing every kvparity command shares: the one usage-error parser class
(`UsageParser`), the checks of output files and folders, and `run_command`. Bad input is one line on
stderr and exit 3, found before any engine is built; `--help` shows every default."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from conformance.exit_codes import ExitCode
from conformance.contract import UsageError


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` shows every default. A default of None or False prints as nothing useful, so an option
    with one says in its own help what happens when it is not given; help that already places
    %(default)s is left alone."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class UsageParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors raise `UsageError` instead of printing the usage block and
    exiting 2: kvparity's 2 means "inconclusive", and a usage error is 3 with one line (`run_command`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class BadPath(UsageError, argparse.ArgumentTypeError):
    """A path that cannot be used. An ArgumentTypeError too, so that argparse, calling a check below as an
    argument's type, says why ("--out: /etc/passwd exists and is not a directory") where it said only
    "invalid output_dir value"; called directly, it is a UsageError like any other."""


def _check_creatable(path: Path) -> None:
    """`path` exists and is writable, or its nearest existing ancestor is a writable directory."""
    existing = next(a for a in (path.absolute(), *path.absolute().parents) if a.exists())
    if existing != path.absolute() and not existing.is_dir():
        raise BadPath(f"cannot create {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
        raise BadPath(f"cannot write {path}: {existing} is not writable")


def named(text: str) -> str:
    """A path or address that is not empty. `Path("")` is the current folder: `--out $DIR` with DIR unset
    wrote a campaign's merged report into whatever folder it ran in, and `--database ""` fell back to the
    local folder, so a shard shared none of its failures with the others (exit 0 both)."""
    if not str(text).strip():
        raise BadPath("an empty path or address (an unset variable?): name it")
    return text


def output_file(path: str | os.PathLike) -> Path:
    """An output file that can be written; checked before the work whose result it holds."""
    p = Path(named(path))
    if p.is_dir():
        raise BadPath(f"{p} is a directory; give the report's file name")
    _check_creatable(p)
    return p


def output_dir(path: str | os.PathLike) -> Path:
    """An output directory that exists or can be made; checked before the work that fills it."""
    p = Path(named(path))
    if p.exists() and not p.is_dir():
        raise BadPath(f"{p} exists and is not a directory")
    _check_creatable(p)
    return p


def run_command(prog: str, parse: Callable[[list[str]], argparse.Namespace],
                work: Callable[[argparse.Namespace], int], argv: Sequence[str] | None) -> int:
    """Parse (and check) everything first, then work. A usage error is one line on stderr and exit 3,
    never a traceback; `--help` returns argparse's 0 instead of raising SystemExit through
    `kvparity.cli.main`."""
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message held
        print(f"{prog}: error: {message}", file=sys.stderr)
        return ExitCode.USAGE
    except SystemExit as exc:  # --help: argparse has printed it
        return exc.code if isinstance(exc.code, int) else 0
    return work(args)


def writable_folder(path: str | Path, what: str) -> Path:
    """`path` as a folder this process can write into (created if missing, then written to once, so a
    read-only mount is found before a run starts), or a one-line UsageError naming the option `what`."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".kvparity-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{what} {folder} is not writable: {exc.strerror or exc}") from None
    return folder


def summary(doc: str | None) -> str:
    """A command's `--help` description: the first paragraph of its module docstring, on one line."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())
