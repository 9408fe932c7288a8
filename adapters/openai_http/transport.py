"""HTTP on loopback, stdlib only: a tiny JSON client whose every failure is an `EngineError` with a
one-line cause (a refused connection, a timeout, an HTTP error, malformed JSON), and the Prometheus text
format summed by metric name (vLLM's speculation counters live in /metrics)."""

from __future__ import annotations

import collections
import http.client
import json
import re
import socket
import urllib.error
import urllib.request
from typing import Any, Iterator

from conformance.contract import EngineError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line(text: str, limit: int = 240) -> str:
    """The last non-empty line of a server's answer or log: where the reason usually is."""
    lines = [l for l in str(text).strip().splitlines() if l.strip()]
    return (lines[-1] if lines else "")[:limit]


class Http:
    """Tiny JSON-over-HTTP client; every failure is an EngineError with a one-line cause."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None, raw: bool = False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = exc.read().decode(errors="replace")
            except Exception:  # noqa: BLE001
                pass
            raise EngineError(f"HTTP {exc.code} from {method} {path}: {last_line(detail) or exc.reason}") from exc
        except (socket.timeout, TimeoutError) as exc:
            raise EngineError(f"{method} {path} timed out after {timeout or self.timeout:g}s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise EngineError(f"{method} {path} timed out after {timeout or self.timeout:g}s") from exc
            raise EngineError(f"cannot reach {self.base}{path}: {exc.reason}") from exc
        except (ConnectionError, OSError) as exc:
            raise EngineError(f"connection to {self.base}{path} failed: {type(exc).__name__}: {exc}") from exc
        if raw:
            return payload.decode(errors="replace")
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise EngineError(f"malformed JSON from {method} {path}: {payload[:80]!r}") from exc


    def send_and_leave(self, path: str, body: Any) -> None:
        """POST `body` and close the connection without waiting for an answer: a client that goes away
        at once (a streamed request aborted before its first token)."""
        host, _, port = self.base.split("//", 1)[1].partition(":")
        conn = http.client.HTTPConnection(host, int(port or 80), timeout=self.timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        except (ConnectionError, OSError) as exc:
            raise EngineError(f"POST {path} to {self.base} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def stream(self, path: str, body: Any, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """POST `body` asking for server-sent events and yield each event's JSON until `data: [DONE]`.
        Closing the generator early closes the connection: what an OpenAI server reads as the client
        going away (it aborts the request)."""
        host, _, port = self.base.split("//", 1)[1].partition(":")
        conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout or self.timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise EngineError(f"HTTP {resp.status} from POST {path}: {last_line(resp.read().decode(errors='replace'))}")
            while True:
                line = resp.readline(1 << 20)
                if not line:
                    raise EngineError(f"POST {path}: the stream ended without [DONE]")
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    return
                try:
                    yield json.loads(data)
                except ValueError as exc:
                    raise EngineError(f"malformed event from POST {path}: {data[:80]!r}") from exc
        except (socket.timeout, TimeoutError) as exc:
            raise EngineError(f"POST {path} (stream) timed out after {timeout or self.timeout:g}s") from exc
        except (ConnectionError, OSError, http.client.HTTPException) as exc:
            raise EngineError(f"stream from {self.base}{path} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


def prometheus_totals(text: str) -> dict[str, float]:
    """Sum Prometheus samples by metric name (labels dropped)."""
    out: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            out[m.group(1)] += float(m.group(2))
        except ValueError:
            continue
    return dict(out)
