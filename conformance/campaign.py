"""A campaign: n shards of one `kvparity run`, run at once, then merged into one verdict.

Each shard is `python -m kvparity run ... --shard i/n --report-dir OUT/shards/i` in a process of its own
(the one supervised front door a single run has, so an engine that kills its process is still an
`error` shard, not a lost one). The shards run either as local processes, `jobs` at a time, or as Ray
tasks (`ray` is the optional `ray` extra): Ray is an executor that already exists for placing work
where the resources are, so a shard asks for what its engine needs (`num_gpus=1` for a GPU engine) and
Ray runs it on a node that has it; `ray.init()` with no address starts a local runtime (the tests), with
one (`RAY_ADDRESS`, `--ray-address`) it joins a cluster.

However they ran, the shards' folders are then merged from their histories (conformance.campaign_merge):
a shard whose process died before writing a folder is *missing*, so the campaign is `error`.
The shards of one campaign share its seed: `--seed` if given; for a profile that draws one (dev,
nightly) the campaign draws it once and gives it to every shard, so the campaign reruns as a whole.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

TAIL_CHARS = 2000  # what a shard's output is kept of, for the campaign's console


def shard_argv(run_args: Sequence[str], index: int, count: int, report_dir: Path) -> list[str]:
    """The command line of shard `index` of `count`."""
    return [sys.executable, "-m", "kvparity", "run", *run_args, "--shard", f"{index}/{count}",
            "--report-dir", str(report_dir), "-q"]


def run_shard(argv: Sequence[str], report_dir: str, cwd: str, env: dict[str, str]) -> dict[str, Any]:
    """Run one shard's process to its end; its exit code, its run folder (None: it left none) and the
    tail of its output. Module-level, so a Ray worker imports it by name."""
    proc = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    folders = sorted(Path(report_dir).glob("*/*/history.jsonl"))
    return {"exit": proc.returncode, "run_dir": str(folders[-1].parent) if folders else None,
            "tail": (proc.stdout + proc.stderr)[-TAIL_CHARS:]}


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


def run_local(argvs: Sequence[Sequence[str]], report_dirs: Sequence[Path], jobs: int) -> list[dict[str, Any]]:
    """The shards as local processes, `jobs` at a time."""
    env, cwd = _env(), os.getcwd()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_shard, argv, str(d), cwd, env) for argv, d in zip(argvs, report_dirs)]
        return [f.result() for f in futures]


def run_ray(argvs: Sequence[Sequence[str]], report_dirs: Sequence[Path], num_cpus: float, num_gpus: float,
            address: str | None = None) -> list[dict[str, Any]]:
    """The shards as Ray tasks, each asking for `num_cpus` and `num_gpus` (what its engine needs).
    The report folders must be reachable by the driver: on one machine they are; on a cluster, put
    `--out` on a shared file system."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(run_shard).options(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)
        env, cwd = _env(), os.getcwd()
        return ray.get([task.remote(list(argv), str(d), cwd, env) for argv, d in zip(argvs, report_dirs)])
    finally:
        if started:
            ray.shutdown()


def run_campaign(run_args: Sequence[str], count: int, out: Path, executor: str = "local", jobs: int | None = None,
                 num_cpus: float = 1, num_gpus: float = 0, address: str | None = None) -> tuple[list[dict[str, Any]], list[Path]]:
    """Run `count` shards of `kvparity run RUN_ARGS` into `out/shards/<i>/`; each shard's outcome, and
    the run folders they left (a shard that left none is missing from the merge)."""
    run_args = campaign_seed(run_args)
    dirs = [out / "shards" / str(i) for i in range(1, count + 1)]
    argvs = [shard_argv(run_args, i, count, d) for i, d in enumerate(dirs, start=1)]
    if executor == "ray":
        outcomes = run_ray(argvs, dirs, num_cpus, num_gpus, address)
    else:
        outcomes = run_local(argvs, dirs, jobs or count)
    return outcomes, [Path(o["run_dir"]) for o in outcomes if o["run_dir"]]
