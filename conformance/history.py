"""The history: an append-only JSONL record of everything sent to and said by the engine.

Jepsen's lesson: write the history to disk *before* checking it, so a checker bug, a crash or a hang
never loses the evidence, and `kvparity report RUN_DIR` can re-analyse a run without the engine.
Every line is one event, flushed as it is written (fsynced at example boundaries and errors):

    run_start    {engine, engine_args, capabilities, versions, seed, profile}
    example      {index, completion?, alone?, kin?, rebatch?}  an example starts (the last three: alone.py)
    config       {config}                 engine.configure(config) is about to be called
    reset        {snapshot?}              engine.reset() returned (white-box: the pool at rest)
    submit       {requests}               engine.run(requests) is about to be called
    batch        {results, snapshot}      ...and answered (snapshot: white-box, optional)
    baseline     {key, baseline}          the oracle's answer for one oracle key (memoized, written once)
    error        {cause, snapshot?}       the engine crashed, hung or answered malformed (snapshot: the pool)
    completion   {targets, examples, reached, unreached}  after the stream, when it left a relevant
                                          situation unreached (coverage completion: completion.py)
    interrupted  {cause}                  the user stopped the run (Ctrl-C)
    run_end      {examples, shrink_steps, the run finished (shrink_steps: examples run while shrinking);
                  duration_s, events, sealed}  `events`, `sealed` seal the chain (conformance.history_chain)

Every line carries `chain`, a digest of the line before (history_chain): an edited, reordered or cut
history is refused by `kvparity report` instead of re-judged.

Requests are recorded *before* the engine sees them: the request that killed an engine is in the history,
named in the verdict's cause and replayable. Reading is strict (a line that is not an event is an error
naming it, a torn last line a crash mid-write, an empty file not a history) and yields contract values
grouped into examples of batches: the shape every check reads.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from attrs import define, field, frozen

from conformance import untrusted
from conformance.contract import Baseline, Capabilities, Request, Result
from conformance.history_chain import FIELD as CHAIN_FIELD
from conformance.history_chain import GENESIS, Integrity, chained_line, verify
from conformance.history_codec import (alone_pairs, baseline_from, capabilities_from, current_key, json_default,
                                       oracle_key_str, request_from, result_from)

# --------------------------------------------------------------------------- writing


_DURABLE = {"run_start", "example", "error", "interrupted", "run_end"}


class HistoryWriteError(BaseException):
    """The history could not be written (disk full, folder gone). A BaseException, like KeyboardInterrupt,
    so neither an adapter's nor Hypothesis' `except Exception` swallows it: a run that cannot record
    its evidence stops, and its verdict is `error`."""


class HistoryWriter:
    """Append events to `path`, one JSON line each, flushed before returning (fsynced at example
    boundaries and errors: fsync per line cost more than the fake engine's whole run; a `submit` is flushed,
    which is all a process that dies needs — fsync guards against the machine dying).

    Each event, already normalised through JSON (so analysing in memory and analysing the file on disk see
    exactly the same data), goes to `sink` — by default `events`, a list. A run gives its own sink (the
    History it checks grows as events are written) and `events` stays empty: a second copy of every event,
    as parsed JSON, was a fifth of a long run's memory. Numbers must be finite (`allow_nan=False`):
    NaN is not JSON. After a failed write the file is left as it is (everything before the failure is
    kept) and later events are kept in memory only, so the run can still say what it saw.
    """

    def __init__(self, path: str | os.PathLike[str] | None, fsync: bool = True,
                 sink: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.fsync = fsync
        self.events: list[dict[str, Any]] = []
        self.sink = sink or self.events.append
        self.written = 0  # events appended so far (the seal counts them)
        self.write_error: str | None = None
        self._chain = GENESIS  # the last event's chain value
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        if event == "run_end":  # the seal: how many events it closes, and the last one's chain value
            fields = {**fields, "events": self.written, "sealed": self._chain}
        body = json.dumps({"event": event, **fields}, separators=(",", ":"), allow_nan=False, default=json_default)
        line, self._chain = chained_line(self._chain, body)
        record = json.loads(line)
        self.written += 1
        self.sink(record)
        if self._fh is not None:
            try:
                self._fh.write(line + "\n")
                self._fh.flush()  # a crashed process loses nothing already appended
                if self.fsync and event in _DURABLE:  # an OS crash loses at most the current example
                    os.fsync(self._fh.fileno())
            except OSError as exc:
                self.write_error = f"cannot write the history {self.path}: {exc}"
                self._abandon()
                raise HistoryWriteError(self.write_error) from exc
        return record

    def _abandon(self) -> None:
        fh, self._fh = self._fh, None
        with contextlib.suppress(OSError):  # what could not be flushed is lost either way; the rest stays
            fh.close()

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                self.write_error = f"cannot write the history {self.path}: {exc}"
            self._fh = None

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NotAHistory(ValueError):
    """The file is not a kvparity history at all (empty, or not starting with `run_start`)."""


def read_events(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Read a JSONL history: (events, problems). Reading stops at the first line that is not an event —
    what follows cannot be placed — and says which line it was; a torn last line (no newline, not JSON) is
    a crash mid-write. An empty file, or one whose first event is not `run_start`, raises `NotAHistory`."""
    path, events, problems, number = Path(path), [], [], 0
    for number, (line, ended) in enumerate(untrusted.capped_lines(path, untrusted.MAX_HISTORY_BYTES, "history",
                                                                  untrusted.MAX_HISTORY_EVENTS), start=1):
        if not line.strip():
            continue
        try:
            ev = untrusted.loads(line, f"{path} line {number}")  # too deep: refused, one line
        except json.JSONDecodeError:
            ev = None
        if not isinstance(ev, dict) or not isinstance(ev.get("event"), str):
            if not ended:  # the last line, with no newline: torn
                problems.append(f"{path.name} line {number} is torn: the process died while writing it")
            else:
                problems.append(f"{path.name} line {number} is not a history event; "
                                f"lines after {number - 1} were not read")
            break
        if not events and ev["event"] != "run_start":  # refused at once, not after the whole file is parsed
            break
        events.append(ev)
    if not events:
        raise NotAHistory(f"{path} is empty: not a kvparity history" if number == 0 else
                          f"{path} does not start with a run_start event: not a kvparity history")
    untrusted.check_history_configs(events, str(path))
    return events, problems


# --------------------------------------------------------------------------- the checked shape


@frozen
class BatchRecord:
    """One `engine.run` call in context.

    `epoch` counts resets within the example and `segment` counts configure calls: configure may
    restart the engine, so reuse is only expected within one (epoch, segment).
    """

    example: int
    index: int
    epoch: int
    segment: int
    config: Mapping[str, Any]
    requests: tuple[Request, ...] = field(converter=tuple)
    results: tuple[Result, ...] = field(converter=tuple)
    snapshot: Mapping[str, Any] | None = None
    # snapshot["evictions"] as last seen before this batch (after a reset or an earlier batch), if known
    evictions_before: int | None = None

    def pairs(self, refused: bool = False) -> Iterable[tuple[int, Request, Result]]:
        """The requests the engine ran and their results; `refused`: those it refused (it ran nothing)."""
        return ((i, q, r) for i, (q, r) in enumerate(zip(self.requests, self.results))
                if (r.finish_reason == "refused") == refused)


@frozen
class FailedBatch:
    """A batch the engine failed (crash, hang, malformed answer) and a white-box snapshot taken after it."""

    example: int
    index: int  # the index it would have had among the example's batches
    config: Mapping[str, Any]
    requests: tuple[Request, ...] = field(converter=tuple)
    snapshot: Mapping[str, Any] = field(factory=dict)


@define
class Example:
    index: int
    batches: list[BatchRecord] = field(factory=list)
    errors: list[str] = field(factory=list)
    failed_batches: list[FailedBatch] = field(factory=list)
    # The resolved steps, replayable as they are (continuations already resolved): configure, reset and
    # every submitted batch — the one the engine never answered included.
    step_list: list[dict[str, Any]] = field(factory=list)
    # A coverage-completion example (conformance/completion.py): the situations it went after and each
    # batch's arm; None for an example of the stream.
    completion: dict[str, Any] | None = None
    alone: tuple[tuple[int, str], ...] | None = None  # re-sends (alone.py): the (example, id) pairs re-sent alone,
    kin: tuple[tuple[int, str], ...] | None = None  # in their batch under one identity,
    rebatch: tuple[tuple[int, str], ...] | None = None  # in their batch whole (each after a reset)
    # history_facts.reuse_scan's answer and the batch count it saw (checks, guard and coverage share it)
    reuse: tuple[int, list] | None = field(default=None, init=False, eq=False, repr=False)

    def steps(self) -> list[dict[str, Any]]:
        return list(self.step_list)


@define
class History:
    """A parsed history: run metadata, capabilities, examples of batches and the memoized baselines.

    `errors` are the engine's failures and the history's own problems (a corrupt or torn line);
    `ended` says whether the run wrote its `run_end`; `interrupted` holds the cause if the user stopped it.
    """

    meta: dict[str, Any] = field(factory=dict)
    capabilities: Capabilities | None = None
    examples: list[Example] = field(factory=list)
    baselines: dict[str, Baseline] = field(factory=dict)
    errors: list[str] = field(factory=list)
    ended: dict[str, Any] | None = None
    interrupted: str | None = None
    last_event: str | None = None
    in_flight: tuple[Request, ...] = ()
    digest: str | None = None  # the last event's chain value (None: a legacy history, written unchained)
    completion: dict[str, Any] | None = None  # the `completion` event: what completion went after and found

    @property
    def tolerance(self) -> float:
        return self.capabilities.tolerance if self.capabilities else 0.0

    @property
    def oracle(self) -> str:
        """Which oracle judged the run ("" where the engine did not say, e.g. histories written before)."""
        return self.capabilities.oracle if self.capabilities else ""

    def ended_seconds(self, key: str) -> float | None:  # None: not ended, or a history from before `key` was kept
        return None if self.ended is None or self.ended.get(key) is None else float(self.ended[key])

    duration_s = property(lambda self: self.ended_seconds("duration_s"))
    engine_s = property(lambda self: self.ended_seconds("engine_s"))  # the time inside engine calls

    def incomplete(self) -> str | None:
        """Why this history is not a finished run, in one line; None when it ended cleanly."""
        if self.ended is not None:
            return None
        what = f"{len(self.examples)} examples recorded, last event {self.last_event}"
        if self.in_flight:
            ids = ", ".join(q.id for q in self.in_flight[:4]) + (" ..." if len(self.in_flight) > 4 else "")
            what += f" (requests {ids} submitted, never answered)"
        return f"run interrupted: {self.interrupted}; {what}" if self.interrupted else f"run did not finish: {what}"

    def batches(self) -> Iterable[BatchRecord]:
        for ex in self.examples:
            yield from ex.batches

    def baseline_for(self, request: Request) -> Baseline | None:
        return self.baselines.get(oracle_key_str(request))

    def only(self, example: Example) -> "History":
        """A view holding one example, for per-example checking."""
        return History(self.meta, self.capabilities, [example], self.baselines, list(example.errors), self.ended)


class HistoryBuilder:
    """Turns events into a `History` one at a time, so a live run holds one complete, growing `History`
    (fed by its writer) instead of re-parsing slices of its events and patching in what they lack. A
    `batch` takes its requests from the `submit` before it (older histories carried them in the `batch`
    event, read the same way); events before any `example` event form example 0."""

    def __init__(self, capabilities: Capabilities | None = None,
                 baselines: dict[str, Baseline] | None = None) -> None:
        """`capabilities` and `baselines` for a history whose events do not carry them (a state-machine
        session: one run_start for many sessions, and baselines memoized across them)."""
        self.history = History(capabilities=capabilities, baselines={} if baselines is None else baselines)
        self._current: Example | None = None
        self._epoch = self._segment = 0
        self._config: Mapping[str, Any] = {}
        self._evictions: int | None = None
        self._pending: list[dict[str, Any]] | None = None

    def _example(self) -> Example:
        if self._current is None:
            self._current = Example(index=len(self.history.examples))
            self.history.examples.append(self._current)
        return self._current

    def feed(self, ev: Mapping[str, Any]) -> None:
        h = self.history
        kind = ev.get("event")
        h.last_event = str(kind)
        h.digest = ev.get(CHAIN_FIELD)
        if kind == "run_start":
            h.meta = {k: v for k, v in ev.items() if k != CHAIN_FIELD}
            if ev.get("capabilities"):
                h.capabilities = capabilities_from(ev["capabilities"])
        elif kind == "example":
            self._current = Example(index=int(ev.get("index", len(h.examples))), completion=ev.get("completion"),
                                    **{k: alone_pairs(ev.get(k)) for k in ("alone", "kin", "rebatch")})
            h.examples.append(self._current)
            self._epoch = self._segment = 0
            self._config = {}
            self._evictions = None
            self._pending, h.in_flight = None, ()
        elif kind == "baseline":
            h.baselines[current_key(ev["key"])] = baseline_from(ev["baseline"])
        elif kind == "config":
            self._example().step_list.append({"step": "configure", "config": ev.get("config", {})})
            self._config = dict(ev.get("config") or {})
            self._segment += 1
            self._evictions = None  # configure may restart the engine, and its eviction counter with it
        elif kind == "reset":
            self._example().step_list.append({"step": "reset"})
            self._epoch += 1
            self._seen_evictions(ev.get("snapshot"))
        elif kind == "submit":
            self._pending = list(ev["requests"])
            self._example().step_list.append({"step": "batch", "requests": self._pending})
            h.in_flight = tuple(request_from(r) for r in self._pending)
        elif kind == "batch":
            self._batch(ev)
        elif kind == "error":
            self._error(ev)
        elif kind == "completion":
            h.completion = {k: v for k, v in ev.items() if k != "event"}
        elif kind == "interrupted":
            h.interrupted = str(ev.get("cause", "interrupted"))
        elif kind == "run_end":
            h.ended = dict(ev)

    def _seen_evictions(self, snapshot: Mapping[str, Any] | None) -> None:
        if (snapshot or {}).get("evictions") is not None:
            self._evictions = int(snapshot["evictions"])  # type: ignore[index]

    def _batch(self, ev: Mapping[str, Any]) -> None:
        ex = self._example()
        requests = ev.get("requests", self._pending)
        if "requests" in ev:  # an older history: no submit event before it
            ex.step_list.append({"step": "batch", "requests": ev["requests"]})
        if requests is None:
            raise ValueError("a batch event without a submit event before it")
        parsed = list(self.history.in_flight) if requests is self._pending else [request_from(r) for r in requests]
        ex.batches.append(BatchRecord(
            example=ex.index, index=len(ex.batches), epoch=self._epoch, segment=self._segment,
            config=self._config, requests=parsed,  # parsed at the submit (`in_flight`), else here
            results=[result_from(r) for r in ev["results"]], snapshot=ev.get("snapshot"),
            evictions_before=self._evictions))
        self._pending, self.history.in_flight = None, ()
        self._seen_evictions(ev.get("snapshot"))

    def _error(self, ev: Mapping[str, Any]) -> None:
        ex = self._example()
        cause = str(ev.get("cause", "unknown error"))
        ex.errors.append(cause)
        self.history.errors.append(cause)
        requests = ev.get("requests") or self._pending or ()
        if ev.get("requests") and self._pending is None:  # an older history: the failed batch's requests
            ex.step_list.append({"step": "batch", "requests": ev["requests"]})
        if ev.get("snapshot"):
            ex.failed_batches.append(FailedBatch(ex.index, len(ex.batches), self._config,
                                                 [request_from(r) for r in requests], ev["snapshot"]))
        self._pending, self.history.in_flight = None, ()


def parse(events: Iterable[Mapping[str, Any]]) -> History:
    """Group raw events into a `History` (see `HistoryBuilder`)."""
    builder = HistoryBuilder()
    for ev in events:
        builder.feed(ev)
    return builder.history


def load(path: str | os.PathLike[str]) -> History:
    """Parse a history file; its reading problems (a corrupt or torn line) and its integrity problems (a
    broken chain or seal, conformance.history_chain) become errors of the run: never a pass."""
    return load_verified(path)[0]


def load_verified(path: str | os.PathLike[str]) -> tuple[History, Integrity]:
    """`load`, and what verifying the history's chain found (`kvparity report` refuses a history with
    integrity problems, and says when one is legacy, i.e. unverified)."""
    events, problems = read_events(path)
    integrity = verify(events)
    h = parse(events)
    h.errors.extend(problems)
    h.errors.extend(integrity.problems)
    return h, integrity
