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
a cancelled CI job leaves no engine running. The Ray executor is conformance.campaign_ray.

However they ran, the shards' folders are then merged from their histories (conformance.campaign_merge):
a shard whose process died before writing a folder is *missing*, so the campaign is `error`.
The shards of one campaign share its seed: `--seed` if given; for a profile that draws one (dev,
nightly) the campaign draws it once and gives it to every shard, so the campaign reruns as a whole.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from conformance import stopping
from conformance.campaign_ray import run_ray
from conformance.shard_process import CONSOLE, ProgressEcho, ended, not_started, run_folders, start_shard, stop_signals


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


def campaign_seed(run_args: Sequence[str], seed: int | None, profile: str) -> list[str]:
    """`run_args` with a `--seed` every shard shares: the one given, else one drawn here, unless the
    profile is derandomised (ci), whose shards derive their seeds from the shard alone. `seed` and
    `profile` as `kvparity run`'s parser read them from `run_args` (an abbreviated `--prof ci` is ci: read
    literally it was dev, and a ci campaign drew a seed and left its fixed streams)."""
    from conformance.run_config import profile_settings

    if seed is not None or profile_settings(profile).derandomize:
        return list(run_args)
    return [*run_args, "--seed", str(random.randrange(2**32))]


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
    with stop_signals() as signals:
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


def run_campaign(run_args: Sequence[str], count: int, out: Path, executor: str = "local", jobs: int | None = None,
                 num_cpus: float = 1, num_gpus: float = 0, address: str | None = None,
                 per_shard: Sequence[Sequence[str]] = ()) -> tuple[list[dict[str, Any]], list[Path], int | None]:
    """Run `count` shards of `kvparity run RUN_ARGS` (its `--seed` the campaign's: `campaign_seed`) into
    `out/shards/<i>/`, shard i with its own engine arguments `per_shard[i - 1]` if given; each shard's outcome,
    the run folders they left (a shard that left none is missing from the merge), and the stop signal that cut
    the campaign short (None: none did)."""
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
