"""The history: an append-only JSONL record of everything sent to and said by the engine.

Jepsen's lesson: write the history to disk *before* checking it, so a checker bug, a crash or a hang
never loses the evidence, and `kvparity report RUN_DIR` can re-analyse a run without the engine.
Every line is one event, flushed and fsynced as it is written:

    run_start  {engine, engine_args, capabilities, versions, seed, profile}
    example    {index}                        one Hypothesis example (or one replay) starts
    config     {config}                       engine.configure(config) was called
    reset      {snapshot?}                    engine.reset() returned (white-box: the pool at rest)
    batch      {requests, results, snapshot}  engine.run(requests) answered (snapshot: white-box, optional)
    baseline   {key, baseline}                the oracle's answer for one oracle key (memoized, written once)
    error      {cause, requests?, snapshot?}  the engine crashed, hung or answered malformed (snapshot:
                                              white-box, the pool after a failed batch)
    run_end    {}                             the run finished normally

Reading back turns events into contract value types and groups them into examples of batches, which is
the shape every check consumes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import attrs
from attrs import define, field, frozen

from conformance.contract import Baseline, Capabilities, Identity, Request, Result

# --------------------------------------------------------------------------- value encoding


def encode(obj: Any) -> Any:
    """Contract value -> JSON-able data (tuples become lists, frozensets sorted lists)."""
    if attrs.has(type(obj)):
        return {a.name: encode(getattr(obj, a.name)) for a in attrs.fields(type(obj))}
    if isinstance(obj, (frozenset, set)):
        return sorted(encode(v) for v in obj)
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def identity_from(d: Mapping[str, Any] | None) -> Identity:
    return Identity(**d) if d else Identity()


def request_from(d: Mapping[str, Any]) -> Request:
    return Request(id=d["id"], prompt=d["prompt"], max_tokens=int(d["max_tokens"]),
                   stop_ids=d.get("stop_ids", ()), identity=identity_from(d.get("identity")))


def result_from(d: Mapping[str, Any]) -> Result:
    top2 = d.get("top2")
    return Result(request_id=d["request_id"], output=d["output"], finish_reason=d["finish_reason"],
                  cached_tokens=d.get("cached_tokens"), draft_proposed=d.get("draft_proposed"),
                  draft_accepted=d.get("draft_accepted"),
                  top2=None if top2 is None else tuple(tuple(t) for t in top2),
                  timings=dict(d.get("timings") or {}), extra=dict(d.get("extra") or {}))


def baseline_from(d: Mapping[str, Any]) -> Baseline:
    return Baseline(output=d["output"], finish_reason=d["finish_reason"], margins=d.get("margins", ()),
                    runner_up=d.get("runner_up", ()))


def capabilities_from(d: Mapping[str, Any]) -> Capabilities:
    d = dict(d)
    d["revisions"] = tuple(d.get("revisions", ("a",)))
    d["adapters"] = tuple(d.get("adapters", ()))
    d["config_space"] = {k: tuple(v) for k, v in (d.get("config_space") or {}).items()}
    known = {a.name for a in attrs.fields(Capabilities)}
    return Capabilities(**{k: v for k, v in d.items() if k in known})


def oracle_key_str(request: Request) -> str:
    """The oracle key as a stable string (JSON keys must be strings)."""
    return json.dumps(encode(request.oracle_key()), separators=(",", ":"))


# --------------------------------------------------------------------------- writing


_DURABLE = {"run_start", "example", "error", "run_end"}


class HistoryWriter:
    """Append events to `path`, one JSON line each, flushed before returning (fsynced at example
    boundaries and errors: fsync per line cost more than the fake engine's whole run).

    `events` mirrors what was written, already normalised through JSON, so analysing in memory and
    analysing the file on disk see exactly the same data.
    """

    def __init__(self, path: str | os.PathLike[str] | None, fsync: bool = True) -> None:
        self.path = Path(path) if path is not None else None
        self.fsync = fsync
        self.events: list[dict[str, Any]] = []
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        line = json.dumps({"event": event, **encode(fields)}, separators=(",", ":"))
        if self._fh is not None:
            self._fh.write(line + "\n")
            self._fh.flush()  # a crashed process loses nothing already appended
            if self.fsync and event in _DURABLE:  # an OS crash loses at most the current example
                os.fsync(self._fh.fileno())
        record = json.loads(line)
        self.events.append(record)
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL history; a torn last line (the process died mid-write) is dropped, not fatal."""
    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return events


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

    def pairs(self) -> Iterable[tuple[int, Request, Result]]:
        return ((i, q, r) for i, (q, r) in enumerate(zip(self.requests, self.results)))


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
    events: list[dict[str, Any]] = field(factory=list)
    batches: list[BatchRecord] = field(factory=list)
    errors: list[str] = field(factory=list)
    failed_batches: list[FailedBatch] = field(factory=list)

    def steps(self) -> list[dict[str, Any]]:
        """The resolved steps of this example, replayable as they are (continuations already resolved)."""
        out: list[dict[str, Any]] = []
        for ev in self.events:
            if ev["event"] == "config":
                out.append({"step": "configure", "config": ev.get("config", {})})
            elif ev["event"] == "reset":
                out.append({"step": "reset"})
            elif ev["event"] == "batch":
                out.append({"step": "batch", "requests": ev["requests"]})
            elif ev["event"] == "error" and ev.get("requests"):
                out.append({"step": "batch", "requests": ev["requests"]})
        return out


@define
class History:
    """A parsed history: run metadata, capabilities, examples of batches and the memoized baselines."""

    meta: dict[str, Any] = field(factory=dict)
    capabilities: Capabilities | None = None
    examples: list[Example] = field(factory=list)
    baselines: dict[str, Baseline] = field(factory=dict)
    errors: list[str] = field(factory=list)

    @property
    def tolerance(self) -> float:
        return self.capabilities.tolerance if self.capabilities else 0.0

    def batches(self) -> Iterable[BatchRecord]:
        for ex in self.examples:
            yield from ex.batches

    def baseline_for(self, request: Request) -> Baseline | None:
        return self.baselines.get(oracle_key_str(request))

    def only(self, example: Example) -> "History":
        """A view holding one example, for per-example checking."""
        return History(self.meta, self.capabilities, [example], self.baselines, list(example.errors))


def parse(events: Iterable[Mapping[str, Any]]) -> History:
    """Group raw events into a `History`. Events before any `example` event form example 0."""
    h = History()
    current: Example | None = None
    epoch = segment = 0
    config: Mapping[str, Any] = {}
    evictions: int | None = None

    def example() -> Example:
        nonlocal current
        if current is None:
            current = Example(index=len(h.examples))
            h.examples.append(current)
        return current

    for ev in events:
        kind = ev.get("event")
        if kind == "run_start":
            h.meta = dict(ev)
            if ev.get("capabilities"):
                h.capabilities = capabilities_from(ev["capabilities"])
        elif kind == "example":
            current = Example(index=int(ev.get("index", len(h.examples))))
            h.examples.append(current)
            epoch = segment = 0
            config = {}
            evictions = None
        elif kind == "baseline":
            h.baselines[ev["key"]] = baseline_from(ev["baseline"])
        elif kind == "config":
            ex = example()
            ex.events.append(dict(ev))
            config = dict(ev.get("config") or {})
            segment += 1
        elif kind == "reset":
            ex = example()
            ex.events.append(dict(ev))
            epoch += 1
            if (ev.get("snapshot") or {}).get("evictions") is not None:
                evictions = int(ev["snapshot"]["evictions"])
        elif kind == "batch":
            ex = example()
            ex.events.append(dict(ev))
            ex.batches.append(BatchRecord(
                example=ex.index, index=len(ex.batches), epoch=epoch, segment=segment, config=config,
                requests=[request_from(r) for r in ev["requests"]],
                results=[result_from(r) for r in ev["results"]], snapshot=ev.get("snapshot"),
                evictions_before=evictions))
            if (ev.get("snapshot") or {}).get("evictions") is not None:
                evictions = int(ev["snapshot"]["evictions"])
        elif kind == "error":
            ex = example()
            ex.events.append(dict(ev))
            ex.errors.append(str(ev.get("cause", "unknown error")))
            h.errors.append(str(ev.get("cause", "unknown error")))
            if ev.get("snapshot"):
                ex.failed_batches.append(FailedBatch(ex.index, len(ex.batches), config,
                                                     [request_from(r) for r in ev.get("requests") or ()],
                                                     ev["snapshot"]))
    return h


def load(path: str | os.PathLike[str]) -> History:
    return parse(read_events(path))
