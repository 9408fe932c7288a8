"""The continuous-batching loop: one reference engine, one thread, requests joining at every step.

Why a thread and `Engine.step`, not `Engine.generate` per HTTP request: `generate` runs one batch to
completion, so requests arriving while it runs would wait for the whole batch — a server that batches
only what arrived at the same instant. Iteration-level scheduling (Orca, vLLM) is what real servers do:
between two steps the loop takes everything that arrived meanwhile and `add_request`s it, so a request
that arrives while others decode is admitted into the very next step and runs *inside* their batch —
the overlap that batching and scheduling bugs need. When nothing is running the loop blocks on its inbox
(no polling, no delay).

Every engine call happens on this thread, so the engine needs no locks; HTTP handlers only `submit` and
wait for a callback. A streamed request also gets its output so far after every step (`progress`), and
`abort` stops a request between two steps (a streaming client that closed its connection), as real
servers do: what it committed stays, what it held goes back. A request the engine refuses (a named input error) is answered alone; a step that
raises aborts every in-flight request (the engine releases their blocks) and each of them is answered with
the error, so a crash is an HTTP 500, never a hang. `flush` (the cache-reset endpoint) runs between steps.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Callable

from reference_engine.engine import Engine
from reference_engine.errors import PoolExhaustedError, ReferenceEngineError
from reference_engine.sequence import Identity, Report

TIMELINE_KEPT = 4096  # requests whose admission and end steps wait for their answer
Done = Callable[[object], None]  # called once with a Report, or with the exception that ended the request
Progress = Callable[[tuple[int, ...]], None]  # a streamed request's output so far, after each step


class RequestRefused(Exception):
    """The engine refused this request (bad input): an HTTP 400, with the engine's message."""


class EngineFailed(Exception):
    """A step raised: every request in flight ends with this (an HTTP 500)."""


class EngineLoop:
    """Owns one engine on one thread; `submit` and `flush` are safe to call from any thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._inbox: deque[tuple] = deque()
        self._wake = threading.Condition()
        self._waiting: dict[str, Done] = {}
        self._progress: dict[str, Progress] = {}
        self._closed = False
        self.steps = 0  # engine steps run: how many times a batch was formed
        self.largest_batch = 0  # most requests live together in one step
        # (steps run when it was admitted, steps run when it ended) per request, for its answer: where it
        # really arrived and ended, which a client that paces its arrivals cannot know (issue 30)
        # (the oldest dropped past TIMELINE_KEPT: a stream its client closed is never answered)
        self.timeline: OrderedDict[str, tuple[int, int | None]] = OrderedDict()
        self._thread = threading.Thread(target=self._run, name="kvparity-serve-engine", daemon=True)
        self._thread.start()

    # -- any thread ---------------------------------------------------------------------------------
    def submit(self, request_id: str, prompt: tuple[int, ...], max_tokens: int, stop_ids: tuple[int, ...],
               identity: Identity, done: Done, progress: Progress | None = None) -> None:
        self._post(("request", request_id, prompt, max_tokens, stop_ids, identity, done, progress))

    def abort(self, request_id: str) -> None:
        """Stop the request between two steps (its `done` gets the aborted report); gone already: nothing."""
        self._post(("abort", request_id))

    def flush(self, done: Done) -> None:
        """Forget every reusable KV (between two steps); `done(None)` once it is done."""
        self._post(("flush", done))

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _post(self, item: tuple) -> None:
        with self._wake:
            if self._closed:
                raise EngineFailed("the server is shutting down")
            self._inbox.append(item)
            self._wake.notify()

    # -- the engine thread --------------------------------------------------------------------------
    def _take(self) -> list[tuple]:
        """Everything that arrived; blocks only while the engine has nothing to run."""
        with self._wake:
            while not self._inbox and not self._closed and not self.engine.has_unfinished():
                self._wake.wait()
            items = list(self._inbox)
            self._inbox.clear()
            return items

    def _run(self) -> None:
        while not self._closed:
            for item in self._take():
                self._admit(item)
            if not self.engine.has_unfinished():
                continue
            try:
                self.largest_batch = max(self.largest_batch, len(self.engine.live))
                reports = self.engine.step()
                self.steps += 1
            except Exception as exc:  # noqa: BLE001 - the engine aborted everything in flight; answer each
                failed, self._waiting, self._progress = self._waiting, {}, {}
                for done in failed.values():
                    done(EngineFailed(f"engine step failed: {type(exc).__name__}: {exc}"))
                continue
            for report in reports:
                self._answer(report)
            for request_id, progress in self._progress.items():
                seq = self.engine.live.get(request_id)
                if seq is not None:
                    progress(tuple(seq.output))
        for done in self._waiting.values():
            done(EngineFailed("the server shut down"))

    def _admit(self, item: tuple) -> None:
        if item[0] == "flush":
            self.engine.flush()
            item[1](None)
            return
        if item[0] == "abort":
            report = self.engine.abort(item[1])
            if report is not None:
                self._answer(report)
            return
        _, request_id, prompt, max_tokens, stop_ids, identity, done, progress = item
        try:
            self.engine.add_request(request_id, prompt, max_tokens, stop_ids, identity)
        except (ReferenceEngineError, PoolExhaustedError) as exc:
            done(RequestRefused(f"{type(exc).__name__}: {exc}"))
            return
        self._waiting[request_id] = done
        self.timeline[request_id] = (self.steps, None)
        while len(self.timeline) > TIMELINE_KEPT:
            self.timeline.popitem(last=False)
        if progress is not None:
            self._progress[request_id] = progress

    def _answer(self, report: Report) -> None:
        self._progress.pop(report.request_id, None)
        if report.request_id in self.timeline:
            self.timeline[report.request_id] = (self.timeline[report.request_id][0], self.steps)
        done = self._waiting.pop(report.request_id, None)
        if done is not None:
            done(report)
