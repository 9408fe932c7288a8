"""The OpenAI-compatible HTTP adapter.

Unmarked tests run everywhere (stdlib only): a tiny in-process fake server checks the wire format, the
text-mode fallback, and that timeouts, refused connections, HTTP errors and malformed JSON are
EngineErrors. Tests marked `thirdparty` start a real vLLM OpenAI server (skipped without vLLM).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from adapters.landmarks import shipped_landmarks
from adapters.openai_http import OpenAIHttpAdapter, prometheus_totals
from conformance import validation
from conformance.contract import EngineError, Identity, Request, UsageError


class FakeServer:
    """Answers /v1/models and /v1/completions; `mode` selects a behaviour per test."""

    def __init__(self, mode: str = "ids") -> None:
        self.mode = mode
        self.bodies: list[dict] = []
        self.flushes = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, payload: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "fake-model"}]}).encode())
                elif self.path == "/version":
                    self._send(200, json.dumps({"version": "9.9"}).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self):
                if self.path == "/reset_prefix_cache":  # a flush, as vLLM's dev mode serves it
                    outer.flushes += 1
                    return self._send(404 if outer.mode == "no_flush" else 200, b"{}")
                if self.path != "/v1/completions":
                    return self._send(404, b"{}")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                calls = len(outer.bodies)
                if outer.mode == "malformed" and calls > 1:
                    return self._send(200, b"{not json")
                if outer.mode == "http500" and calls > 1:
                    return self._send(500, b'{"error": "boom"}')
                if outer.mode == "slow" and calls > 1:
                    time.sleep(3)
                choice = {"index": 0, "finish_reason": "length", "text": "ab"}
                usage = {"prompt_tokens": 3, "completion_tokens": 2}
                if outer.mode in ("ids", "malformed", "http500", "slow", "no_flush"):
                    choice.update(token_ids=[7, 8], logprobs={
                        "tokens": ["token_id:7", "token_id:8"],
                        "top_logprobs": [{"token_id:7": -0.1, "token_id:9": -2.0},
                                         {"token_id:8": -0.5, "token_id:3": -0.7}]})
                    usage["prompt_tokens_details"] = {"cached_tokens": 0}
                if outer.mode == "pieces":  # llama-cpp-python style: logprobs keyed by token text
                    choice.update(text="ab\"", logprobs={"tokens": ["ab", "\""], "top_logprobs": [
                        {"ab": -0.1, "a": -2.0}, {"\"": -0.5, "#": -0.7}]})
                if body.get("max_tokens") == 1 and outer.mode == "ids" and body.get("stop_token_ids") == [8]:
                    choice.update(token_ids=[8], finish_reason="stop", stop_reason=8)
                self._send(200, json.dumps({"choices": [choice], "usage": usage}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    servers = []

    def make(mode="ids"):
        s = FakeServer(mode)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def test_token_mode_wire_format_and_results(fake):
    srv = fake("ids")
    a = OpenAIHttpAdapter(base_url=srv.url, salt="true")
    caps = a.capabilities()
    assert caps.reports_cached_tokens and caps.top2_logits and caps.identities == frozenset({"salt"})
    assert a.model == "fake-model" and caps.version == "9.9"
    [r] = a.run([Request("q", (5, 6, 7), 2, identity=Identity(salt="t1"))])
    body = srv.bodies[-1]
    assert body["prompt"] == [5, 6, 7] and body["temperature"] == 0.0 and body["logprobs"] == 2
    assert body["cache_salt"].endswith("t1") and body["return_token_ids"] is True
    assert r.output == (7, 8) and r.finish_reason == "length" and r.cached_tokens == 0
    assert r.top2 == ((7, -0.1, 9, -2.0), (8, -0.5, 3, -0.7))
    assert caps.logprobs_k == 2 and r.logprobs == (((7, -0.1), (9, -2.0)), ((8, -0.5), (3, -0.7)))
    assert caps.timeline == frozenset()  # a server attached by base_url: no abort point is claimed
    # the checkpoint its oracle decodes (the shipped one) brings its landmarks: eos, near-tie, same text,
    # and eos paths lengthened to hit its 32-token blocks (the shipped ones have 24-29 prompt tokens)
    shipped = shipped_landmarks()
    assert caps.landmarks.same_text == shipped.same_text and caps.landmarks.near_ties == shipped.near_ties
    longer = [p for p in caps.landmarks.eos_paths if p not in shipped.eos_paths]
    assert longer and all(len(p.prompt) == 33 and p.prompt[-24:] in {q.prompt[-24:] for q in shipped.eos_paths}
                          for p in longer)
    assert caps.landmarks.eos_paths[:len(longer)] == tuple(longer)
    validation.result(Request("q", (5, 6, 7), 2), r, caps)  # what the runner checks at the boundary


def test_logprobs_add_the_chosen_token_or_are_none_when_unreadable():
    from adapters.openai_http.text import TextChannel

    text = TextChannel(lambda: None, text_mode=False)
    top = [{"token_id:7": -0.1, "token_id:9": -2.0}, {"token_id:3": -0.4, "token_id:4": -0.6}]
    lp = {"top_logprobs": top, "token_logprobs": [-0.1, -0.9]}
    assert text.topk(lp, [7, 8]) == (((7, -0.1), (9, -2.0)), ((3, -0.4), (4, -0.6), (8, -0.9)))
    assert text.topk({"top_logprobs": top}, [7, 8]) is None  # the chosen 8 is nowhere
    assert text.topk({"top_logprobs": top[:1]}, [7, 8]) is None  # a position without logprobs
    assert text.topk({"top_logprobs": [{"piece": -0.1}]}, [7]) is None  # a token it cannot name


def test_stop_token_is_part_of_the_output(fake):
    srv = fake("ids")
    a = OpenAIHttpAdapter(base_url=srv.url)
    [r] = a.run([Request("q", (5, 6), 1, stop_ids=(8,))])
    assert r.output == (8,) and r.finish_reason == "stop"


def test_salt_epoch_reset_gives_a_fresh_namespace(fake):
    srv = fake("ids")
    a = OpenAIHttpAdapter(base_url=srv.url, salt="true")
    assert a.reset_mode == "salt"
    a.run([Request("q", (5,), 1)])
    s1 = srv.bodies[-1]["cache_salt"]
    a.reset()
    a.run([Request("q", (5,), 1)])
    assert srv.bodies[-1]["cache_salt"] != s1


def test_an_attached_server_is_flushed_through_its_endpoint_where_it_serves_one(fake):
    srv = fake("ids")  # FAKE server: reports cached tokens, serves POST /reset_prefix_cache
    a = OpenAIHttpAdapter(base_url=srv.url)
    assert a.reset_mode == "endpoint" and a.capabilities().reports_cached_tokens
    before = srv.flushes
    a.reset()
    assert srv.flushes == before + 1


def test_an_attached_server_that_reports_cached_tokens_but_cannot_be_flushed_is_refused(fake):
    """Its reset() would flush nothing, and a correct server would fail `isolation` for a prefix it cached
    before a reset (as `kvparity serve` attached by base_url= did). With salts, each reset starts a fresh one."""
    srv = fake("no_flush")
    with pytest.raises(UsageError, match="cannot flush them between examples.*VLLM_SERVER_DEV_MODE=1.*salt=true"):
        OpenAIHttpAdapter(base_url=srv.url)
    with pytest.raises(UsageError, match="cannot flush"):
        OpenAIHttpAdapter(base_url=srv.url, reset="none")
    assert OpenAIHttpAdapter(base_url=srv.url, salt="true").reset_mode == "salt"


def test_salt_namespaces_are_never_shared_by_two_adapters_on_one_server(fake):
    """A server outlives a run: a rerun (or a second shard on the same replica) counting its salt epochs from
    0 again met the first run's KV under the same salts, and a correct vLLM server failed `isolation`."""
    srv = fake("ids")
    first, second = (OpenAIHttpAdapter(base_url=srv.url, salt="true") for _ in range(2))
    salts = []
    for a in (first, second):
        a.run([Request("q", (5,), 1)])
        salts.append(srv.bodies[-1]["cache_salt"])
    assert salts[0] != salts[1]


def test_a_salt_goes_on_the_wire_as_a_server_takes_it_and_stays_distinct(fake):
    """vLLM's server answers HTTP 400 to a cache_salt holding '@', '/', '\\' or NUL, and the streams draw salts
    from the whole of Unicode (a campaign shard errored on one). Escaped, and one-to-one: "a/b" and "a%2Fb"
    stay two salts."""
    srv = fake("ids")
    a = OpenAIHttpAdapter(base_url=srv.url, salt="true", reset="endpoint")
    sent = []
    for salt in ("a/b", "a%2Fb", "x@y\\z\0", "tenant-é"):
        a.run([Request("q", (5,), 1, identity=Identity(salt=salt))])
        sent.append(srv.bodies[-1]["cache_salt"])
    assert not any(c in s for s in sent for c in "@/\\\0"), sent
    assert len(set(sent)) == 4 and sent[3] == "tenant-é"


def test_text_mode_without_cached_tokens(fake):
    srv = fake("text")
    a = OpenAIHttpAdapter(base_url=srv.url, prompt_mode="text")
    caps = a.capabilities()
    assert not caps.reports_cached_tokens and not caps.identities
    [r] = a.run([Request("q", (70, 71, 72), 2)])
    assert isinstance(srv.bodies[-1]["prompt"], str)
    assert r.cached_tokens is None and r.extra.get("output_from_text") is True
    assert r.output == tuple(a.text.tokenizer().encode("ab", add_special_tokens=False).ids)


@pytest.mark.parametrize("mode,match", [("malformed", "malformed JSON"), ("http500", "HTTP 500"),
                                        ("slow", "timed out")])
def test_bad_answers_are_engine_errors(fake, mode, match):
    srv = fake(mode)
    a = OpenAIHttpAdapter(base_url=srv.url, timeout="1")
    with pytest.raises(EngineError, match=match):
        a.run([Request("q", (5, 6), 2)])


def test_refused_connection_is_an_engine_error():
    from adapters.openai_http import free_port

    with pytest.raises(EngineError, match="cannot reach|connection"):
        OpenAIHttpAdapter(base_url=f"http://127.0.0.1:{free_port()}", timeout="2")


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError):
        OpenAIHttpAdapter()
    with pytest.raises(UsageError):
        OpenAIHttpAdapter(base_url="http://127.0.0.1:1", prompt_mode="bytes")


def test_prometheus_parsing():
    text = ('# HELP x y\nvllm:spec_decode_num_draft_tokens_total{engine="0"} 24.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="1"} 6\n')
    assert prometheus_totals(text)["vllm:spec_decode_num_draft_tokens_total"] == 30.0


# --------------------------------------------------------------------------- real vLLM server

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def served():
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install 'kvparity[vllm]')")
    # LoRA off: base + LoRA requests in one batch trip a real vLLM-CPU bug (reports/vllm, finding 1)
    a = OpenAIHttpAdapter(serve="vllm", lora="false")
    yield a
    a.close()


@pytest.mark.thirdparty
def test_vllm_server_parity_salt_and_reset(served):
    p = tuple(range(10, 80))
    served.reset()
    r1, r2 = served.run([Request("a", p, 8), Request("b", p, 8, identity=Identity(salt="tenant-b"))])
    [r3] = served.run([Request("c", p, 8)])
    [r4] = served.run([Request("d", p, 8, identity=Identity(salt="tenant-a"))])
    base = served.baseline(Request("a", p, 8))
    assert r1.output == r2.output == r3.output == r4.output == base.output
    assert r3.cached_tokens == 64  # 70-token prompt, block 32: two full blocks
    assert r4.cached_tokens == 0  # another salt never sees them
    served.reset()
    [r5] = served.run([Request("e", p, 8)])
    assert r5.cached_tokens == 0


@pytest.mark.thirdparty
def test_vllm_server_short_suite_run(served, tmp_path):
    from conformance.runner import run_suite
    from conformance.run_config import RunConfig

    out = run_suite(served, RunConfig(engine_name="openai_http", profile="dev", report_dir=tmp_path, seed=3,
                                      max_examples=3, database_dir=tmp_path))
    assert out.verdict in ("pass", "inconclusive"), out.analysis.checks


# --------------------------------------------------------------------------- text mode: the tokens the server receives


def test_text_mode_baseline_uses_the_effective_prompt(fake):
    """A prompt that does not survive decode -> encode is judged on the ids the server actually gets."""
    from reference_engine import checkpoints
    from reference_engine.baseline import greedy

    srv = fake("text")  # a fake OpenAI server: text completions only, no ids, no cached tokens
    a = OpenAIHttpAdapter(base_url=srv.url, prompt_mode="text")
    assert not a._ids_from_server
    raw = (4,) * 32  # 32 single `"` tokens: the tokenizer merges them when it re-encodes the text
    eff = a.text.effective_prompt(raw)
    tok = a.text.tokenizer()
    assert eff == tuple(tok.encode(tok.decode(list(raw), skip_special_tokens=False), add_special_tokens=False).ids)
    assert eff != raw and len(eff) < len(raw)
    stable = (70, 71, 72)
    assert a.text.effective_prompt(stable) == stable or a.text.effective_prompt(stable) == a.text.roundtrip(stable)

    q = Request("q", raw, 3)
    g = greedy(checkpoints.load_target("a", None), eff, 3, (), 2)
    b = a.baseline(q)
    assert b.output == a.text.through_text(type(b)(g.output, g.finish_reason, g.margins, g.runner_up)).output

    [r] = a.run([q])
    assert srv.bodies[-1]["prompt"] == tok.decode(list(raw), skip_special_tokens=False)
    assert r.extra["prompt_roundtrip_exact"] is False and tuple(r.extra["effective_prompt"]) == eff
    assert r.extra["effective_prompt_tokens"] == len(eff) and r.extra["prompt_tokens"] == 32
    [r2] = a.run([Request("s", a.text.roundtrip(stable), 2)])
    assert r2.extra["prompt_roundtrip_exact"] is True and "effective_prompt" not in r2.extra


def test_token_mode_baseline_is_unchanged(fake):
    srv = fake("ids")
    a = OpenAIHttpAdapter(base_url=srv.url)
    assert a._ids_from_server and a.text.effective_prompt((4,) * 32) == (4,) * 32


def test_text_channel_normalises_the_baseline_output(fake):
    """Output ids re-encoded from text are compared with the baseline output passed through the same channel."""
    from conformance.contract import Baseline

    srv = fake("text")
    a = OpenAIHttpAdapter(base_url=srv.url, prompt_mode="text")
    same = Baseline((70, 71, 2), "eos", (0.5, 0.4, 0.3), (9, 9, 9))
    if a.text.roundtrip((70, 71)) == (70, 71):
        assert a.text.through_text(same) == same
    b = a.text.through_text(Baseline((5, 4, 4, 4, 4), "length", (0.9, 0.8, 0.02, 0.7, 0.6), (1, 1, 1, 1, 1)))
    rt = a.text.roundtrip((5, 4, 4, 4, 4))
    assert b.output == rt and len(b.margins) == len(rt)
    k = next(i for i, (x, y) in enumerate(zip((5, 4, 4, 4, 4), rt)) if x != y)
    m = (0.9, 0.8, 0.02, 0.7, 0.6)
    assert b.margins[:k] == m[:k] and all(x == min(m[k:]) for x in b.margins[k:])  # conservative floor
    assert b.runner_up == (1,) * k


def test_text_mode_stops_client_side_and_sends_neutral_sampling(fake):
    srv = fake("text")
    a = OpenAIHttpAdapter(base_url=srv.url, prompt_mode="text", extra_body='{"repeat_penalty": 1.0}')
    first = a.text.tokenizer().encode("ab", add_special_tokens=False).ids[0]
    [r] = a.run([Request("q", (70, 71), 2, stop_ids=(first,))])
    body = srv.bodies[-1]
    assert "stop_token_ids" not in body and body["repeat_penalty"] == 1.0  # extra_body merged
    assert r.output == (first,) and r.finish_reason == "stop" and r.extra["client_side_stop"]
    # serve=llama_cpp sends llama-cpp-python's sampling-neutral fields (its server defaults repeat_penalty=1.1)
    a.serve = "llama_cpp"  # no real server here: only the request body is inspected
    body = a._body((70, 71), 4, (), None)
    assert body["repeat_penalty"] == 1.0 and body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    assert body["mirostat_mode"] == 0 and body["temperature"] == 0.0 and isinstance(body["prompt"], str)
    with pytest.raises(UsageError):
        OpenAIHttpAdapter(base_url=srv.url, extra_body="not json")


def test_text_mode_output_ids_from_logprob_pieces(fake):
    """Servers that key logprobs by token text (llama-cpp-python) still give exact output ids and top-2."""
    srv = fake("pieces")  # a fake server answering like llama_cpp.server
    a = OpenAIHttpAdapter(base_url=srv.url, prompt_mode="text")
    assert a._ids_from_server
    tok = a.text.tokenizer()
    ab, a_, q_, h_ = (tok.token_to_id(t) for t in ("ab", "a", '"', "#"))
    [r] = a.run([Request("q", (70, 71), 2)])
    assert r.output == (ab, q_) and r.extra["output_from_pieces"] and "output_from_text" not in r.extra
    assert r.top2 == ((ab, -0.1, a_, -2.0), (q_, -0.5, h_, -0.7))
    # the baseline is not passed through the text channel when ids are exact
    assert a._ids_from_server and a.baseline(Request("x", (4,) * 32, 2)).output == a.baseline(
        Request("y", a.text.effective_prompt((4,) * 32), 2)).output


def test_kvparity_serve_logprobs_reach_the_contract_and_match_plain_decoding():
    """A real `kvparity serve` on 127.0.0.1, asked for logprobs: each output position's top-2 passes the
    contract's boundary and equals the float64 oracle's to float32 precision (logprob_parity's inputs)."""
    pytest.importorskip("aiohttp", reason="kvparity serve needs the serve extra (aiohttp)")
    from conformance.checks.logprobs import deviation

    a = OpenAIHttpAdapter(serve="kvparity", stagger_ms="0", logprobs="true")
    try:
        caps = validation.capabilities(a.capabilities())
        q = Request("q", tuple(range(10, 30)), 6)
        [r] = a.run([q])
        validation.result(q, r, caps)
        assert caps.logprobs_k == 2 and r.logprobs is not None and len(r.logprobs) == len(r.output)
        dev = deviation(a.baseline(q), r)
        assert dev is not None and dev.compared >= len(r.output) and dev.value < 1e-4
    finally:
        a.close()
