"""Argument types shared by every command (and by the supervisor, which reads a child's `--timeout`
without importing the command line): each bad value is a one-line argparse error, exit 3."""

from __future__ import annotations

import argparse
import math

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_REPORT_DIR = ".kvparity/runs"  # untracked (git-ignored): a user's run never writes into reports/


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def shard_count(text: str) -> int:
    """`kvparity campaign --shards N`: 1 to `MAX_SHARDS` (each shard runs as `kvparity run --shard i/N`)."""
    from conformance.shards import MAX_SHARDS

    count = positive_int(text)
    if count > MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"{count} is more than {MAX_SHARDS:,} shards")
    return count


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds above 0")
    return value


def resource_amount(text: str) -> float:
    """How much of a resource (CPUs, GPUs) a task asks for: 0 or more, a fraction only below 1 (a share of
    one device; Ray's own rule, which it raises deep inside a task's submission)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (value > 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more: a fraction below 1, or a whole number")
    return value
