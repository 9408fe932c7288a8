"""Hostile peers: a server that drips its answer, a witness whose strings are code, a client that asks for
what `kvparity serve` cannot honour (issue 26, parts 7-9 and serve's part of 6).

- `kvparity audit-timing` against a real loopback server (a thread of this test) that answers one byte
  at a time: each request ends at its wall-clock deadline (`--timeout`, or the end of `--max-seconds`),
  with one line and exit 3, however slowly the bytes come; a level the time bound ends is not judged on
  its partial sample.
- `kvparity export` of witnesses whose salt, title, case id, request id, check and file name hold `\"\"\"`,
  `'''`, backslashes, newlines, NUL, U+2028 and `# -*- coding` lines: the reproducer compiles, carries
  each string exactly in its plan, shows it escaped in its docstring, and running it executes none of it
  (the payloads would write a marker file).
- `kvparity serve` (a real server on 127.0.0.1, as tests/test_serve.py starts it): a 400 with OpenAI-style
  JSON for every parameter it cannot honour and for hostile JSON (nested 100,000 deep, not an object),
  a JSON 413 past the body cap, and the neutral values of the same parameters still answered.
"""

from __future__ import annotations

import ast
import http.client
import json
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WITNESS = REPO / "reports" / "fault-zoo" / "witnesses" / "salt_ignored.json"


# --------------------------------------------------------------------------- audit-timing vs a slow drip


class DripServer:
    """A real HTTP server on 127.0.0.1 that answers GET /v1/models at once and drips what `mode` says one
    byte every `gap` seconds: "body" (headers at once, then 60 body bytes), "headers" (the status line and
    headers themselves), "models" (GET /v1/models dripped too). Bounded: a whole drip takes 6-8 s."""

    def __init__(self, mode: str, gap: float = 0.1) -> None:
        outer = self
        self.mode, self.gap = mode, gap

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _drip(self, data: bytes) -> None:
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(outer.gap)

            def _answer(self, payload: bytes, drip_headers: bool, drip_body: bool) -> None:
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(payload)}\r\n\r\n").encode()
                try:
                    (self._drip if drip_headers else self.wfile.write)(head)
                    (self._drip if drip_body else self.wfile.write)(payload)
                except OSError:  # the client cut us off: what the tests want
                    self.close_connection = True

            def do_GET(self):
                self._answer(json.dumps({"data": [{"id": "m"}]}).encode(), outer.mode == "models", False)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(b" " * 60, outer.mode == "headers", outer.mode == "body")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _audit(url: str, tmp_path, *args: str) -> tuple[int, float]:
    pytest.importorskip("scipy", reason="the audit's KS test needs scipy (serve extra)")
    from kvparity.commands.audit_timing import main

    t0 = time.monotonic()
    code = main(["--base-url", url, "--out", str(tmp_path / "audit"), "--letters", "20", "--max-probes", "10",
                 "--levels", "same-user,cross-tenant", *args])
    return code, time.monotonic() - t0


@pytest.mark.parametrize("mode", ["body", "headers", "models"])
def test_audit_timing_cuts_a_dripping_answer_at_its_timeout(mode, tmp_path, capsys):
    server = DripServer(mode)
    try:
        code, wall = _audit(server.url, tmp_path, "--timeout", "1.5", "--max-seconds", "60")
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and wall < 4, (code, wall)  # the drip takes 6 s or more: a socket timeout never fires
    assert len(err) == 1 and err[0].startswith("kvparity audit-timing: error: ") and "--timeout 1.5s" in err[0]
    assert not (tmp_path / "audit" / "results.json").exists()  # no verdict from what was measured before


def test_audit_timing_max_seconds_is_a_hard_cap_on_the_whole_run(tmp_path, capsys):
    server = DripServer("body")
    try:
        code, wall = _audit(server.url, tmp_path, "--timeout", "30", "--max-seconds", "2")
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and wall < 4, (code, wall)
    assert len(err) == 1 and "--max-seconds 2" in err[0], err


class FakeCachingClient:
    """A fake of the audit's client (named as such): an answer is fast when its prompt's first letters
    were sent before (a perfect prompt cache), and the clock jumps past the deadline after `stall_after`
    requests, as a slow server would make it."""

    def __init__(self, stall_after: int, stall_s: float) -> None:
        self.seen: set[str] = set()
        self.calls, self.stall_after, self.stall_s = 0, stall_after, stall_s

    def complete(self, prompt: str, party) -> float:
        self.calls += 1
        if self.calls == self.stall_after:
            time.sleep(self.stall_s)
        hit = prompt[:20] in self.seen
        self.seen.add(prompt[:20])
        return 0.001 if hit else 0.010


def test_a_level_the_time_bound_ends_is_never_judged_on_its_partial_sample():
    """Fixed-sample mode plans one test at the probe budget; a level cut by the time bound after 60
    perfectly separated probes (p far below 1e-8) stays inconclusive, never "sharing detected"."""
    pytest.importorskip("scipy")
    from kvparity.commands.audit_timing import decide
    from kvparity.commands.audit_timing.decision import Plan
    from kvparity.commands.audit_timing.procedure import Party, Procedure, run_level

    client = FakeCachingClient(stall_after=120, stall_s=0.6)  # 2 requests a probe: the stall after 60 probes
    victim, attacker = Party("org-v", "user-v"), Party("org-a", "user-a")
    result = run_level("cross-tenant", Plan(1000, False, 50), Procedure(40, 1.0, 1), client, random.Random(0),
                       victim, attacker, time.monotonic() + 0.5)
    assert result.stopped == "time" and 50 <= result.probes < 1000
    assert result.final.pvalue < 1e-8  # the partial sample is shown ...
    assert not result.detected and result.verdict.startswith("inconclusive")  # ... and not a verdict
    assert decide([result])[0] == 2


# --------------------------------------------------------------------------- export of hostile witnesses

PAYLOADS = [
    '"""\nimport pathlib; pathlib.Path(MARKER).write_text("pwned")\n"""',
    "'''\nimport pathlib; pathlib.Path(MARKER).write_text('pwned')\n'''",
    'tail\\"""\\\\',
    "x\n# -*- coding: utf-16 -*-\nimport pathlib; pathlib.Path(MARKER).write_text('pwned')",
    "nul\x00byte",
    "line\u2028separator\u2029para\r\x0c\x1b[2J",
]


def _hostile_witness(tmp_path: Path, i: int, payload: str) -> Path:
    data = json.loads(WITNESS.read_text())
    request = data["steps"][1]["requests"][0]
    request["identity"]["salt"] = payload
    request["id"] = payload
    data["check"] = payload if i % 2 else "isolation"
    data["failure"] = {"title": payload, "case_id": payload}
    path = tmp_path / f"w{i}\"\"\"'''.json"  # a file name is witness text too
    path.write_text(json.dumps(data))
    return path


def _plan(source: str) -> dict:
    tree = ast.parse(source)
    (call,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PLAN"]
    return json.loads(call.args[0].value)


@pytest.mark.parametrize("i", range(len(PAYLOADS)))
def test_export_writes_witness_text_as_data_only(i, tmp_path):
    from kvparity.commands import export as exporting
    from kvparity.commands.export.quoting import shown

    marker = tmp_path / "PWNED"
    payload = PAYLOADS[i].replace("MARKER", repr(str(marker)))
    out = exporting.export(_hostile_witness(tmp_path, i, payload), tmp_path / "repro.py")
    source = out.read_text()
    tree = ast.parse(source)  # compiles: no string ended early, no NUL in the file
    assert "\x00" not in source and "\u2028" not in source
    doc = ast.get_docstring(tree, clean=False)
    assert shown(payload) in doc and "\n# -*-" not in doc  # shown escaped, on its own line never
    plan = _plan(source)
    request = plan["steps"][1]["requests"][0]
    assert request["id"] == request["identity"]["salt"] == plan["witness"]["title"] == payload  # exact data
    help_run = subprocess.run([sys.executable, str(out), "--help"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert help_run.returncode == 0, help_run.stderr[-2000:]
    assert not marker.exists()


def test_a_hostile_reproducer_still_reproduces_and_runs_nothing_it_carries(tmp_path):
    """Run to its verdict: the fault (salt ignored) is still found with a salt that is a payload."""
    from kvparity.commands import export as exporting

    marker = tmp_path / "PWNED"
    out = exporting.export(_hostile_witness(tmp_path, 0, PAYLOADS[0].replace("MARKER", repr(str(marker)))),
                           tmp_path / "repro.py")
    run = subprocess.run([sys.executable, str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert not marker.exists()


def test_export_refuses_a_hostile_adapter_name_in_one_line(tmp_path, capsys):
    from kvparity.commands import export as exporting

    data = json.loads(WITNESS.read_text())
    data["steps"][1]["requests"][0]["identity"]["adapter"] = PAYLOADS[0].replace("MARKER", "'x'")
    witness = tmp_path / "w.json"
    witness.write_text(json.dumps(data))
    assert exporting.main([str(witness), "--out", str(tmp_path / "x.py")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvparity export: error: ") and not (tmp_path / "x.py").exists()


# --------------------------------------------------------------------------- kvparity serve


@pytest.fixture(scope="module")
def served():
    pytest.importorskip("aiohttp", reason="kvparity serve needs the serve extra (aiohttp)")
    from adapters.openai_http import OpenAIHttpAdapter

    a = OpenAIHttpAdapter(serve="kvparity", stagger_ms="0")
    yield a
    a.close()


def send(adapter, body: bytes, method: str = "POST") -> tuple[int, dict]:
    """A raw request (the body as given, not re-encoded): status and the JSON answer."""
    host, port = adapter.http.base.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def post(adapter, **fields) -> tuple[int, dict]:
    return send(adapter, json.dumps({"prompt": [5, 6, 7], "max_tokens": 3, **fields}).encode())


def _is_error(status: int, data: dict, code: int) -> bool:
    return status == code and data["error"]["code"] == code and data["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("fields, words", [
    ({"echo": True}, "echo"),
    ({"top_p": 0.5}, "top_p"),
    ({"presence_penalty": 1.5}, "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"best_of": 2}, "best_of"),
    ({"logit_bias": {"5": 100}}, "logit_bias"),
    ({"skip_special_tokens": True}, "skip_special_tokens"),
    ({"n": True}, "n must be 1"),
    ({"logprobs": 50}, "logprobs"),
    ({"stop_token_ids": [10 ** 9]}, "vocabulary"),
    ({"stop_token_ids": [-1]}, "vocabulary"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"seed": "lucky"}, "seed"),
    ({"frobnicate": 1}, "unknown parameter 'frobnicate'"),
    ({"model": ["kvparity"]}, "model must be a string"),
    ({"return_token_ids": "yes"}, "return_token_ids"),
])
def test_serve_refuses_what_it_cannot_honour(served, fields, words):
    status, data = post(served, **fields)
    assert _is_error(status, data, 400) and words in data["error"]["message"], (status, data)


def test_serve_answers_the_neutral_values_as_a_plain_request(served):
    status, plain = post(served, return_token_ids=True)
    assert status == 200
    neutral = {"echo": False, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "seed": 3, "n": 1,
               "best_of": 1, "stop": [], "logit_bias": {}, "temperature": 0.0, "top_k": -1, "stream": False,
               "skip_special_tokens": False, "suffix": None, "logprobs": 20}
    status, data = post(served, return_token_ids=True, return_tokens_as_token_ids=True, **neutral)
    assert status == 200, data
    assert data["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert all(len(top) == 20 for top in data["choices"][0]["logprobs"]["top_logprobs"])


def test_serve_logprobs_zero_gives_each_chosen_tokens_logprob(served):
    status, data = post(served, logprobs=0, return_token_ids=True)
    assert status == 200
    lp = data["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(data["choices"][0]["token_ids"]) == 3
    assert all(top == {} for top in lp["top_logprobs"])


@pytest.mark.parametrize("body, code", [
    (b'{"prompt":' + b"[" * 100_000 + b"]" * 100_000 + b', "max_tokens": 2}', 400),
    (b"[" * 100_000, 400),
    (b"[1, 2, 3]", 400),
    (b"null", 400),
    (b'"a string"', 400),
    (b'{"prompt": [5], "max_tokens": 2}' + b" " * (5 * 1024 * 1024), 413),
])
def test_serve_answers_hostile_json_with_a_json_4xx(served, body, code):
    status, data = send(served, body)
    assert _is_error(status, data, code), (status, data)
    assert post(served)[0] == 200  # and goes on serving


def test_serve_answers_a_wrong_method_with_json(served):
    status, data = send(served, b"", method="GET")
    assert _is_error(status, data, 405)
