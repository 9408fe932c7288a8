"""The handlers of a run's event stream (schemathesis' `EventHandler` is the model).

The history writer is the head of the stream: each event reaches history.jsonl first (the history is on
disk before anything checks it), then every handler's `on_event` in order: the in-memory History the
checks read while the run goes on, the progress line, and whatever a caller adds. When the run is over
each handler's `on_end` gets the outcome; the report writer is the handler that writes every report
file, once (numerics.json and minimised witnesses included).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from conformance.history import History, HistoryBuilder
from conformance.run_outcome import RunOutcome


@runtime_checkable
class RunHandler(Protocol):
    def on_event(self, event: Mapping[str, Any]) -> None:
        """Told each history event, after history.jsonl holds it."""

    def on_end(self, outcome: RunOutcome) -> None:
        """Told once, when the run's verdict is known (its engine closed, unless it was interrupted)."""


class InMemoryHistory:
    """The run's one History, growing as its events are written: the checks of each example read it,
    and the outcome carries it, so nothing re-reads history.jsonl."""

    def __init__(self) -> None:
        self._builder = HistoryBuilder()

    @property
    def history(self) -> History:
        return self._builder.history

    def on_event(self, event: Mapping[str, Any]) -> None:
        self._builder.feed(event)

    def on_end(self, outcome: RunOutcome) -> None:
        pass


class ReportWriter:
    """The one writer of a run's report: report.md / .html / junit.xml / results.json, witnesses,
    numerics.json, and the minimised witnesses when `minimise` is given (it is called with the outcome
    after the witnesses are on disk and returns check -> one line saying what came of it). `say` is told
    the numerics summary lines (`kvparity run` prints them). A report that cannot be written sets
    `outcome.report_error`; the run then ends as an error."""

    def __init__(self, calibration: Any = None, minimise: Callable[[RunOutcome], dict[str, str]] | None = None,
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.calibration, self.minimise, self.say = calibration, minimise, say

    def on_event(self, event: Mapping[str, Any]) -> None:
        pass

    def on_end(self, outcome: RunOutcome) -> None:
        from conformance.report import write_report, write_witnesses

        assert outcome.history is not None, "run_suite hands its History to the report"
        try:
            minimised: dict[str, str] = {}
            if self.minimise is not None and not outcome.interrupted:
                write_witnesses(outcome.run_dir, outcome.history, outcome.analysis)  # where minimising starts
                minimised = self.minimise(outcome)
            write_report(outcome.run_dir, outcome.history, outcome.analysis, duration_s=outcome.duration_s,
                         decode=outcome.decode, **({"minimised": minimised} if minimised else {}))
        except OSError as exc:
            outcome.report_error = f"cannot write the report in {outcome.run_dir}: {exc}"
            return
        self._numerics(outcome)

    def _numerics(self, outcome: RunOutcome) -> None:
        """Near-ties by margin band and feature, and the features flagged for flipping near-ties more
        often than plain mode (conformance.numerics), written as numerics.json beside the report."""
        from conformance import numerics
        from conformance.run_folder import write_text

        try:
            summary = numerics.summarise(outcome.history, self.calibration)
            write_text(outcome.run_dir, "numerics.json", json.dumps(summary, indent=1))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.say(f"numerics: not summarised ({type(exc).__name__}: {exc})")
            return
        for line in numerics.summary_lines(summary):
            self.say(line)


def fan_out(handlers: Sequence[RunHandler]) -> Callable[[Mapping[str, Any]], None]:
    """The history writer's sink: each event to every handler, in order."""
    def sink(event: Mapping[str, Any]) -> None:
        for handler in handlers:
            handler.on_event(event)
    return sink
