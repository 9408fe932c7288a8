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
a cancelled CI job leaves no engine running.

However they ran, the shards' folders are then merged from their histories (conformance.campaign_merge):
a shard whose process died before writing a folder is *missing*, so the campaign is `error`.
The shards of one campaign share its seed: `--seed` if given; for a profile that draws one (dev,
nightly) the campaign draws it once and gives it to every shard, so the campaign reruns as a whole.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from conformance import stopping
from conformance.lifeline import stop_with

TAIL_CHARS = 2000  # what a shard's output is kept of, for the campaign's console
CONSOLE = "console.log"  # a shard's whole output, beside its run folder
NOT_STARTED = "not started: the campaign was stopped"
STOP_FILE = ".stop"  # written into a Ray shard's folder by its campaign when stopped; only its presence counts


def shard_argv(run_args: Sequence[str], index: int, count: int, report_dir: Path,
               own_args: Sequence[str] = ()) -> list[str]:
    """The command line of shard `index` of `count`; `own_args`: its own engine arguments (K=V)."""
    return [sys.executable, "-m", "kvparity", "run", *run_args, "--shard", f"{index}/{count}",
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


def run_shard(argv: Sequence[str], report_dir: str, cwd: str, env: dict[str, str]) -> dict[str, Any]:
    """Run one shard's process to its end; its exit code, its run folder (None: it left none) and the
    tail of its output. Module-level, so a Ray worker imports it by name. The shard is stopped (SIGTERM:
    it ends its run with a report) when its campaign writes `STOP_FILE` into `report_dir` — the folder
    both already share — and when this worker dies (`lifeline.stop_with`)."""
    folder = Path(report_dir)
    if (folder / STOP_FILE).exists():  # stopped before this task began: nothing to stop, nothing to start
        return not_started()
    before = run_folders(folder)
    proc = start_shard(argv, folder, cwd, env)
    stopped = False
    while proc.poll() is None:
        if not stopped and (folder / STOP_FILE).exists():
            proc.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(stopping.POLL_S)
    return ended(proc, folder, before)


def start_shard(argv: Sequence[str], folder: Path, cwd: str, env: dict[str, str]) -> subprocess.Popen:
    """Start a shard's process, its output (stdout and stderr) into `folder`/console.log, asking to be
    stopped when this process dies (`lifeline.stop_with`)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CONSOLE, "w", encoding="utf-8") as console:
        return subprocess.Popen(list(argv), cwd=cwd, env={**env, **stop_with(os.getpid())}, stdout=console,
                                stderr=subprocess.STDOUT)


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
    console.log, on the campaign's stderr with the shard named: a campaign runs for hours, and one that
    prints nothing until it ends cannot be told from one that hangs. Reads only what is new each time."""

    def __init__(self, report_dirs: Sequence[Path]) -> None:
        self.report_dirs = list(report_dirs)
        self.offsets = [0] * len(self.report_dirs)
        self.partial = [""] * len(self.report_dirs)

    def __call__(self) -> None:
        count = len(self.report_dirs)
        for k, folder in enumerate(self.report_dirs):
            try:
                with open(folder / CONSOLE, "rb") as console:
                    console.seek(self.offsets[k])
                    chunk = console.read()
            except OSError:  # not started yet
                continue
            self.offsets[k] += len(chunk)
            *lines, self.partial[k] = (self.partial[k] + chunk.decode("utf-8", errors="replace")).split("\n")
            for line in lines:
                if line.startswith("kvparity: ") and " examples" in line:
                    print(f"shard {k + 1}/{count}: {line[len('kvparity: '):]}", file=sys.stderr, flush=True)


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
    env, cwd = _env(), os.getcwd()
    with _stop_signals() as signals:
        return _wait_for_shards(list(enumerate(zip(argvs, report_dirs))), max(1, jobs), cwd, env, len(argvs),
                                signals)


def _wait_for_shards(waiting: list, jobs: int, cwd: str, env: dict[str, str], count: int,
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
            running[k] = (start_shard(argv, d, cwd, env), d, before)
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
    stop signal that cut the campaign short, if one did. The report folders must be reachable by the
    driver: on one machine they are; on a cluster, put `--out` on a shared file system. Stopped, the
    driver writes `STOP_FILE` into every shard's folder (each task passes SIGTERM on to its shard) and
    waits for the tasks to end, as a local campaign waits for its processes."""
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
        task = ray.remote(run_shard).options(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)
        env, cwd = _env(), os.getcwd()
        refs = [task.remote(list(argv), str(d), cwd, env) for argv, d in zip(argvs, report_dirs)]
        echo = ProgressEcho(report_dirs)
        with _stop_signals() as signals:
            pending, told = refs, False
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=stopping.POLL_S)
                echo()
                if signals.first is not None and not told:
                    for d in report_dirs:
                        d.mkdir(parents=True, exist_ok=True)
                        (d / STOP_FILE).write_text("")
                    told = True
            echo()
            return [task_outcome(ref) for ref in refs], signals.first
    finally:
        if started:
            ray.shutdown()


def task_outcome(ref: Any) -> dict[str, Any]:
    """A Ray task's outcome; one that failed in Ray (its worker died, or `run_shard` raised: a report folder
    it cannot make on its node) is a shard that left no run folder, with the reason — the campaign still
    merges the others, and says error, instead of losing them all in a traceback."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return outcome(None, None, f"the Ray task failed: {lines[-1] if lines else exc!r}")


def run_campaign(run_args: Sequence[str], count: int, out: Path, executor: str = "local", jobs: int | None = None,
                 num_cpus: float = 1, num_gpus: float = 0, address: str | None = None,
                 per_shard: Sequence[Sequence[str]] = ()) -> tuple[list[dict[str, Any]], list[Path], int | None]:
    """Run `count` shards of `kvparity run RUN_ARGS` into `out/shards/<i>/`, shard i with its own engine
    arguments `per_shard[i - 1]` if given; each shard's outcome, the run folders they left (a shard that left none
    is missing from the merge), and the stop signal that cut the campaign short (None: none did)."""
    run_args = campaign_seed(run_args)
    dirs = [out / "shards" / str(i) for i in range(1, count + 1)]
    for d in dirs:  # a folder used again: an earlier campaign's output is not this one's, nor its stop
        (d / CONSOLE).unlink(missing_ok=True)
        (d / STOP_FILE).unlink(missing_ok=True)
    argvs = [shard_argv(run_args, i, count, d, per_shard[i - 1] if per_shard else ())
             for i, d in enumerate(dirs, start=1)]
    if executor == "ray":
        outcomes, stopped = run_ray(argvs, dirs, num_cpus, num_gpus, address)
    else:
        outcomes, stopped = run_local(argvs, dirs, jobs or min(count, os.cpu_count() or 1))
    return outcomes, [Path(o["run_dir"]) for o in outcomes if o["run_dir"]], stopped
