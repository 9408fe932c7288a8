"""Aborts over HTTP (issue 30): `kvparity serve` streams a completion as server-sent events, a chunk per
engine step, and a client that closes the stream aborts the request in the engine; the HTTP adapter
honours a request's abort point that way, and paces a request's arrival point by the tokens streamed back
(`Capabilities.timeline` = {"abort", "arrival_paced"} with serve=kvparity), the server saying where each
request really arrived. Real server on 127.0.0.1, real reference engine behind it."""

from __future__ import annotations

import pytest

pytest.importorskip("aiohttp", reason="kvparity serve needs the serve extra (aiohttp)")

import attrs  # noqa: E402

from adapters.openai_http import OpenAIHttpAdapter  # noqa: E402
from conformance import validation  # noqa: E402
from conformance.contract import Request  # noqa: E402

PROMPT = tuple(range(10, 80))  # 70 tokens: two full 32-token blocks


@pytest.fixture(scope="module")
def served():
    a = OpenAIHttpAdapter(serve="kvparity", stagger_ms="0")
    yield a
    a.close()


def test_a_streamed_answer_equals_the_whole_one(served):
    body = served._body(PROMPT, 8, (), None)
    whole = served.http.call("POST", "/v1/completions", body)
    events = list(served.http.stream("/v1/completions", {**body, "stream": True}))
    tokens = [t for e in events for t in e["choices"][0].get("token_ids", [])]
    assert tokens == whole["choices"][0]["token_ids"] and len(events) >= 2  # a chunk per step, then the finish
    assert events[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert events[-1]["usage"]["completion_tokens"] == 8 and all(e["choices"][0]["finish_reason"] is None
                                                                  for e in events[:-1])


def test_closing_the_stream_aborts_the_request_and_the_adapter_reports_it(served):
    caps = validation.capabilities(served.capabilities())
    assert caps.timeline == frozenset({"abort", "arrival_paced"})
    served.reset()
    cut = Request("cut", PROMPT, 12, abort_after=3)
    late = Request("late", PROMPT[:40], 2, abort_after=5)  # finishes before its abort point
    gone = Request("gone", PROMPT[:50], 12, abort_after=0)  # the client leaves before any token
    r_cut, r_late, r_gone = served.run([cut, late, gone])
    assert r_gone.finish_reason == "abort" and r_gone.output == ()
    for q, r in ((cut, r_cut), (late, r_late), (gone, r_gone)):
        validation.result(q, r, caps)
        plain = served.baseline(attrs.evolve(q, abort_after=None)).output
        assert tuple(r.output) == tuple(plain[:len(r.output)])
    assert r_cut.finish_reason == "abort" and 3 <= len(r_cut.output) < 12
    assert r_late.finish_reason == "length" and len(r_late.output) == 2
    # the engine stopped: the server's next request runs, and the aborted prompt's committed blocks serve it
    [again] = served.run([Request("again", PROMPT, 12)])
    assert again.output == served.baseline(Request("again", PROMPT, 12)).output and again.cached_tokens == 64


def test_arrivals_are_paced_by_the_tokens_streamed_back_and_recorded_where_the_server_admitted_them(served):
    caps = validation.capabilities(served.capabilities())
    served.reset()
    lead = Request("lead", PROMPT, 800)  # long enough (steps of ~1 ms) that a loaded client's send lands inside it
    late = Request("late", PROMPT[:66], 6, arrive_at_step=4)  # shares the leader's two full blocks
    last = Request("last", PROMPT[:40], 3, arrive_at_step=1000)  # past every request's end: sent once none runs
    results = served.run([lead, late, last])
    for q, r in zip((lead, late, last), results):
        validation.result(q, r, caps)
        assert r.output == served.baseline(q).output and r.finish_reason != "abort", q.id
        assert r.arrived_at_step is not None and r.ended_at_step >= r.arrived_at_step, q.id
    r_lead, r_late, r_last = results
    assert r_lead.arrived_at_step == 0 and r_late.arrived_at_step >= 4  # never before the leader's 4th token
    assert r_last.arrived_at_step >= max(r_lead.ended_at_step, r_late.ended_at_step)
    assert r_late.arrived_at_step < r_lead.ended_at_step and r_late.cached_tokens == 64  # inside the leader's run


def test_a_batch_without_arrival_points_is_sent_as_before(served):
    [r] = served.run([Request("plain", PROMPT, 4)])
    assert r.arrived_at_step is None and "server_admitted_at_step" in r.extra  # the server says; nobody asked
