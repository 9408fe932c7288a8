"""results.json and the witness files: the report as data, from which every rendering is made.

A witness file (one per failure, under `witnesses/`) holds what `kvparity replay <path>` needs to re-run
the failing example; results.json holds the verdicts, the grouped findings with their stories and replay
commands, and what the run exercised (`conformance.report.exercised`). Renderings (`sections`, `junit`)
read results.json alone, so a report re-rendered later needs no history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from conformance.analysis import Analysis
from conformance.finding_order import witness_size
from conformance.grouping import RootCause, group
from conformance.history import History
from conformance.history_codec import encode
from conformance.report.exercised import results_part
from conformance.report.headline import headline
from conformance.report.story import decode_texts, story, text_key
from conformance.run_folder import write_text
from conformance.signature import signature
from conformance.verdicts import CheckFailure


def witness_path(run_dir: Path, failure: CheckFailure) -> Path:
    return Path(run_dir) / "witnesses" / f"{failure.case_id}.json"


def _witness_texts(w: Mapping[str, Any], texts: Mapping[str, str]) -> dict[str, str]:
    """The decoded text of a witness's own sequences, where the run recorded it."""
    out = {}
    for key in ("output", "expected_output", "earlier_output"):
        if isinstance(w.get(key), list) and text_key(w[key]) in texts:
            out[key] = texts[text_key(w[key])]
    return out


def write_witnesses(run_dir: Path, history: History, analysis: Analysis,
                    texts: Mapping[str, str] | None = None, subfolder: str = "",
                    engine_args: Callable[[int], Mapping[str, Any]] | None = None) -> dict[str, Path]:
    """One JSON file per failure: the engine, its arguments, the failure, the resolved steps and, where
    the adapter could decode, the text of the outputs (so a reader needs no tokenizer). `subfolder`:
    inside `run_dir` (a re-analysis), reached without following a symlink. `engine_args`: the arguments
    the engine of an example ran with, where they are not the run's alone (a campaign's shards each
    drive their own replica: a witness replays on the one that failed)."""
    out: dict[str, Path] = {}
    examples = {ex.index: ex for ex in history.examples}
    for failure in analysis.failures:
        ex = examples.get(failure.example)
        args = engine_args(failure.example) if engine_args else history.meta.get("engine_args", {})
        data = {"kvparity_witness": 1, "engine": history.meta.get("engine"),
                "engine_args": args, "check": failure.check,
                "failure": failure.to_json(), "steps": ex.steps() if ex else [],
                "capabilities": encode(history.capabilities) if history.capabilities else None}
        decoded = _witness_texts(failure.witness, texts or {})
        if decoded:
            data["decoded"] = decoded
        out[failure.case_id] = write_text(run_dir, f"{subfolder}witnesses/{failure.case_id}.json",
                                          json.dumps(data, indent=1))
    return out


def replay_command(path: Path, engine: str | None = None) -> str:
    """The one-line reproduce command. A witness may only name a registered engine, so one recorded
    with a `module:Class` adapter replays with that adapter named on the command line."""
    named = f" --engine {engine}" if engine and ":" in engine else ""
    return f"kvparity replay {path}{named}"


# What a report holds that its history cannot give back: re-analysis (`kvparity report`) carries these
# over from the results.json it replaces instead of dropping them. `decoded`: token ids -> text, from
# the adapter's `decode` hook at run time (conformance has no tokenizer of its own).
CARRIED = ("duration_s", "minimised", "process", "decoded")


def findings_json(history: History, findings: list[RootCause], witnesses: Mapping[str, Path],
                  known: Any = None) -> list[dict]:
    """The grouped findings, each with its signature (conformance.signature), whether `--known` waived it,
    its story (timeline, divergence, reuse) and replay command."""
    out = []
    for fd in findings:
        d = fd.to_json()
        sig = signature(history, fd)
        d["signature"] = sig.to_json()
        d["known"] = known is not None and sig.id in known.seen
        d["story"] = story(history, fd)
        d["headline"] = headline(d)
        d["witness_size"] = witness_size(history, fd.failure).to_json()
        d["explanation"] = fd.failure.explanation
        d["record_check"] = fd.failure.check
        d["witness"] = dict(fd.failure.witness)
        if fd.failure.case_id in witnesses:
            d["replay"] = replay_command(witnesses[fd.failure.case_id], history.meta.get("engine"))
        out.append(d)
    return out


def results_json(history: History, analysis: Analysis, witnesses: Mapping[str, Path],
                 duration_s: float | None = None, carried: Mapping[str, Any] | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> dict:
    """The whole report as data. `carried`: earlier results.json values of the CARRIED keys, plus any
    given anew (`minimised`: one line per minimised witness; `process`: how the run's process ended
    when it died without finishing). `decode`: the adapter's hook, for the text of each story."""
    data = analysis.to_json()
    for check in data["checks"].values():
        for f in check["failures"]:
            if f["case_id"] in witnesses:
                f["witness_file"] = str(witnesses[f["case_id"]])
                f["replay"] = replay_command(witnesses[f["case_id"]], history.meta.get("engine"))
    meta = {k: v for k, v in history.meta.items() if k != "event"}
    carried = dict(carried or {})
    duration = history.duration_s if history.duration_s is not None else duration_s
    if duration is None:
        duration = carried.get("duration_s")
    findings = findings_json(history, group(history, analysis), witnesses, analysis.known)
    decoded = {**dict(carried.get("decoded") or {}), **decode_texts([f["story"] for f in findings], decode)}
    shrink_steps = (history.ended or {}).get("shrink_steps")
    shrink_steps = shrink_steps if isinstance(shrink_steps, int) and 0 <= shrink_steps <= len(history.examples) else None
    return {"run": meta, "examples": len(history.examples) - (shrink_steps or 0), "shrink_steps": shrink_steps,
            "examples_recorded": len(history.examples), "history_digest": history.digest,
            "duration_s": None if duration is None else round(float(duration), 2),
            "engine_s": None if history.engine_s is None else round(history.engine_s, 2),
            "finished": history.ended is not None, "interrupted": history.interrupted,
            "minimised": dict(carried.get("minimised") or {}), "process": carried.get("process"), **data,
            **results_part(history), "findings": findings, "decoded": decoded}


# --------------------------------------------------------------------------- report.md and report.html
