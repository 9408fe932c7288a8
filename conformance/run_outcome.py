"""What a run leaves behind for its handlers and its caller: the verdict (analysis), the History as it
was recorded (so no caller re-reads history.jsonl from disk), and how the run ended."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import attrs
from attrs import define

from conformance.analysis import Analysis
from conformance.exit_codes import ExitCode
from conformance.history import History


@define
class RunOutcome:
    """One finished run, as `run_suite` returns it and its handlers see it at `on_end`."""

    run_dir: Path
    analysis: Analysis
    duration_s: float
    examples: int
    interrupted: bool = False  # the user stopped it (Ctrl-C): exit 130, the report says so
    abandoned: bool = False  # an engine call hung and its thread was left behind
    report_error: str | None = None  # the report files could not be written (disk full)
    first_failing: dict[str, int] = attrs.Factory(dict)  # check -> the first example that failed it
    closed: bool = False  # run_suite(close=True) closed the engine (its failure, if any, is in the history)
    stop_code: int = ExitCode.INTERRUPTED  # the exit code of an interrupted run: 128 + the signal (conformance.stopping)
    seed: int | None = None  # the Hypothesis seed the stream was drawn from (None: derandomised, as ci is)
    step_kinds: dict[str, int] = attrs.Factory(dict)  # kind -> steps drawn (conformance.step_counts)
    shrink_capped: bool = False  # shrinking ended at `max_shrink_seconds`: the witness is the smallest so far
    history: History | None = None  # the run's one History, as recorded: nothing re-reads history.jsonl
    decode: Callable[[list[int]], str] | None = attrs.field(default=None, repr=False)  # the engine's text hook

    @property
    def verdict(self) -> str:
        return self.analysis.verdict

    @property
    def exit_code(self) -> int:
        return self.stop_code if self.interrupted else self.analysis.exit_code
