"""Writing into a run folder without following a symlink.

A run folder is often a copy someone handed over (an artifact, a committed `reports/` run), and
`kvparity report` writes into it. A `results.json` or `witnesses/` planted there as a symlink used to
take the write to wherever it pointed, outside the folder. Here every file is written relative to a
descriptor of its folder: each sub-folder is opened with O_NOFOLLOW, an existing entry that is a symlink
(or anything but a plain file) is refused, and the text goes to a fresh temporary file (O_CREAT|O_EXCL|
O_NOFOLLOW) that is then renamed over the name — a rename replaces the entry itself, so neither a
symlink raced in after the check nor a hard link to a file elsewhere is ever written through, and a
reader never sees a half-written report.

The run folder itself is the one the user named and may be reached through a symlink; what is inside
it may not.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Iterator

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class UnsafeRunFolder(OSError):
    """An entry of the run folder is a symlink (or not what it should be): nothing was written through it."""


@contextlib.contextmanager
def _folder(run_dir: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of `run_dir/parts...`, each part created if missing and opened without following."""
    fds = [os.open(run_dir, os.O_RDONLY | _DIRECTORY)]
    try:
        for k, part in enumerate(parts):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fds[-1])
            try:
                fds.append(os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fds[-1]))
            except OSError as exc:
                where = run_dir.joinpath(*parts[: k + 1])
                raise UnsafeRunFolder(f"{where} is a symlink or not a folder; kvparity writes no report "
                                      f"through it") from exc
        yield fds[-1]
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _refuse_non_file(fd: int, name: str, where: Path) -> None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a plain file"
        raise UnsafeRunFolder(f"{where} is {kind}; kvparity writes no report through it")


def write_text(run_dir: str | os.PathLike[str], relative: str, text: str) -> Path:
    """Write `text` to `run_dir/relative` (e.g. "results.json", "witnesses/x.json") following no symlink
    inside `run_dir`; returns the path. Raises UnsafeRunFolder (an OSError) for a planted symlink."""
    run_dir = Path(run_dir)
    *parts, name = PurePosixPath(relative).parts
    if not name or name in (".", "..") or any(p in (".", "..") for p in parts):
        raise ValueError(f"not a name inside the run folder: {relative!r}")
    target = run_dir / relative
    with _folder(run_dir, tuple(parts)) as fd:
        _refuse_non_file(fd, name, target)
        tmp = f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):  # a stale one from a process that died here
            os.unlink(tmp, dir_fd=fd)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=fd)
        try:
            with os.fdopen(out, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
    return target


def clear_folder(run_dir: str | os.PathLike[str], relative: str) -> None:
    """Remove the plain files of `run_dir/relative` (created if missing; reached following no symlink),
    so a re-analysis never leaves an earlier one's witnesses beside its verdict."""
    with _folder(Path(run_dir), PurePosixPath(relative).parts) as fd:
        for name in os.listdir(fd):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                os.unlink(name, dir_fd=fd)


def new_run_dir(report_dir: str | os.PathLike[str], engine_name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = Path(report_dir) / engine_name.replace(":", "_").replace("/", "_")
    run_dir = base / (stamp + (f"-{worker}" if worker else ""))
    n = 1
    while True:  # made, not looked for: two runs starting in one second both saw a name free, one then crashed
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            if not os.path.lexists(run_dir):  # a file where a folder above it should be: no name will do
                raise
            n += 1
            run_dir = base / f"{stamp}-{n}" if not worker else base / f"{stamp}-{worker}-{n}"
