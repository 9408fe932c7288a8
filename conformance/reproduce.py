"""The one-line command that reruns a `kvparity run`'s stream: the seed it drew, with what shapes it.

Every run either draws a seed (dev, nightly: printed and recorded in the history's `run_start`) or is
derandomised (ci: its stream is a function of the suite's source alone). Either way the run ends with
a line a user can paste to get the same stream of examples again; a failure found once is a failure
anyone can rerun, not a number lost in a scrolled-off log. Only what changes the stream (or what is
done with a failure) is repeated: the engine and its arguments, the profile, the example count, the
checks, the calibration and the shrinking flags; not where the report goes.
"""

from __future__ import annotations

import argparse
import shlex

DEFAULT_MAX_SHRINK_SECONDS = 60.0  # `kvparity run`: a minute of shrinking, then the witness so far


def rerun_command(args: argparse.Namespace, seed: int | None) -> str:
    """`kvparity run ...` with the seed the run used (none for a derandomised profile: the same command)."""
    argv = ["kvparity", "run", "--engine", args.engine]
    for pair in [*args.engine_arg, *args.shard_engine_arg]:  # a shard's own (its replica) too: the rerun is no shard
        argv += ["--engine-arg", pair]
    argv += ["--profile", args.profile]
    if args.checks:
        argv += ["--checks", args.checks]
    if args.max_examples is not None:
        argv += ["--max-examples", str(args.max_examples)]
    if args.calibration:
        argv += ["--calibration", args.calibration]
    if args.exitfirst:
        argv.append("--exitfirst")
    elif args.no_shrink:
        argv.append("--no-shrink")
    elif args.max_shrink_seconds != DEFAULT_MAX_SHRINK_SECONDS:
        argv += ["--max-shrink-seconds", f"{args.max_shrink_seconds:g}"]
    if seed is not None:
        argv += ["--seed", str(seed)]
    return shlex.join(argv)


def seed_line(args: argparse.Namespace, seed: int | None) -> str:
    """The line `kvparity run` prints: the seed (or that the stream is derandomised) and the rerun."""
    what = f"seed {seed}" if seed is not None else f"derandomised (profile {args.profile})"
    return f"reproduce ({what}): {rerun_command(args, seed)}"
