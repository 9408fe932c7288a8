"""A campaign's shard as a process: how it is started (`start_shard`), which run folder it made and what it
said (`ended`), its progress lines echoed as they come (`ProgressEcho`), and the stop signals a campaign
passes on to its shards (`stop_signals`). Shared by the local executor (conformance.campaign) and the Ray
one (conformance.campaign_ray)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from conformance import stopping
from conformance.lifeline import stop_with

TAIL_CHARS = 2000  # what a shard's output is kept of, for the campaign's console
CONSOLE = "console.log"  # a shard's whole output, beside its run folder
NOT_STARTED = "not started: the campaign was stopped"


def start_shard(argv: Sequence[str], folder: Path, cwd: str, own_group: bool = False) -> subprocess.Popen:
    """Start a shard's process — `python ARGV` (`shard_argv`) — its output (stdout and stderr) into
    `folder`/console.log, asking to be stopped when this process dies (`lifeline.stop_with`).

    The interpreter and environment are those of the process that starts it (`_env`): the campaign's for a
    local shard; for a Ray shard, its task's worker — which on a cluster node is that node's Python and
    environment, and holds what Ray set for the task, above all the devices it was given
    (CUDA_VISIBLE_DEVICES for `--shard-gpus 1`): a shard started with the campaign's environment saw every
    GPU of its node, and each engine took the first. The campaign's working folder is kept where the
    node has it (relative paths in the run's arguments mean what they meant), else the shard runs in its
    own folder.

    `own_group`: in a process group of its own (a Ray shard). Ray 2.60's raylet ends a dead task worker
    with SIGTERM to the worker's process group and SIGKILL 200 ms later (per-worker process group
    cleanup, whatever `kill_child_processes_on_worker_exit` says): a shard in that group was cut before
    its report (measured: its history ends `interrupted`, no results.json). Out of it, the shard hears
    of its worker's death by its parent-death SIGTERM (`stop_with`) alone and ends its run with a report."""
    folder.mkdir(parents=True, exist_ok=True)
    where = cwd if Path(cwd).is_dir() else str(folder)
    with open(folder / CONSOLE, "w", encoding="utf-8") as console:
        return subprocess.Popen([sys.executable, *argv], cwd=where, env={**_env(), **stop_with(os.getpid())},
                                stdout=console, stderr=subprocess.STDOUT, start_new_session=own_group)


def run_folders(report_dir: Path) -> set[Path]:
    """The run folders (`<engine>/<time>/`) under a shard's report folder."""
    return {p.parent for p in report_dir.glob("*/*/history.jsonl")}


def ended(proc: subprocess.Popen, folder: Path, before: set[Path]) -> dict[str, Any]:
    """The outcome of a shard whose process has ended: its exit code, console.log, and the run folder it
    made — one not in `folder` before it started (`before`). A folder used again (a nightly campaign into
    the same --out) holds earlier campaigns' runs: a shard that made none this time is missing from the
    merge, never stood in for by an older run of the same shard."""
    made = sorted(run_folders(folder) - before)
    return outcome(proc.returncode, str(made[-1]) if made else None,
                   (folder / CONSOLE).read_text(encoding="utf-8", errors="replace"))


def not_started() -> dict[str, Any]:
    """The outcome of a shard the campaign did not start (it was stopped first): no run folder."""
    return outcome(None, None, NOT_STARTED)


def outcome(code: int | None, run_dir: str | None, output: str) -> dict[str, Any]:
    """A shard's outcome, however it ended: its exit code (None: it never ran to one), the run folder it made
    (None: missing from the merge) and the tail of its output."""
    return {"exit": code, "run_dir": run_dir, "tail": output[-TAIL_CHARS:]}


def _env() -> dict[str, str]:
    """The shards' environment: this one, with this process's import path, so a shard imports the same
    kvparity (and the same adapters) as the campaign that started it."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


class ProgressEcho:
    """Each shard's progress lines (`kvparity: N/M examples, ...`: conformance.progress), as they reach its
    console, on the campaign's stderr with the shard named: a campaign runs for hours, and one that prints
    nothing until it ends cannot be told from one that hangs. Called, it reads what is new in each shard's
    console.log (local shards); a Ray campaign `feed`s it what the shards' tasks passed on instead.

    A line ends at a newline or a carriage return, and only the last `LINE_CHARS` of an unfinished one and
    the last `WINDOW_BYTES` of what is new are read: an engine's own progress bar redraws one line with `\r`
    for hours, and kept whole, joined and split again at every poll, 20 MB of it took the campaign's main
    thread 147 s of CPU (the thread that waits for the shards and passes on a Ctrl-C) and held all of it."""

    LINE_CHARS = 1000  # a progress line is ~100 characters; a longer one is not echoed
    WINDOW_BYTES = 64 * 1024  # what is read of a shard's new output per poll: the newest, where its progress is

    def __init__(self, report_dirs: Sequence[Path]) -> None:
        self.report_dirs = list(report_dirs)
        self.offsets = [0] * len(self.report_dirs)
        self.partial = [""] * len(self.report_dirs)

    def __call__(self) -> None:
        for k, folder in enumerate(self.report_dirs):
            try:
                with open(folder / CONSOLE, "rb") as console:
                    end = os.fstat(console.fileno()).st_size
                    if end - self.offsets[k] > self.WINDOW_BYTES:  # only the newest is read
                        self.offsets[k], self.partial[k] = end - self.WINDOW_BYTES, ""
                    console.seek(self.offsets[k])
                    chunk = console.read(max(0, end - self.offsets[k]))
            except OSError:  # not started yet
                continue
            self.offsets[k] += len(chunk)
            self.feed(k, chunk)

    def feed(self, k: int, chunk: bytes) -> None:
        """Shard k's output that followed what it was fed before: its whole progress lines echoed."""
        text = self.partial[k] + chunk[-self.WINDOW_BYTES:].decode("utf-8", errors="replace")
        *lines, rest = text.replace("\r", "\n").split("\n")
        self.partial[k] = rest[-self.LINE_CHARS:]
        for line in lines:
            if line.startswith("kvparity: ") and " examples" in line:
                print(f"shard {k + 1}/{len(self.report_dirs)}: {line[len('kvparity: '):]}", file=sys.stderr,
                      flush=True)


@contextlib.contextmanager
def stop_signals() -> Iterator[stopping.StopSignals]:
    """Within: Ctrl-C, SIGTERM and SIGHUP to the campaign are recorded for it to pass on to its shards, in
    place of whatever handled them — a Ray driver's own handler dumps a stack trace and exits 1 on SIGTERM,
    which reads as FAIL. The handlers before come back after (conformance.stopping.StopSignals)."""
    signals = stopping.StopSignals()
    try:
        yield signals
    finally:
        signals.restore()
