"""What one `kvparity run` in a museum venv said, read back from its run folder.

The run happened in another interpreter (the engine release's venv); its record is the run folder it
wrote. The verdict and failures come from `results.json`; the examples to the first failure come from
re-analysing `history.jsonl` here, example by example (the same way the fault zoo counts them), because
the failure a report names is the shrunk one, which Hypothesis replays after the first. A run folder
that is missing, torn or unreadable is an `error` outcome: a run whose record is lost proved nothing."""

from __future__ import annotations

import json
from pathlib import Path

from attrs import frozen

from conformance.analysis import failing_examples, select_checks
from conformance.history_files import load_run_history
from conformance.minimise import witness_size, witness_steps


@frozen
class Outcome:
    verdict: str  # pass | fail | inconclusive | error (the run's own word, or error when unreadable)
    exit_code: int | None
    run_dir: Path | None
    checks: dict[str, str] = {}  # check -> its status
    examples: int = 0
    first_failure: int | None = None  # 1-based index of the first example with a failure
    first_checks: tuple[str, ...] = ()  # the checks failing there
    witness: Path | None = None  # the witness file of `check` (or of the first failing check)
    witness_tokens: int | None = None  # its longest prompt
    witness_blocks: float | None = None  # the same, in blocks of the block size it ran with
    witness_requests: int | None = None
    engine_version: str = ""
    note: str = ""  # why the outcome is error, or the run's own errors

    def says(self, check: str, word: str) -> bool:
        return self.checks.get(check) == word


def read(run_dir: Path | None, check: str | None = None, exit_code: int | None = None, note: str = "") -> Outcome:
    if run_dir is None:
        return Outcome("error", exit_code, None, note=note or "the run wrote no run folder")
    try:
        results = json.loads((run_dir / "results.json").read_text())
        history = load_run_history(run_dir)  # committed: history.jsonl.gz
        checks = {name: c["status"] for name, c in results["checks"].items()}
        failures = [f for c in results["checks"].values() for f in c.get("failures", [])]
        verdict, examples = str(results["verdict"]), int(results["examples"])
        caps = results["run"].get("capabilities") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # NotAHistory is a ValueError
        return Outcome("error", exit_code, run_dir, note=f"unreadable run folder: {type(exc).__name__}: {exc}")
    names = select_checks(list(checks))  # the checks the run was asked for (`--checks`), not every check
    found = next(failing_examples(history, names), None)
    first, first_checks = (found[0].index + 1, tuple(found[1])) if found else (None, ())
    chosen = next((f for f in failures if f["check"] == check), failures[0] if failures else None)
    witness = size = None
    if chosen and chosen.get("witness_file"):
        witness = run_dir / "witnesses" / Path(chosen["witness_file"]).name
        if witness.exists():
            size = witness_size(witness_steps(witness), int(caps.get("block_size") or 1))
    return Outcome(verdict, results.get("exit_code", exit_code), run_dir, checks, examples,
                   first, first_checks, witness, *(size or (None, None, None)),
                   engine_version=str(caps.get("version", "")),
                   note=note or "; ".join(map(str, results.get("errors", []))))
