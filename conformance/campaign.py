"""A campaign: n shards of one `kvparity run`, run at once, then merged into one verdict.

Each shard is `python -m kvparity run ... --shard i/n --report-dir OUT/shards/i` in a process of its own
(the one supervised front door a single run has, so an engine that kills its process is still an
`error` shard, not a lost one). The shards run either as local processes, `jobs` at a time, or as Ray
tasks (`ray` is the optional `ray` extra): Ray is an executor that already exists for placing work
where the resources are, so a shard asks for what its engine needs (`num_gpus=1` for a GPU engine) and
Ray runs it on a node that has it; `ray.init()` with no address starts a local runtime (the tests), with
one (`RAY_ADDRESS`, `--ray-address`) it joins a cluster.

Either way the campaign waits for its shards on its main thread, echoing their progress, and a stop
signal sent to it alone reaches every shard, each ending its run with a report (`run_local`, `run_ray`):
a cancelled CI job leaves no engine running. A Ray shard may run on a node that does not see the
driver's files: it writes at the same path on its node, and its task sends back what it wrote (its run
folder and console), which the driver writes where it is missing; the stop and the progress lines go
through a small actor (`Board`), not through files.

However they ran, the shards' folders are then merged from their histories (conformance.campaign_merge):
a shard whose process died before writing a folder is *missing*, so the campaign is `error`.
The shards of one campaign share its seed: `--seed` if given; for a profile that draws one (dev,
nightly) the campaign draws it once and gives it to every shard, so the campaign reruns as a whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from conformance import stopping
from conformance.lifeline import stop_with

TAIL_CHARS = 2000  # what a shard's output is kept of, for the campaign's console
CONSOLE = "console.log"  # a shard's whole output, beside its run folder
NOT_STARTED = "not started: the campaign was stopped"
BOARD_WAIT_S = 10.0  # how long a Ray shard's task waits for its campaign's answer before asking again


def shard_argv(run_args: Sequence[str], index: int, count: int, report_dir: Path,
               own_args: Sequence[str] = ()) -> list[str]:
    """The interpreter's arguments for shard `index` of `count` (whichever process starts it puts its own
    Python before them: `start_shard`); `own_args`: its own engine arguments (K=V)."""
    return ["-m", "kvparity", "run", *run_args, "--shard", f"{index}/{count}",
            *[a for kv in own_args for a in ("--shard-engine-arg", kv)], "--report-dir", str(report_dir)]


def per_shard_engine_args(specs: Sequence[str], count: int) -> list[list[str]]:
    """`--shard-engine-arg K=V1,...,Vn` (n = `count`) as each shard's own `K=Vi`: the replica each drives,
    say. A spec without exactly n values is a one-line usage error."""
    from conformance.contract import UsageError

    per_shard: list[list[str]] = [[] for _ in range(count)]
    for spec in specs:
        key, sep, values = spec.partition("=")
        parts = values.split(",")
        if not sep or not key.strip() or len(parts) != count:
            raise UsageError(f"--shard-engine-arg {spec!r}: expected KEY=V1,...,V{count}, one value per shard")
        for mine, value in zip(per_shard, parts):
            mine.append(f"{key.strip()}={value}")
    return per_shard


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
    proc = start_shard(argv, folder, cwd)
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


def start_shard(argv: Sequence[str], folder: Path, cwd: str) -> subprocess.Popen:
    """Start a shard's process — `python ARGV` (`shard_argv`) — its output (stdout and stderr) into
    `folder`/console.log, asking to be stopped when this process dies (`lifeline.stop_with`).

    The interpreter and environment are those of the process that starts it (`_env`): the campaign's for a
    local shard; for a Ray shard, its task's worker — which on a cluster node is that node's Python and
    environment, and holds what Ray set for the task, above all the devices it was given
    (CUDA_VISIBLE_DEVICES for `--shard-gpus 1`): a shard started with the campaign's environment saw every
    GPU of its node, and each engine took the first. The campaign's working folder is kept where the
    node has it (relative paths in the run's arguments mean what they meant), else the shard runs in its
    own folder."""
    folder.mkdir(parents=True, exist_ok=True)
    where = cwd if Path(cwd).is_dir() else str(folder)
    with open(folder / CONSOLE, "w", encoding="utf-8") as console:
        return subprocess.Popen([sys.executable, *argv], cwd=where, env={**_env(), **stop_with(os.getpid())},
                                stdout=console, stderr=subprocess.STDOUT)


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


def campaign_seed(run_args: Sequence[str]) -> list[str]:
    """`run_args` with a `--seed` every shard shares: the one given, else one drawn here, unless the
    profile is derandomised (ci), whose shards derive their seeds from the shard alone."""
    from conformance.run_config import profile_settings

    if option(run_args, "--seed") is not None or profile_settings(option(run_args, "--profile") or "dev").derandomize:
        return list(run_args)
    return [*run_args, "--seed", str(random.randrange(2**32))]


def option(run_args: Sequence[str], name: str) -> str | None:
    """The value of `name` in `kvparity run` arguments the command has already parsed (so well formed)."""
    for k, arg in enumerate(run_args):
        if arg == name and k + 1 < len(run_args):
            return run_args[k + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


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
    console.log (local shards); a Ray campaign `feed`s it what the shards' tasks passed on instead."""

    def __init__(self, report_dirs: Sequence[Path]) -> None:
        self.report_dirs = list(report_dirs)
        self.offsets = [0] * len(self.report_dirs)
        self.partial = [""] * len(self.report_dirs)

    def __call__(self) -> None:
        for k, folder in enumerate(self.report_dirs):
            try:
                with open(folder / CONSOLE, "rb") as console:
                    console.seek(self.offsets[k])
                    chunk = console.read()
            except OSError:  # not started yet
                continue
            self.offsets[k] += len(chunk)
            self.feed(k, chunk)

    def feed(self, k: int, chunk: bytes) -> None:
        """Shard k's output that followed what it was fed before: its whole progress lines echoed."""
        *lines, self.partial[k] = (self.partial[k] + chunk.decode("utf-8", errors="replace")).split("\n")
        for line in lines:
            if line.startswith("kvparity: ") and " examples" in line:
                print(f"shard {k + 1}/{len(self.report_dirs)}: {line[len('kvparity: '):]}", file=sys.stderr,
                      flush=True)


@contextlib.contextmanager
def _stop_signals() -> Iterator[stopping.StopSignals]:
    """Within: Ctrl-C, SIGTERM and SIGHUP to the campaign are recorded for it to pass on to its shards, in
    place of whatever handled them — a Ray driver's own handler dumps a stack trace and exits 1 on SIGTERM,
    which reads as FAIL. The handlers before come back after (conformance.stopping.StopSignals)."""
    signals = stopping.StopSignals()
    try:
        yield signals
    finally:
        signals.restore()


def run_local(argvs: Sequence[Sequence[str]], report_dirs: Sequence[Path],
              jobs: int) -> tuple[list[dict[str, Any]], int | None]:
    """The shards as local processes, `jobs` at a time, each one's output in its folder's console.log; and
    the stop signal that cut the campaign short, if one did.

    Waited for on this (the main) thread, so that a stop signal (Ctrl-C, SIGTERM, SIGHUP:
    conformance.stopping) sent to the campaign alone is passed on to every shard still running — each
    shard's supervisor then ends its run with an INTERRUPTED report — and no shard starts after it: the
    campaign waits for them all, so it leaves nothing running and loses nothing they recorded. A campaign
    killed outright takes its shards with it (`start_shard`)."""
    cwd = os.getcwd()
    with _stop_signals() as signals:
        return _wait_for_shards(list(enumerate(zip(argvs, report_dirs))), max(1, jobs), cwd, len(argvs),
                                signals)


def _wait_for_shards(waiting: list, jobs: int, cwd: str, count: int,
                     signals: stopping.StopSignals) -> tuple[list[dict[str, Any]], int | None]:
    running: dict[int, tuple[subprocess.Popen, Path, set[Path]]] = {}
    outcomes: dict[int, dict[str, Any]] = {}
    echo = ProgressEcho([d for _, (_, d) in waiting])
    passed_on = False
    while waiting or running:
        echo()
        stop = signals.first
        if stop is not None:
            for k, _ in waiting:
                outcomes[k] = not_started()
            waiting = []
            if not passed_on:
                for proc, _, _ in running.values():
                    proc.send_signal(stop)
                passed_on = True
        while waiting and len(running) < jobs:
            k, (argv, d) = waiting.pop(0)
            before = run_folders(d)
            running[k] = (start_shard(argv, d, cwd), d, before)
        for k, (proc, d, before) in list(running.items()):
            if proc.poll() is not None:
                outcomes[k] = ended(proc, d, before)
                del running[k]
        time.sleep(stopping.POLL_S)
    echo()
    return [outcomes[k] for k in range(count)], signals.first


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
        task = ray.remote(run_shard).options(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)
        refs = [task.remote(list(argv), str(d), os.getcwd(), board, k)
                for k, (argv, d) in enumerate(zip(argvs, report_dirs))]
        echo = ProgressEcho(report_dirs)

        def hear() -> None:
            with contextlib.suppress(ray.exceptions.RayError):  # progress only; a lost board stops the tasks
                for k, chunk in ray.get(board.said.remote()).items():
                    echo.feed(k, chunk)

        with _stop_signals() as signals:
            pending, told = refs, False
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=stopping.POLL_S)
                hear()
                if signals.first is not None and not told:
                    with contextlib.suppress(ray.exceptions.RayError):  # a lost board: each task stops on its own
                        ray.get(board.stop.remote())
                    told = True
            hear()
            return [task_outcome(ref, d) for ref, d in zip(refs, report_dirs)], signals.first
    finally:
        if started:
            ray.shutdown()


def task_outcome(ref: Any, folder: Path) -> dict[str, Any]:
    """A Ray task's outcome, its run folder gathered into `folder` (`gathered`); one that failed in Ray (its
    worker died, or `run_shard` raised: a report folder it cannot make on its node) or sent what cannot be
    written here is a shard that left no run folder, with the reason — the campaign still merges the
    others, and says error, instead of losing them all in a traceback."""
    import ray

    try:
        return gathered(ray.get(ref), folder)
    except ray.exceptions.RayError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return outcome(None, None, f"the Ray task failed: {lines[-1] if lines else exc!r}")
    except (OSError, ValueError, tarfile.TarError) as exc:
        return outcome(None, None, f"the Ray task's run folder cannot be written in {folder}: {exc}")


def run_campaign(run_args: Sequence[str], count: int, out: Path, executor: str = "local", jobs: int | None = None,
                 num_cpus: float = 1, num_gpus: float = 0, address: str | None = None,
                 per_shard: Sequence[Sequence[str]] = ()) -> tuple[list[dict[str, Any]], list[Path], int | None]:
    """Run `count` shards of `kvparity run RUN_ARGS` into `out/shards/<i>/`, shard i with its own engine
    arguments `per_shard[i - 1]` if given; each shard's outcome, the run folders they left (a shard that left none
    is missing from the merge), and the stop signal that cut the campaign short (None: none did)."""
    run_args = campaign_seed(run_args)
    dirs = [out / "shards" / str(i) for i in range(1, count + 1)]
    for d in dirs:  # a folder used again: an earlier campaign's output is not this one's
        (d / CONSOLE).unlink(missing_ok=True)
    argvs = [shard_argv(run_args, i, count, d, per_shard[i - 1] if per_shard else ())
             for i, d in enumerate(dirs, start=1)]
    if executor == "ray":
        outcomes, stopped = run_ray(argvs, dirs, num_cpus, num_gpus, address)
    else:
        outcomes, stopped = run_local(argvs, dirs, jobs or min(count, os.cpu_count() or 1))
    return outcomes, [Path(o["run_dir"]) for o in outcomes if o["run_dir"]], stopped
