"""The history's integrity: every event chained to the one before it by a digest, `run_end` sealing it.

A history is the evidence a verdict stands on, and `kvparity report RUN_DIR` re-judges a run from it
alone. Two edited `cached_tokens` values, or two deleted lines holding a failing answer, used to turn a
FAIL into a PASS without a word. So each event line carries `chain`: the sha256 of the previous event's
`chain` (the empty string before the first) and of the event's own canonical line (compact JSON without
`chain`, keys in written order). `run_end` also carries `events` (how many events came before it) and
`sealed` (the previous event's `chain`). Editing, reordering, deleting, duplicating or appending a line
breaks the chain at that line; truncating a sealed history leaves it without `run_end`, which reads
as incomplete (`error`), never as a pass.

The chain is tamper-*evident* against edits, not a signature: it has no secret, so whoever rewrites
every line after an edit can recompute it. What it guarantees is that no accident, partial edit or
hand-tweak of a stored run passes as the run's evidence.

Histories written before the chain existed (no event carries `chain`) are *legacy*: readable, judged as
before, and said to be unverified wherever they are re-analysed. A history where some events carry a
chain and others do not was edited. Beside the chain, `verify` checks the shape every run writes: examples
numbered 0, 1, 2... in order, every `submit` answered (by `batch`, `error` or `interrupted`) unless it is
the last event, nothing after `run_end`, and `run_end`'s counts agreeing with what is recorded.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from attrs import frozen

FIELD = "chain"
GENESIS = ""
ANSWERS = frozenset({"batch", "error", "interrupted"})  # what may follow a `submit`
VERIFIED, LEGACY = "verified", "legacy"


def link(previous: str, canonical_line: str) -> str:
    """The chain value of an event: sha256 over the previous event's value and this event's canonical line."""
    return hashlib.sha256((previous + canonical_line).encode("utf-8")).hexdigest()


def canonical(event: Mapping[str, Any]) -> str:
    """The line the chain covers: the event without its `chain`, as the writer serialises it."""
    return json.dumps({k: v for k, v in event.items() if k != FIELD}, separators=(",", ":"), allow_nan=False)


def chained_line(previous: str, body: str) -> tuple[str, str]:
    """(the line to write, its chain value) for the canonical line `body` of an event (a JSON object)."""
    digest = link(previous, body)
    return f'{body[:-1]},"{FIELD}":"{digest}"}}', digest


@frozen
class Integrity:
    """What `verify` found: `status` is `verified` (chained and intact) or `legacy` (written before the
    chain); `problems` are the ways the history disagrees with itself, one line each (empty when sound)."""

    status: str
    problems: tuple[str, ...] = ()

    @property
    def sound(self) -> bool:
        return not self.problems

    def line(self) -> str:
        """One line for a console or a report."""
        if self.problems:
            return self.problems[0] + (f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else "")
        if self.status == LEGACY:
            return "legacy history (written before kvparity chained its events): its integrity is unverified"
        return "history chain verified"


def _where(number: int, event: Mapping[str, Any]) -> str:
    return f"history event {number} ({event.get('event')})"


def _chain_problems(events: Sequence[Mapping[str, Any]]) -> list[str]:
    previous = GENESIS
    for number, ev in enumerate(events, start=1):
        value = ev.get(FIELD)
        if not isinstance(value, str):
            return [f"{_where(number, ev)} has no chain value although the history is chained: "
                    "a line was added or edited by hand"]
        try:
            expected = link(previous, canonical(ev))
        except ValueError:  # a number JSON cannot hold
            expected = ""
        if value != expected:
            return [f"{_where(number, ev)} breaks the history's chain: a line was edited, reordered, "
                    "removed or added here"]
        previous = value
    return []


def _seal_problems(events: Sequence[Mapping[str, Any]], chained: bool) -> list[str]:
    ends = [i for i, ev in enumerate(events) if ev.get("event") == "run_end"]
    if not ends:
        return []  # a run that did not finish: incomplete, read as such
    at = ends[0]
    end = events[at]
    problems = []
    if at != len(events) - 1:
        problems.append(f"{_where(at + 2, events[at + 1])} comes after run_end: a finished run records nothing more")
    examples = sum(ev.get("event") == "example" for ev in events[:at])
    if end.get("examples") is not None and end.get("examples") != examples:
        problems.append(f"run_end claims {end.get('examples')} examples but the history records {examples}")
    if chained and (end.get("events") != at or end.get("sealed") != events[at - 1].get(FIELD)):
        problems.append(f"run_end's seal does not match the history: it seals {end.get('events')} events, "
                        f"{at} precede it")
    return problems


def _shape_problems(events: Sequence[Mapping[str, Any]]) -> list[str]:
    expected_example = 0
    for number, ev in enumerate(events, start=1):
        kind = ev.get("event")
        if kind == "example":
            if ev.get("index") != expected_example:
                return [f"{_where(number, ev)} is example {ev.get('index')!r} where example {expected_example} "
                        "comes next: examples are out of order, missing or repeated"]
            expected_example += 1
        elif kind == "submit" and number < len(events) and events[number].get("event") not in ANSWERS:
            ids = ", ".join(str(q.get("id")) for q in ev.get("requests") or [] if isinstance(q, dict))
            return [f"{_where(number, ev)}: requests {ids or '(none)'} were submitted and never answered, yet the "
                    f"run went on ({_where(number + 1, events[number])}): an answer was removed"]
    return []


def verify(events: Sequence[Mapping[str, Any]]) -> Integrity:
    """Check a history's chain (where it has one), its seal and its shape; see the module docstring."""
    chained = any(FIELD in ev for ev in events)
    problems = _chain_problems(events) if chained else []
    problems += _seal_problems(events, chained) + _shape_problems(events)
    return Integrity(VERIFIED if chained else LEGACY, tuple(problems))
