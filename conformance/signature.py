"""A finding's signature: which bug it is, independent of the run that found it.

Two failures with the same signature are the same bug; a known-findings file (`--known`, conformance.known)
waives failures by signature, and a run that goes on looking after its first failure (runner) shrinks
each new signature on its own. So the signature must not change with the seed, the engine version or
the witness Hypothesis happened to draw: it holds no seed, request id, token id, prompt length or count.
It is built from what the root-cause story (grouping, conformance.report.story) says about a finding:

- **check**: the most specific check that saw it (`RootCause.check`);
- **mechanism**: what was in play. A check that names its mechanism (speculation, cache state, eviction,
  a hit covering the prompt, the pool after a rollback, another identity's KV) *is* the mechanism; for
  the checks that do not (parity, accounting) it is the reuse mechanisms the engine reported for the
  failing request (cache hit, draft tokens, chunking or batching) and, for parity, how the output was
  wrong (other tokens, or the same tokens with another finish reason); and for any check, "another
  identity in its batch" where the oracle said so: its batch re-sent after a reset failed again whole and
  passed with every request under its identity (conformance.alone, `context_probes`). That is what tells
  a LoRA batch-mixing bug from a batching bug, which the check's name alone does not;
- **title**: the failure record's title, digits folded away; for the checks whose every failure says
  the output is wrong (parity and the independence checks), the check's own claim.

The id is the first 12 hex digits of the SHA-256 of those three, so a reviewer reads the three and a
tool compares the id.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

from attrs import frozen

from conformance import alone
from conformance.analysis import Analysis
from conformance.checks import CHECKS
from conformance.history_facts import mechanisms
from conformance.grouping import RootCause, group
from conformance.history import Example, History

# The checks whose claim is about one mechanism: a failure of theirs names it, whatever else was in play.
OWN_MECHANISM = {"spec_independence": "speculation", "history_independence": "cache state",
                 "schedule_independence": "scheduling", "eviction_safety": "eviction", "prefix_only": "prefix hit",
                 "rollback_hygiene": "pool after a batch", "isolation": "cross-identity reuse",
                 "exercised": "coverage"}
_NAMES = {"cache": "prefix hit", "spec": "speculation", "schedule": "chunking or batching"}
_KINDS = {"diverge": "other tokens", "finish": "other finish reason"}


@frozen
class Signature:
    check: str
    mechanism: str
    title: str

    @property
    def id(self) -> str:
        text = "\n".join((self.check, self.mechanism, self.title))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def line(self) -> str:
        return f"{self.id} [{self.check}] {self.title} ({self.mechanism})"

    def to_json(self) -> dict[str, str]:
        return {"signature": self.id, "check": self.check, "mechanism": self.mechanism, "title": self.title}


# An independence check words one bug two ways: "output depends on X" where two runs of the request were
# compared, "output differs from plain decoding when X is in play" where one run was compared with plain
# decoding. Which one a witness shows depends on the draw, so both read as the first.
_IN_PLAY = re.compile(r"^output differs from plain decoding when (.+) is in play$")


def normalise(text: str) -> str:
    """A title without the numbers a run happens to have (counts, positions, ids), one wording per claim."""
    text = re.sub(r"\s+", " ", re.sub(r"\d+", "N", text)).strip()
    return _IN_PLAY.sub(r"output depends on \1", text)


def _focus_mechanisms(history: History, finding: RootCause) -> set[str]:
    """The reuse mechanisms the engine reported for the failing request (empty: not about one request)."""
    w = finding.failure.witness
    req = w.get("request") if isinstance(w.get("request"), Mapping) else {}
    ex = next((e for e in history.examples if e.index == finding.failure.example), None)
    batch = w.get("batch")
    if ex is None or not isinstance(batch, int) or not 0 <= batch < len(ex.batches):
        return set()
    b = ex.batches[batch]
    return next((mechanisms(b, r) for q, r in zip(b.requests, b.results) if q.id == req.get("id")), set())


def _kind(finding: RootCause) -> str | None:
    for f in (finding.failure, *finding.failures):
        comparison = f.witness.get("comparison")
        if isinstance(comparison, Mapping) and comparison.get("kind") in _KINDS:
            return _KINDS[comparison["kind"]]
    return None


def mechanism(history: History, finding: RootCause) -> str:
    """What was in play, in words that do not depend on the witness' sizes."""
    if finding.check in OWN_MECHANISM:
        words = OWN_MECHANISM[finding.check]
    else:
        active = sorted(_NAMES[m] for m in _focus_mechanisms(history, finding))
        kind = _kind(finding) if finding.check == "parity" else None  # accounting's titles say how it went wrong
        words = ", ".join(active or ["plain decoding"]) + (f"; {kind}" if kind else "")
    return words + ("; another identity in its batch" if alone.needed_another_identity(history, finding) else "")


# The checks whose every failure says "the output is not what it must be": the wording of the record
# shown (pairwise, against plain decoding, or another check's record under this one) is the draw's, the
# claim is the check's own.
OUTPUT_CLAIMS = ("parity", "spec_independence", "history_independence", "schedule_independence", "eviction_safety")


def signature(history: History, finding: RootCause) -> Signature:
    title = CHECKS[finding.check].title if finding.check in OUTPUT_CLAIMS else finding.title
    return Signature(finding.check, mechanism(history, finding), normalise(title))


def signed_findings(history: History, analysis: Analysis) -> list[tuple[Signature, RootCause]]:
    """The run's findings (grouped by root) with their signatures, in the report's order."""
    return [(signature(history, fd), fd) for fd in group(history, analysis)]


def example_signatures(history: History, example: Example, checks: Mapping[str, Any]) -> dict[str, Signature]:
    """The signatures of one example's failures (`checks`: its per-check results), by id: what a live run
    decides on, example by example, before the run's own analysis exists."""
    view = history.only(example)
    return {sig.id: sig for sig, _ in signed_findings(view, Analysis(checks=dict(checks)))}
