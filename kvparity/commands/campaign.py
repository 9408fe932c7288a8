"""`kvparity campaign --shards N --out DIR RUN_ARGS...`: run N shards of one `kvparity run` at once (local
processes, or Ray tasks with `--ray`) and merge them into one verdict, as `kvparity merge` does.

RUN_ARGS are `kvparity run`'s (`--engine` and the rest; not `--shard` nor `--report-dir`: the campaign
sets them). Shard folders go to DIR/shards/<i>/, the merged report to DIR. Exit codes as for `kvparity
run`: the merged verdict's; a shard that left no run folder is missing, and the campaign is `error`."""

from __future__ import annotations

import argparse
import os
import re
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Sequence

from conformance.arguments import positive_int, resource_amount, shard_count
from conformance.contract import UsageError
from conformance.verdicts import ERROR, FAIL, INCONCLUSIVE, PASS
from kvparity.parsing import UsageParser, named, output_dir, run_command, summary

SET_BY_CAMPAIGN = ("--shard", "--report-dir")


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="kvparity campaign", description=summary(__doc__), allow_abbrev=False)
    p.add_argument("--shards", type=shard_count, required=True, metavar="N", help="how many shards (at most 999,999)")
    p.add_argument("--out", required=True, type=output_dir, metavar="DIR",
                   help="the campaign folder: shards/<i>/ and the merged report")
    p.add_argument("--ray", action="store_true",
                   help="run the shards as Ray tasks (pip install 'kvparity[ray]'); none: local processes")
    p.add_argument("--ray-address", default=None, type=named,
                   help="with --ray: the cluster to join (none: RAY_ADDRESS, else a local Ray runtime)")
    p.add_argument("--shard-cpus", type=resource_amount, default=None,
                   help="with --ray: CPUs each shard's task asks for (default 1)")
    p.add_argument("--shard-gpus", type=resource_amount, default=None,
                   help="with --ray: GPUs each shard's task asks for (default 0; 1 for an engine on one GPU)")
    p.add_argument("--shard-engine-arg", action="append", default=[], metavar="K=V1,...,VN",
                   help="an engine argument each shard has its own value of, e.g. the replica it drives: "
                        "base_url=http://127.0.0.1:8001,http://127.0.0.1:8002 (one value per shard)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="without --ray: shards run at once (none: as many as this machine has CPUs, at most "
                        "all of them; each shard's engine takes a core, and more at once only share them)")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The campaign's own options; everything else is `kvparity run`'s, checked here by its parser."""
    from conformance.campaign import campaign_seed, per_shard_engine_args
    from conformance.campaign_ray import check_ray_address
    from conformance.engines import parse_engine_args
    from conformance.example_database import check_url, is_url, reachable
    from kvparity.commands.merge import refuse_run_folder
    from kvparity.commands.run import build_parser as run_parser

    args, rest = build_parser().parse_known_args(argv)
    # An option of the other executor is refused, not ignored: `--shard-gpus 1` without --ray would leave
    # every local shard's engine on the same GPU, `--ray-address` without it run the shards here.
    other = ["--jobs"] if args.ray else ["--ray-address", "--shard-cpus", "--shard-gpus"]
    for option in other:
        if getattr(args, _dest(option)) is not None:
            raise UsageError(f"{option} is for {'local shards, not --ray' if args.ray else '--ray'}; leave it out")
    args.shard_cpus = 1.0 if args.shard_cpus is None else args.shard_cpus
    args.shard_gpus = 0.0 if args.shard_gpus is None else args.shard_gpus
    refuse_run_folder(Path(args.out))  # before any shard runs: the merge goes there
    if args.ray and find_spec("ray") is None:
        raise UsageError("--ray: ray is not installed (pip install 'kvparity[ray]')")
    args.per_shard = per_shard_engine_args(args.shard_engine_arg, args.shards)
    # Read as each shard's `kvparity run` will read them (its parser takes `--prof` for `--profile`): a bad
    # run argument is refused before any shard starts, and so is one the campaign sets itself.
    parser = run_parser()
    run = parser.parse_args(rest)
    for option in SET_BY_CAMPAIGN:
        if getattr(run, _dest(option)) != parser.get_default(_dest(option)):
            raise UsageError(f"{option} is set by the campaign for each shard; leave it out")
    parse_engine_args([*run.engine_arg, *args.per_shard[0]])  # so is a key given as both kinds
    if is_url(run.database):  # so is a shared store that is not one, or (here, not a cluster's nodes) unreachable
        check_url(run.database)
        # The store is the nodes' to reach only where the shards run on a cluster: --ray with an address
        # (`--ray-address` or RAY_ADDRESS, as run_ray joins one). `--ray-address` alone runs them here.
        if not (args.ray and (args.ray_address or os.environ.get("RAY_ADDRESS"))):
            reachable(run.database)
    if args.ray:
        check_ray_address(args.ray_address)
    args.run_args = campaign_seed(rest, run.seed, run.profile)
    return args


def _dest(option: str) -> str:
    """argparse's attribute for `--an-option`."""
    return option.lstrip("-").replace("-", "_")


def work(args: argparse.Namespace) -> int:
    from conformance.campaign import run_campaign
    from kvparity.commands.merge import merge_into, write_merged

    out = Path(args.out)
    # Until the merge replaces them, `out`'s report files say error: a campaign stopped or killed before its
    # merge left none, or — a nightly campaign into one --out — the last night's PASS for a CI to read.
    write_merged(out, [], [f"the campaign started at {time.strftime('%Y-%m-%d %H:%M:%S')} has not finished: "
                           "no verdict yet"])
    outcomes, run_dirs, stopped = run_campaign(args.run_args, args.shards, out, "ray" if args.ray else "local",
                                               args.jobs, args.shard_cpus, args.shard_gpus, args.ray_address,
                                               args.per_shard)
    beyond = []  # what went wrong beyond the run folders: the merge reads only those
    for i, o in enumerate(outcomes, start=1):
        last = shard_line(o["tail"])
        print(f"shard {i}/{args.shards}: exit {o['exit']}, {o['run_dir'] or 'no run folder'}: {last}")
        if not o["run_dir"]:
            beyond.append(f"shard {i}/{args.shards} left no run folder (exit {o['exit']}): {last}")
        elif o["exit"] is None:  # a Ray task that failed, whose shard's run folder is on this machine
            beyond.append(f"shard {i}/{args.shards}: its process's end was not seen: {last}")
        elif stopped is None and o["exit"] != (told := reported_exit(Path(o["run_dir"]))):
            beyond.append(f"shard {i}/{args.shards} exited {o['exit']}, not the exit code its report gives "
                          f"({told}): its process did not end as its run did")
    code = merge_into(out, run_dirs, beyond)
    if stopped is not None:  # the merge says error (interrupted shards); the exit says how, as `run`'s does
        from conformance import stopping

        print(f"INTERRUPTED: the campaign was stopped by {stopping.signal_name(stopped)}; every shard was "
              f"stopped and waited for")
        return stopping.exit_code_of(stopped)
    return code


def reported_exit(run_dir: Path) -> int | None:
    """The exit code a shard's results.json gives (None: none readable). A shard whose process ended
    otherwise — its supervisor killed after the run wrote its verdict — left a sound, sealed run folder
    that merged as PASS while its exit said it died."""
    from conformance.reanalysis import recorded

    code = recorded(run_dir).get("exit_code")
    return code if isinstance(code, int) else None


# `kvparity run`'s last line starts with its verdict, or INTERRUPTED (kvparity/commands/run.py)
VERDICT_LINE = re.compile("({}|INTERRUPTED): ".format("|".join(v.upper() for v in (PASS, FAIL, INCONCLUSIVE, ERROR))))


def shard_line(output: str) -> str:
    """What a shard said last of its run: its `kvparity run` verdict line where it printed one, else its
    last line (a crash, a usage error). An engine may print after the verdict — vLLM's multiprocessing
    resource tracker warns at exit — and the campaign had shown that warning as the shard's outcome."""
    lines = output.strip().splitlines() or ["(no output)"]
    return next((line for line in reversed(lines) if VERDICT_LINE.match(line)), lines[-1])


def main(argv: Sequence[str] | None = None, session: object = None) -> int:
    return run_command("kvparity campaign", parse, work, argv)
