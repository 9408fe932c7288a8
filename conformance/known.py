"""Known findings: a committed baseline of bugs an engine is known to have, so one unfixed bug does not
hide the next one every night (issue 33).

`kvparity run --known FILE` reads a small, reviewable JSON file — one entry per bug: its signature
(conformance.signature: check, mechanism, title and their id), an upstream link and a note:

    {"kvparity_known": 1,
     "findings": [{"signature": "3f0c9d2a41be", "check": "prefix_only", "mechanism": "prefix hit",
                   "title": "...", "upstream": "https://github.com/...", "note": "..."}]}

A failure whose signature is listed is *known*: the run records it, counts it, shows it in the report as
known and goes on looking (the runner does not stop Hypothesis on it); it does not fail the run. Any
other failure still does. A listed finding the run did not see is *fixed*: reported, and with
`--strict-known` the run fails, so the file is kept current (the code-scanning baseline's rule; pytest's
`xfail(strict=True)`). `kvparity report RUN_DIR --write-known FILE` writes such a file from a run's
findings for a person to review and commit.

The entries are recorded in the history's `run_start` event, so `kvparity report` re-judges a run with
the baseline it ran with. The file is read like any file someone else wrote (conformance.untrusted).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from attrs import field, frozen

from conformance.analysis import Analysis
from conformance.contract import UsageError
from conformance.history import History
from conformance.signature import Signature, signed_findings

VERSION = 1
MAX_ENTRIES = 1000
MAX_TEXT = 2000
_FIELDS = ("signature", "check", "mechanism", "title", "upstream", "note")
_ID = re.compile(r"[0-9a-f]{12}")


def load(path: str | Path) -> list[dict[str, str]]:
    """The entries of a known-findings file, validated; a one-line UsageError for anything else."""
    from conformance.untrusted import read_json

    try:
        data = read_json(path, "known-findings file")
    except OSError as exc:
        raise UsageError(f"cannot read known-findings file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"known-findings file {path} is not UTF-8 text: {exc.reason}") from None
    except ValueError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"known-findings file {path} is not valid JSON: {exc}") from None
    return validate(data, str(path))


def validate(data: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(data, dict) or data.get("kvparity_known") != VERSION:
        raise UsageError(f"{where}: not a kvparity known-findings file (want {{\"kvparity_known\": {VERSION}, "
                         f"\"findings\": [...]}})")
    entries = data.get("findings")
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise UsageError(f"{where}: \"findings\" must be a list of at most {MAX_ENTRIES} entries")
    out = []
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("signature"), str) or not _ID.fullmatch(e["signature"]):
            raise UsageError(f"{where}: finding {k} has no signature (12 lower-case hex digits)")
        bad = [key for key, v in e.items() if key not in _FIELDS or not isinstance(v, str) or len(v) > MAX_TEXT]
        if bad:
            raise UsageError(f"{where}: finding {k}: field {bad[0]!r} is unknown or not a string of at most "
                             f"{MAX_TEXT} characters (fields: {', '.join(_FIELDS)})")
        out.append({key: e[key] for key in _FIELDS if key in e})
    return out


def file_text(entries: Iterable[Mapping[str, str]]) -> str:
    """A known-findings file: one entry per line, so a review diff shows one line per bug."""
    lines = [json.dumps({k: e[k] for k in _FIELDS if k in e}, ensure_ascii=False) for e in entries]
    body = ",\n  ".join(lines)
    return f'{{"kvparity_known": {VERSION},\n "findings": [\n  {body}\n ]}}\n' if lines else \
        f'{{"kvparity_known": {VERSION}, "findings": []}}\n'


def entry(sig: Signature, upstream: str = "", note: str = "") -> dict[str, str]:
    return {**sig.to_json(), "upstream": upstream, "note": note}


@frozen
class KnownOutcome:
    """What a run's known findings came to: `waived` the case ids of failure records that are known;
    `seen` signature -> how many findings matched it; `fixed` the entries no failure of the run matched;
    `unknown_in` the checks that failed somewhere with a signature not listed (`bugs_seen`); `in_shard`: the
    run is one shard of a campaign (`--shard i/n`), which sees only its part of the campaign's examples."""

    entries: tuple[Mapping[str, str], ...]
    strict: bool
    waived: frozenset[str] = field(factory=frozenset)
    seen: Mapping[str, int] = field(factory=dict)
    fixed: tuple[Mapping[str, str], ...] = ()
    unknown_in: frozenset[str] = field(factory=frozenset)
    in_shard: bool = False

    @property
    def fails_run(self) -> bool:
        """`--strict-known` and an entry not seen. Not in a shard: a known finding another shard met is not
        fixed, and only the campaign's merge (whose history is no shard's) sees every shard's examples —
        a shard of a correct replica FAILed alone on a finding its campaign's other replica met, the merge PASS."""
        return self.strict and bool(self.fixed) and not self.in_shard

    def to_json(self) -> dict[str, Any]:
        return {"strict": self.strict, "entries": [dict(e) for e in self.entries], "seen": dict(self.seen),
                "fixed": [dict(e) for e in self.fixed], "waived": sorted(self.waived),
                "unknown_in": sorted(self.unknown_in), "in_shard": self.in_shard}


def judge(history: History, analysis: Analysis, entries: Sequence[Mapping[str, str]], strict: bool) -> KnownOutcome:
    """Match the run's findings, and every failure the run saw (`bugs_seen`), against the known entries."""
    ids = {e["signature"] for e in entries}
    waived: set[str] = set()
    seen: dict[str, int] = {}
    for sig, fd in signed_findings(history, analysis):
        if sig.id in ids:
            seen[sig.id] = seen.get(sig.id, 0) + fd.count
            waived |= {f.case_id for f in fd.failures}
    saw = bugs_seen(history, analysis.failed_checks)
    fixed = tuple(e for e in entries if e["signature"] not in seen and e["signature"] not in saw)
    unknown_in = frozenset(check for sig, checks in saw.items() if sig not in ids for check in checks)
    return KnownOutcome(tuple(entries), strict, frozenset(waived), seen, fixed, unknown_in, "shard" in history.meta)


def bugs_seen(history: History, checks: Sequence[str]) -> dict[str, set[str]]:
    """Every signature among the judged examples' failures of `checks`, with the checks that failed with it.

    A run keeps one failure per check and title, the last (its shrunk witness), and a check's failures
    share a title (parity's always do), so the findings alone name one bug per check. Judged on them, a
    known bug the run met, whose failure a later one of its check displaced, was reported fixed (measured:
    a known signature seen in 14 to 187 examples of a run, "FIXED: not seen in this run"), and a check whose
    last failure was known passed whatever else it had failed with. Here each failing example is signed as
    the live run signs it (conformance.signature.example_signatures); a context probe's examples are not
    judged (conformance.analysis)."""
    saw: dict[str, set[str]] = {}
    for sig, fd in example_findings(history, checks):
        saw.setdefault(sig.id, set()).update(f.check for f in fd.failures)
    return saw


def example_findings(history: History, checks: Sequence[str]) -> Iterable[tuple[Signature, Any]]:
    """Each judged example's failures of `checks`, grouped and signed as the live run signs them: what the
    gate (`bugs_seen`) judges, and so what `kvparity report --write-known` writes beside the findings."""
    from conformance.analysis import example_verdicts

    for ex in history.examples:
        if not checks or ex.kin or ex.rebatch:
            continue
        verdicts = example_verdicts(history, ex, checks)
        if any(r.failures for r in verdicts.values()):
            yield from signed_findings(history.only(ex), Analysis(checks=verdicts))


def recorded(history: History) -> tuple[list[dict[str, str]], bool] | None:
    """The known entries (and `--strict-known`) a run recorded in its run_start; None: it had none."""
    raw = history.meta.get("known")
    if raw is None:
        return None
    try:
        return validate({"kvparity_known": VERSION, "findings": raw}, "the history's known findings"), \
            bool(history.meta.get("strict_known"))
    except UsageError:
        return None


def apply(history: History, analysis: Analysis) -> Analysis:
    """`analysis` with the known findings the history recorded judged in (unchanged where it has none)."""
    rec = recorded(history)
    if rec is not None:
        analysis.known = judge(history, analysis, rec[0], rec[1])
    return analysis
