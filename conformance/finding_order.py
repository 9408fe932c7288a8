"""Which finding comes first: the one that shows the bug most directly.

An engine developer reads finding 1 and maybe finding 2. A 28-batch witness whose diff compares two runs
of the engine with each other ("output depends on speculation") makes them reconstruct which run is
wrong; a one-request, 17-token witness that differs from plain decoding names the wrong run at once.
Severity alone is a poor first key: a planted off-by-one headed "critical isolation" sent a reader after
the wrong mechanism while the two-request story came second. So findings are ordered by

1. the witness's size up to the failing batch: prompt tokens, then batches, then requests — the
   shortest story first (it is also the one most likely to be the root of the longer ones);
2. directness: a record compared against plain decoding before a pair check's record (which compares
   two runs of the engine and cannot say on its own which one is wrong);
3. severity, then the check's specificity (`grouping.ORDER`), then the example index (stable).

Nothing here changes a verdict; it only orders what the report lists.
"""

from __future__ import annotations

from typing import Any, Mapping

from attrs import frozen

from conformance.history import Example, History
from conformance.verdicts import CheckFailure

SEVERITY = {"critical": 0, "high": 1, "medium": 2, "low": 3}


@frozen
class WitnessSize:
    """How much a reader must follow to see the failure: everything up to and including its batch."""

    prompt_tokens: int
    batches: int
    requests: int

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "batches": self.batches, "requests": self.requests}


UNKNOWN = WitnessSize(1 << 30, 1 << 30, 1 << 30)  # a failure whose example is not in the history: last


def _example(history: History, index: int) -> Example | None:
    return next((ex for ex in history.examples if ex.index == index), None)


def witness_size(history: History, failure: CheckFailure) -> WitnessSize:
    """The size of the failing example up to the failing batch (the whole example for a failure that
    names no batch)."""
    ex = _example(history, failure.example)
    if ex is None:
        return UNKNOWN
    batch = failure.witness.get("batch")
    upto = ex.batches[: batch + 1] if isinstance(batch, int) and 0 <= batch < len(ex.batches) else ex.batches
    requests = [q for b in upto for q in b.requests]
    return WitnessSize(sum(len(q.prompt) for q in requests), len(upto), len(requests))


def pairwise(witness: Mapping[str, Any]) -> bool:
    """Does this record compare two runs of the engine (a pair check) rather than one run with plain
    decoding?"""
    return witness.get("expected_output") is None and witness.get("earlier_output") is not None


def order_key(history: History, failure: CheckFailure, severity: str, rank: int) -> tuple:
    """The sort key of a finding shown by `failure` (see the module docstring)."""
    size = witness_size(history, failure)
    return (size.prompt_tokens, size.batches, size.requests, pairwise(failure.witness),
            SEVERITY.get(severity, 9), rank, failure.example)
