"""Where a run folder's history lives, and reading it whether or not it is gzipped.

A run writes `history.jsonl` (appended line by line, so it survives a crash). The run folders committed
under reports/ keep it as `history.jsonl.gz` instead: the raw histories were most of the repository's
bytes, and gzip shrinks them about tenfold. Everything that reads a *stored* run folder (`kvparity
report`, `kvparity export` looking for the run's capabilities, the museum's page, the benchmarks that
re-read committed runs) goes through here, so both forms read the same.

`conformance.history.read_events` itself decompresses a `.gz` history (through the size-capped reader of
`conformance.untrusted`, so a gzip bomb is refused like an oversized file).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.history import History

HISTORY = "history.jsonl"
GZIPPED = HISTORY + ".gz"


def is_gzipped(path: str | os.PathLike[str]) -> bool:
    return Path(path).name.endswith(".gz")


def history_in(run_dir: str | os.PathLike[str]) -> Path | None:
    """The history file of a run folder: history.jsonl (a run's own), else history.jsonl.gz (a committed
    one); None when it holds neither."""
    for name in (HISTORY, GZIPPED):
        candidate = Path(run_dir) / name
        if candidate.is_file():
            return candidate
    return None


def open_history(path: str | os.PathLike[str]) -> IO[str]:
    """A history file opened for reading as text, decompressing a .gz one; undecodable bytes are replaced
    (as read_events does), so a damaged file is reported line by line, not refused whole."""
    if is_gzipped(path):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def load_history(path: str | os.PathLike[str]) -> History:
    """`conformance.history.load` of a history file, plain or gzipped (read_events decompresses a .gz
    one, its size capped after decompression too)."""
    from conformance.history import load

    return load(path)


def load_run_history(run_dir: str | os.PathLike[str]) -> History:
    """The history of a stored run folder (see `history_in`); FileNotFoundError when it has none."""
    path = history_in(run_dir)
    if path is None:
        raise FileNotFoundError(f"no {HISTORY} (or {GZIPPED}) in {run_dir}")
    return load_history(path)
