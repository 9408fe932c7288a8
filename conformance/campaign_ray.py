"""A campaign's shards as Ray tasks (`kvparity campaign --ray`; conformance.campaign runs them locally).

Each shard asks for what its engine needs (`--shard-gpus 1`), and Ray places it on a node that has it. A
node need not see the driver's files: the shard writes at the same path on its node, its task sends back
what it wrote (its run folder and console: `packed`), and the driver writes it where missing
(`gathered`). The stop and the progress lines go through a small actor (`Board`), not through files.
The shard runs with its task worker's Python and environment (conformance.shard_process.start_shard), so it
sees the devices Ray gave the task.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import tarfile
import time
from pathlib import Path
from typing import Any, Sequence

from conformance import stopping
from conformance.shard_process import (CONSOLE, ProgressEcho, ended, not_started, outcome, run_folders, start_shard,
                                       stop_signals)

BOARD_WAIT_S = 10.0  # how long a Ray shard's task waits for its campaign's answer before asking again


class Board:
    """What a Ray campaign and its shards' tasks tell each other, wherever the tasks run (a Ray actor: no
    file both must see): the stop, and each shard's console output as it grows."""

    def __init__(self) -> None:
        self._stopped = False
        self._said: dict[int, list[bytes]] = {}

    def stop(self) -> None:
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped

    def say(self, index: int, chunk: bytes) -> None:
        self._said.setdefault(index, []).append(chunk)

    def said(self) -> dict[int, bytes]:
        """Each shard's output since the last call."""
        said, self._said = self._said, {}
        return {k: b"".join(chunks) for k, chunks in said.items()}


def run_shard(argv: Sequence[str], report_dir: str, cwd: str, board: Any = None, index: int = 0) -> dict[str, Any]:
    """Run one shard's process to its end; its exit code, its run folder (None: it left none), the tail of
    its output, and `files`: that folder and its console as an archive (`packed`), for a driver that may
    not see this node's files. Module-level, so a Ray worker imports it by name. `board`: the campaign's
    `Board` (a Ray actor; None: no campaign to hear from) — the shard is stopped (SIGTERM: it ends its run
    with a report) when the campaign stops, and when this worker dies (`lifeline.stop_with`); its output
    is passed on as it grows."""
    folder = Path(report_dir)
    if board is not None and _stopped(board):  # stopped before this task began: nothing to stop or start
        return not_started()
    before = run_folders(folder)
    proc = start_shard(argv, folder, cwd, own_group=True)  # Ray's cleanup of a dead worker's group must not cut it
    stopped, sent = False, 0
    while proc.poll() is None:
        if board is not None:
            if not stopped and _stopped(board):
                proc.send_signal(signal.SIGTERM)
                stopped = True
            sent = _pass_on(folder, sent, board, index)
        time.sleep(stopping.POLL_S)
    if board is not None:
        _pass_on(folder, sent, board, index)
    result = ended(proc, folder, before)
    return {**result, "files": packed(folder, result["run_dir"])}


def _stopped(board: Any) -> bool:
    """Whether the campaign has stopped; a campaign that cannot be asked any more (its driver died, and
    the board with it) has. One slow to answer (a loaded machine) has not: it is asked again."""
    import ray

    try:
        return bool(ray.get(board.stopped.remote(), timeout=BOARD_WAIT_S))
    except ray.exceptions.GetTimeoutError:
        return False
    except ray.exceptions.RayError:
        return True


def _pass_on(folder: Path, sent: int, board: Any, index: int) -> int:
    """Send the board what the shard's console gained since `sent` bytes; the bytes sent now."""
    try:
        with open(folder / CONSOLE, "rb") as console:
            console.seek(sent)
            chunk = console.read()
    except OSError:
        return sent
    if chunk:
        board.say.remote(index, chunk)
    return sent + len(chunk)


def packed(folder: Path, run_dir: str | None) -> bytes:
    """A shard's run folder (`run_dir`, under `folder`) and console.log as a gzipped tar, paths relative to
    `folder`: what its task sends the driver."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if (folder / CONSOLE).is_file():
            tar.add(folder / CONSOLE, arcname=CONSOLE)
        if run_dir is not None:
            tar.add(run_dir, arcname=str(Path(run_dir).relative_to(folder)))
    return buffer.getvalue()


def gathered(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A Ray task's outcome on the driver's side: what it sent (`packed`) written into the shard's `folder`
    where missing. The task wrote at the same path on its node, so a node that shares the driver's files
    wrote them here already, and those are left as they are; on another node's disk, they arrive now. Only
    plain files and folders under `folder` are written (an absolute path, `..`, a link or a device is a
    ValueError, as a task that failed)."""
    files = result.pop("files", None)
    if not files:
        return result
    with tarfile.open(fileobj=io.BytesIO(files), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                raise ValueError(f"a shard's task sent {member.name!r}: not a file of its run folder")
            target = folder / name
            if target.exists():
                continue
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            partial = target.with_name(f".{target.name}.{os.getpid()}.part")
            with open(partial, "wb") as out:
                out.write(source.read() if source is not None else b"")
            os.replace(partial, target)  # a driver stopped mid-write leaves no cut file standing as the shard's
    return result


REPORT_WAIT_S = 30.0  # a dead task's shard: its supervisor's stop grace (5 s) and its report, on a loaded machine
RAY_CONNECT_S = 10.0  # how long the campaign tries a Ray cluster's address before saying it is unreachable


def check_ray_address(address: str | None) -> None:
    """Refuse, in one line, a Ray cluster address (`--ray-address`, else RAY_ADDRESS) that takes no TCP
    connection: `ray.init` retries an unreachable cluster for as long as it runs (measured: still logging
    "Failed to connect to GCS" after 5 minutes, Ray 2.60), so a mistyped address hung the campaign until
    its CI job was killed. Forms other than HOST:PORT and ray://HOST:PORT (`auto`, `local`) are Ray's."""
    from conformance.contract import UsageError

    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S).close()
    except (OSError, ValueError) as exc:
        raise UsageError(f"the Ray cluster at {address} cannot be reached: {exc}") from None


def refuse_infeasible(have: dict[str, float], num_cpus: float, num_gpus: float) -> None:
    """A shard that asks the Ray runtime the campaign started on this machine for more than it has would
    wait for it for ever (Ray keeps an infeasible task queued: measured, `--shard-gpus 1` here, no GPU):
    one line instead. (A cluster's autoscaler may add what is missing, so a cluster is left to Ray.)"""
    from conformance.contract import UsageError

    for option, name, want in (("--shard-cpus", "CPU", num_cpus), ("--shard-gpus", "GPU", num_gpus)):
        if want > have.get(name, 0):
            raise UsageError(f"{option} {want:g}: the Ray runtime on this machine has {have.get(name, 0):g} "
                             f"{name}(s), so no shard could ever start")


def run_ray(argvs: Sequence[Sequence[str]], report_dirs: Sequence[Path], num_cpus: float, num_gpus: float,
            address: str | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """The shards as Ray tasks, each asking for `num_cpus` and `num_gpus` (what its engine needs); and the
    stop signal that cut the campaign short, if one did. Each task sends back its shard's run folder
    (`gathered`), so the nodes need not share the driver's files. Stopped, the driver tells the `Board`
    (each task passes SIGTERM on to its shard) and waits for the tasks to end, as a local campaign waits
    for its processes."""
    import ray

    started, own = not ray.is_initialized(), {}
    if started:
        # A runtime of our own: a worker whose driver died must not SIGKILL its shard (Ray kills a worker's
        # direct children when it exits); the shard's parent-death SIGTERM ends its run with a report
        # instead. A cluster's nodes are configured by their owner: RAY_kill_child_processes_on_worker_exit=0.
        own = {} if address or os.environ.get("RAY_ADDRESS") else {
            "_system_config": {"kill_child_processes_on_worker_exit": False}}
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **own)
    try:
        if own:
            refuse_infeasible(ray.cluster_resources(), num_cpus, num_gpus)
        board = ray.remote(Board).options(num_cpus=0).remote()
        before = [run_folders(d) for d in report_dirs]  # where this machine sees them: a dead task's shard's folder
        task = ray.remote(run_shard).options(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)
        refs = [task.remote(list(argv), str(d), os.getcwd(), board, k)
                for k, (argv, d) in enumerate(zip(argvs, report_dirs))]
        echo = ProgressEcho(report_dirs)

        def hear() -> None:
            with contextlib.suppress(ray.exceptions.RayError):  # progress only; a lost board stops the tasks
                for k, chunk in ray.get(board.said.remote()).items():
                    echo.feed(k, chunk)

        with stop_signals() as signals:
            pending, told = refs, False
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=stopping.POLL_S)
                hear()
                if signals.first is not None and not told:
                    with contextlib.suppress(ray.exceptions.RayError):  # a lost board: each task stops on its own
                        ray.get(board.stop.remote())
                    told = True
            hear()
            reports_by = time.monotonic() + REPORT_WAIT_S  # one wait for every dead task's shard, not one each
            outcomes = [task_outcome(ref, d, b, reports_by) for ref, d, b in zip(refs, report_dirs, before)]
            return outcomes, signals.first
    finally:
        if started:
            ray.shutdown()


def task_outcome(ref: Any, folder: Path, before: set[Path] = frozenset(),
                 reports_by: float = 0.0) -> dict[str, Any]:
    """A Ray task's outcome, its run folder gathered into `folder` (`gathered`); one that failed in Ray (its
    worker died, or `run_shard` raised: a report folder it cannot make on its node) or sent what cannot be
    written here is a shard without an exit code, with the reason — the campaign still merges the
    others, and says error, instead of losing them all in a traceback. A shard whose worker died goes on to
    end its run with a report (its parent-death SIGTERM): where this machine sees the run folder it made
    (one not among `before`), that folder is merged, as a local shard's is, once its report is written
    (or the clock passed `reports_by`), not called missing with its findings left out."""
    import ray

    try:
        return gathered(ray.get(ref), folder)
    except ray.exceptions.RayError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        made = sorted(run_folders(folder) - before)
        while made and not (made[-1] / "results.json").is_file() and time.monotonic() < reports_by:
            time.sleep(stopping.POLL_S)
        return outcome(None, str(made[-1]) if made else None,
                       f"the Ray task failed: {lines[-1] if lines else exc!r}")
    except (OSError, ValueError, tarfile.TarError) as exc:
        return outcome(None, None, f"the Ray task's run folder cannot be written in {folder}: {exc}")
