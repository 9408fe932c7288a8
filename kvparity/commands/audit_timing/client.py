"""The audit's HTTP client and its clock: one keep-alive connection, every request bounded by a deadline.

Why a deadline on the whole request and not only the socket timeout: a socket timeout bounds the silence
*between* two bytes, so a server that answers one byte a second never trips a 5 s timeout and holds the
audit for as long as it likes (measured on 1621583: still running at 200 s with `--timeout 5
--max-seconds 60`). Here each request gets a wall-clock deadline, the earlier of `--timeout` from its
start and the run's end (`--max-seconds` from the audit's start), and a watchdog shuts the socket down
when it passes, whatever the server is doing: sending headers, dripping a body, or nothing. A request cut
off is an `EngineError` naming the bound that cut it (the audit then exits 3: a measurement it could not
finish is no evidence either way).

The clock: client-side wall time from sending the request to the whole answer, over one keep-alive
connection so no connection set-up enters the measurement. The watchdog is armed before the clock starts
and disarmed after it stops, so its cost is not timed.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from conformance.contract import EngineError


class Client:
    """GET and POST /v1/completions over one keep-alive connection; every failure is an EngineError."""

    def __init__(self, base_url: str, model: str | None, timeout: float, run_deadline: float | None = None,
                 max_seconds: float | None = None) -> None:
        u = urllib.parse.urlsplit(base_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
        self.https, self.prefix = u.scheme == "https", u.path.rstrip("/")
        self.model, self.timeout = model, timeout
        self.run_deadline, self.max_seconds = run_deadline, max_seconds  # time.monotonic() clock
        self.conn: http.client.HTTPConnection | None = None
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.unreported = 0  # answers without usage counts

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=timeout)
        elif self.conn.sock is not None:
            self.conn.sock.settimeout(timeout)
        else:
            self.conn.timeout = timeout
        return self.conn

    def _limit(self, timeout: float) -> tuple[float, str]:
        """(monotonic deadline, the bound that sets it) for a request starting now."""
        now = time.monotonic()
        own = (now + timeout, f"no whole answer within --timeout {timeout:g}s (a deadline on the whole request, "
                              f"not only on silence between bytes)")
        if self.run_deadline is not None and self.run_deadline < own[0]:
            return self.run_deadline, (f"the audit's time bound (--max-seconds {self.max_seconds:g}) ran out "
                                       f"during a request")
        return own

    def exchange(self, method: str, path: str, body: bytes | None = None,
                 timeout: float | None = None) -> tuple[int, bytes, float]:
        """(status, payload, seconds from sending to the whole answer) of one request, within its deadline."""
        deadline, bound = self._limit(self.timeout if timeout is None else timeout)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (0, 1):  # one reconnect: a keep-alive connection the server closed while idle
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise EngineError(f"{method} {path}: {bound}")
            conn = self._connect(left)
            if conn.sock is None:
                try:  # connect outside the clock and before the watchdog, which needs the socket to cut
                    conn.connect()
                except OSError as exc:
                    self.close()
                    raise EngineError(f"cannot connect to {self.host}:{self.port}: {type(exc).__name__}: {exc}") \
                        from exc
                left = deadline - time.monotonic()
            cut = threading.Event()
            watchdog = threading.Timer(left, self._cut, (conn, cut))
            watchdog.daemon = True
            watchdog.start()
            try:
                t0 = time.perf_counter()
                conn.request(method, self.prefix + path, body, headers)
                resp = conn.getresponse()
                payload = resp.read()
                elapsed = time.perf_counter() - t0
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if cut.is_set() or isinstance(exc, (TimeoutError, socket.timeout)):
                    raise EngineError(f"{method} {path}: {bound}") from exc
                if attempt or not isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError,
                                                   ConnectionResetError)):
                    raise EngineError(f"{method} {path} to {self.host}:{self.port} failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
                continue
            finally:
                watchdog.cancel()
            if cut.is_set():  # a cut socket reads as a short, clean end: whatever came is not the answer
                self.close()
                raise EngineError(f"{method} {path}: {bound}")
            return resp.status, payload, elapsed
        raise AssertionError("unreachable")

    @staticmethod
    def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
        """The watchdog: end whatever the connection is blocked in (a recv returns at once)."""
        cut.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        status, payload, _ = self.exchange("GET", path, timeout=timeout)
        if status != 200:
            raise EngineError(f"HTTP {status} from GET {path}: {payload[:200].decode(errors='replace')}")
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise EngineError(f"malformed JSON from GET {path}: {payload[:80]!r}") from exc

    def complete(self, prompt: str, party: Any) -> float:
        """Send one `max_tokens=1` completion as `party`; return its client-side latency in seconds."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if party.salt is not None:
            body["cache_salt"] = party.salt
        if party.user is not None:
            body["user"] = party.user
        status, payload, elapsed = self.exchange("POST", "/v1/completions", json.dumps(body).encode())
        if status != 200:
            raise EngineError(f"HTTP {status} from /v1/completions: {payload[:200].decode(errors='replace')}")
        try:
            answer = json.loads(payload)
            answer["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"malformed completion: {payload[:80]!r}") from exc
        self.requests += 1
        usage = answer.get("usage") if isinstance(answer, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        if isinstance(usage.get("prompt_tokens"), int) and isinstance(usage.get("completion_tokens", 0), int):
            self.prompt_tokens += usage["prompt_tokens"]
            self.completion_tokens += usage.get("completion_tokens", 0)
        else:
            self.unreported += 1
        return elapsed

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
