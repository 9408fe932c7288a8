"""Shards: `kvparity run --shard i/n`, one of n runs that together draw n streams, not one stream n times.

A campaign runs n shards (n machines, n CI jobs, n Ray tasks) and merges their verdicts (`kvparity
merge`). Each shard must draw a stream of its own, so n shards together run n times the examples of one
run, and each must stay reproducible on its own. So a shard's Hypothesis seed is *derived*: the first 32
bits of sha256("kvparity-shard", the campaign seed, i, n), where the campaign seed is

- the run's `--seed` (every shard of a campaign is given the same one; `kvparity campaign` does that);
- for a profile that draws its seed (dev, nightly) and no `--seed`: the seed the shard drew, so a
  shard run alone still draws a fresh stream, recorded so it reruns;
- for the derandomised profile (ci) and no `--seed`: the word "derandomised". Derandomising a shard
  would give all n shards the one stream Hypothesis derives from the test's source (n copies of the
  same run); instead each shard gets a fixed seed of its own, so shard i/n of `ci` draws the same
  stream every night (reproducible per shard, as `ci` is per run) and a different one from shard j/n.

Why a derived seed rather than derandomising with a per-shard database key: the key decides where
failures are *stored*, and a campaign wants one key, so that a failure found by one shard is replayed
first by every shard (conformance.example_database). The stream and the store are separate concerns.

The history's `run_start` records `shard` ({"index": i, "count": n, "campaign_seed": ...}) beside the
derived `seed`; results.json carries it (its `run` block is `run_start`), and `kvparity merge` checks
that the shards it is given are one campaign's, all n of them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

from attrs import frozen

from conformance.contract import UsageError

DERANDOMISED = "derandomised"  # the campaign seed of a derandomised profile run without --seed
MAX_SHARDS = 999_999  # n of `--shard i/n` (six digits), `kvparity campaign --shards` and a history's record
_FORM = re.compile(r"^\s*(\d{1,6})\s*/\s*(\d{1,6})\s*$")


@frozen
class Shard:
    """Shard `index` of `count`, counted from 1 (as CI matrices count their jobs: 1/4 ... 4/4).

    `own_engine_args`: the keys of the engine arguments that are this shard's own (`--shard-engine-arg`):
    where it differs from its campaign's other shards by design — the replica it drives (`base_url=`), not
    the engine. `kvparity merge` lets shards differ in these keys alone."""

    index: int
    count: int
    own_engine_args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def seed(self, campaign_seed: int | str) -> int:
        """This shard's Hypothesis seed: a function of the campaign seed and the shard alone."""
        text = f"kvparity-shard:{campaign_seed}:{self.index}/{self.count}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")

    def to_json(self, campaign_seed: int | str) -> dict[str, Any]:
        own = {"own_engine_args": list(self.own_engine_args)} if self.own_engine_args else {}
        return {"index": self.index, "count": self.count, "campaign_seed": campaign_seed, **own}


def parse_shard(text: str, own_engine_args: tuple[str, ...] = ()) -> Shard:
    """`--shard i/n` with 1 <= i <= n; anything else is a one-line usage error."""
    m = _FORM.match(str(text))
    if not m:
        raise UsageError(f"--shard {text!r}: expected i/n, e.g. 2/4 (shard 2 of 4, counted from 1)")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: the shard must be 1 to n of n shards (n at least 1)")
    return Shard(index, count, tuple(sorted(own_engine_args)))


def shard_of(meta: Mapping[str, Any]) -> tuple[Shard, Any] | None:
    """(the shard, its campaign seed) a history's `run_start` records; None when it is no shard's, or
    the record is not the shape a run writes — n past `MAX_SHARDS` included: a history read back is not
    trusted with a size, and one that declared 10**12 shards had `kvparity merge` list the missing ones
    (measured: 11 GB in 30 s)."""
    rec = meta.get("shard")
    if not isinstance(rec, Mapping):
        return None
    index, count, own = rec.get("index"), rec.get("count"), rec.get("own_engine_args", [])
    if not (isinstance(index, int) and isinstance(count, int) and 1 <= index <= count <= MAX_SHARDS):
        return None
    if not (isinstance(own, list) and all(isinstance(k, str) for k in own)):
        return None
    return Shard(index, count, tuple(sorted(own))), rec.get("campaign_seed")
