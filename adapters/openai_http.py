"""kvparity adapter for any OpenAI-compatible completions server, over HTTP on loopback (stdlib only).

Attach to a running server (`base_url=http://127.0.0.1:8000`) or let the adapter start one on a free
127.0.0.1 port and stop it on close():

  serve=vllm        `python -m vllm.entrypoints.openai.api_server` on the shipped checkpoint, with
                    --enable-prompt-tokens-details, --enable-prefix-caching, float32, --enforce-eager,
                    LoRA modules `upper` / `rot13`, VLLM_SERVER_DEV_MODE=1 (for POST /reset_prefix_cache)
  serve=llama_cpp   `python -m llama_cpp.server --model <gguf=...>` (text prompts; no cached-token count)

Engine arguments (strings):
  base_url=, serve=, model=  (the served model name; default: kvparity when serving, else the first of /v1/models)
  prompt_mode=tokens|text    tokens: the prompt is a list of token ids (vLLM accepts them);
                             text: the prompt is decoded with the shipped tokenizer (servers that reject ids,
                             e.g. llama-cpp-python). Output ids come from `token_ids` (vLLM `return_token_ids`),
                             else from `token_id:N` logprob tokens, else the output *text* re-encoded
                             (extra["output_from_text"]: not token-exact; a divergence there may be a
                             tokenizer round-trip, say so in reports).
  salt=auto|true|false       send `cache_salt` (auto: true when serve=vllm)
  adapters=                  comma list of served LoRA names (auto when serve=vllm and lora=true)
  lora=true                  serve=vllm: load the two shipped LoRA adapters
  reset=auto|endpoint|salt|none   how reset() flushes reusable KV: POST /reset_prefix_cache (vLLM dev mode),
                             or an epoch nonce mixed into every cache_salt (a fresh KV namespace), or nothing
  spec=none|ngram|draft, k=3, max_num_batched_tokens=none   serve=vllm only, as for the vllm adapter
  block_size=32, timeout=120 (seconds per HTTP call), startup_timeout=600, tolerance=1e-3, gguf=, port=0

Reported: `usage.prompt_tokens_details.cached_tokens` -> Result.cached_tokens (None where the server does
not report it, and then `reports_cached_tokens` is False); `logprobs=2` -> Result.top2 (logprobs, whose
top-1/top-2 difference is the logit margin); with serve=vllm and speculation, the draft counters are read
from /metrics (engine-wide; attributed only to single-request batches). Timeouts, refused connections,
HTTP errors and malformed JSON raise EngineError with a one-line cause (an `error` verdict).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Mapping, Sequence

from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, UsageError

DEFAULT_TOLERANCE = 1e-3
VOCAB, MAX_CONTEXT, EOS = 1024, 1024, 2
LORAS = ("upper", "rot13")
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def _bool(name: str, value: Any) -> bool:
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", "none"):
        return False
    raise UsageError(f"engine argument {name}={value!r}: say true or false")


def _num(name: str, value: Any, cast=float, lo: float = 0):
    try:
        v = cast(value)
    except (TypeError, ValueError):
        raise UsageError(f"engine argument {name}={value!r} is not a number") from None
    if v < lo:
        raise UsageError(f"engine argument {name}={v} must be >= {lo}")
    return v


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(text: str, limit: int = 240) -> str:
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
            raise EngineError(f"HTTP {exc.code} from {method} {path}: {_one_line(detail) or exc.reason}") from exc
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


class OpenAIHttpAdapter:
    """The Engine contract over an OpenAI-compatible `/v1/completions` endpoint."""

    def __init__(self, base_url: str = "", serve: str = "", model: str = "", prompt_mode: str = "tokens",
                 salt: str = "auto", adapters: str = "auto", lora: str = "true", reset: str = "auto",
                 spec: str = "none", k: str | int = 3, max_num_batched_tokens: str = "none",
                 block_size: str | int = 32, timeout: str | float = 120, startup_timeout: str | float = 600,
                 tolerance: str | float = DEFAULT_TOLERANCE, logprobs: str = "true", gguf: str = "",
                 port: str | int = 0, revision: str = "a", name: str = "") -> None:
        from reference_engine import checkpoints

        self._ckpt = checkpoints
        if bool(base_url) == bool(serve):
            raise UsageError("give exactly one of base_url=URL (attach) or serve=vllm|llama_cpp (start a server)")
        if serve not in ("", "vllm", "llama_cpp"):
            raise UsageError(f"serve={serve!r}: choose vllm or llama_cpp")
        if prompt_mode not in ("tokens", "text"):
            raise UsageError(f"prompt_mode={prompt_mode!r}: choose tokens or text")
        if spec not in ("none", "ngram", "draft"):
            raise UsageError(f"spec={spec!r}: choose none, ngram or draft")
        if spec != "none" and serve != "vllm":
            raise UsageError("spec= only applies with serve=vllm")
        if revision not in checkpoints.REVISIONS:
            raise UsageError(f"revision={revision!r}: shipped revisions are {sorted(checkpoints.REVISIONS)}")
        self.serve, self.prompt_mode, self.revision = serve, prompt_mode, revision
        self.block_size = int(_num("block_size", block_size, int, 1))
        self.timeout = _num("timeout", timeout, float, 1)
        self.startup_timeout = _num("startup_timeout", startup_timeout, float, 1)
        self.tolerance = _num("tolerance", tolerance)
        self.want_logprobs = _bool("logprobs", logprobs)
        self.lora = _bool("lora", lora) and serve == "vllm"
        self.loras = tuple(a for a in LORAS if (checkpoints.adapter_dir(a) / "adapter_model.safetensors").exists())
        self.lora = self.lora and bool(self.loras)
        self.spec, self.k = spec, int(_num("k", k, int, 1))
        self.budget = None if str(max_num_batched_tokens).lower() in ("none", "") else int(
            _num("max_num_batched_tokens", max_num_batched_tokens, int, 32))
        self.gguf = gguf
        self.label = name or (f"openai_http-{serve}" if serve else "openai_http")
        self.proc: subprocess.Popen | None = None
        self.log_path: pathlib.Path | None = None
        self._tokenizer = None
        self._models: dict[tuple, Any] = {}
        self.epoch = 0
        self.version = "unknown"
        if serve:
            base_url = self._start_server(int(_num("port", port, int, 0)))
        self.http = Http(base_url, self.timeout)
        try:
            self.model = model or ("kvparity" if serve else self._first_model())
            self.salt = (serve == "vllm") if str(salt).lower() == "auto" else _bool("salt", salt)
            if str(adapters).lower() == "auto":
                self.adapters = self.loras if self.lora else ()
            else:
                self.adapters = tuple(a.strip() for a in adapters.split(",") if a.strip())
            self.reset_mode = self._choose_reset(reset)
            self.reports_cached = self._probe_cached_tokens()
            self.version = self._server_version()
        except BaseException:
            self.close()
            raise

    # -- server lifecycle -------------------------------------------------------------------------
    def _start_server(self, port: int) -> str:
        port = port or free_port()
        env = dict(os.environ)
        if self.serve == "vllm":
            folder = str(self._ckpt.revision_dir(self.revision))
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
                   "--served-model-name", "kvparity", "--host", "127.0.0.1", "--port", str(port),
                   "--dtype", "float32", "--enforce-eager", "--block-size", str(self.block_size),
                   "--enable-prefix-caching", "--enable-prompt-tokens-details", "--max-model-len", str(MAX_CONTEXT),
                   "--max-logprobs", "2", "--seed", "0", "--disable-uvicorn-access-log"]
            if self.lora:
                cmd += ["--enable-lora", "--max-lora-rank", "8", "--max-loras", str(len(LORAS)), "--lora-modules",
                        *[f"{a}={self._ckpt.adapter_dir(a)}" for a in self.loras]]
            if self.budget is not None:
                cmd += ["--max-num-batched-tokens", str(self.budget), "--enable-chunked-prefill"]
            if self.spec == "ngram":
                cmd += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": self.k,
                                                            "prompt_lookup_max": 4, "prompt_lookup_min": 2})]
            elif self.spec == "draft":
                cmd += ["--speculative-config", json.dumps({
                    "method": "draft_model", "num_speculative_tokens": self.k,
                    "model": str(self._ckpt.CHECKPOINTS / self._ckpt.DRAFT)})]
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes POST /reset_prefix_cache
        else:
            if not self.gguf:
                raise UsageError("serve=llama_cpp needs gguf=PATH (see `kvparity export-gguf`)")
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", self.gguf, "--host", "127.0.0.1",
                   "--port", str(port), "--n_ctx", str(MAX_CONTEXT), "--type_k", "0", "--type_v", "0"]
            self.prompt_mode = "text"
        fd, log = tempfile.mkstemp(prefix=f"kvparity-{self.serve}-", suffix=".log")
        self.log_path = pathlib.Path(log)
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        os.close(fd)
        base = f"http://127.0.0.1:{port}"
        probe = Http(base, 5)
        deadline = time.monotonic() + self.startup_timeout
        health = "/health" if self.serve == "vllm" else "/v1/models"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")
                rc, self.proc = self.proc.returncode, None
                raise EngineError(f"{self.serve} server exited with code {rc}: {_one_line(tail)} (log {self.log_path})")
            try:
                probe.call("GET", health, raw=True)
                return base
            except EngineError:
                time.sleep(1.0)
        self.close()
        raise EngineError(f"{self.serve} server not healthy after {self.startup_timeout:g}s (log {self.log_path})")

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, 15)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=10)

    def __del__(self) -> None:  # a forgotten close() must not leave a server running
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- probing ----------------------------------------------------------------------------------
    def _first_model(self) -> str:
        data = self.http.call("GET", "/v1/models")
        try:
            return data["data"][0]["id"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"/v1/models lists no model: {str(data)[:80]}") from exc

    def _server_version(self) -> str:
        if self.serve == "vllm" or not self.serve:
            try:
                v = self.http.call("GET", "/version", timeout=5)
                if isinstance(v, dict) and v.get("version"):
                    return f"vllm {v['version']}" if self.serve == "vllm" else str(v["version"])
            except EngineError:
                pass
        if self.serve == "llama_cpp":
            try:
                from importlib import metadata

                return "llama-cpp-python " + metadata.version("llama-cpp-python")
            except Exception:  # noqa: BLE001
                pass
        return "unknown"

    def _choose_reset(self, reset: str) -> str:
        if reset not in ("auto", "endpoint", "salt", "none"):
            raise UsageError(f"reset={reset!r}: choose auto, endpoint, salt or none")
        if reset != "auto":
            return reset
        if self.serve == "vllm":
            return "endpoint"
        return "salt" if self.salt else "none"

    def _probe_cached_tokens(self) -> bool:
        body = self._body([5, 6, 7], 1, (), None)
        data = self.http.call("POST", "/v1/completions", body)
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return isinstance(details, dict) and isinstance(details.get("cached_tokens"), int)

    # -- contract ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        identities = set()
        if self.salt:
            identities.add("salt")
        if self.adapters:
            identities.add("adapter")
        spec = self.spec != "none"
        return Capabilities(
            name=self.label, version=self.version, vocab_size=VOCAB, max_context=MAX_CONTEXT, eos_id=EOS,
            block_size=self.block_size, prefix_caching=self.reports_cached or self.serve == "llama_cpp",
            reports_cached_tokens=self.reports_cached, speculation=spec, reports_drafts=spec,
            chunked_prefill=self.budget is not None, evicts=False, top2_logits=self.want_logprobs,
            identities=frozenset(identities), revisions=(self.revision,), adapters=tuple(self.adapters),
            introspection=False, baseline_mode=False, tolerance=self.tolerance, config_space={},
            min_hit_prompt=self.block_size + 1)

    def configure(self, config: Mapping[str, Any]) -> None:
        if config:
            raise UsageError(f"the openai_http adapter has no config space (got {dict(config)}); "
                             f"start another server with other engine arguments instead")

    def reset(self) -> None:
        if self.reset_mode == "endpoint":
            self.http.call("POST", "/reset_prefix_cache", raw=True)
        elif self.reset_mode == "salt":
            self.epoch += 1

    def baseline(self, request: Request) -> Baseline:
        from reference_engine.baseline import greedy

        ident = request.identity
        key = (ident.revision, ident.adapter)
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = self._ckpt.load_target(ident.revision, ident.adapter)
        g = greedy(model, request.prompt, request.max_tokens, request.stop_ids, EOS)
        return Baseline(g.output, g.finish_reason, g.margins, g.runner_up)

    def run(self, requests: Sequence[Request]) -> list[Result]:
        for q in requests:
            if q.identity.revision != self.revision:
                raise UsageError(f"request {q.id}: revision {q.identity.revision!r} not served (revision={self.revision})")
            if q.identity.adapter is not None and q.identity.adapter not in self.adapters:
                raise UsageError(f"request {q.id}: adapter {q.identity.adapter!r} not served")
        spec = self.spec != "none"
        before = self._spec_counters() if spec else None
        # Arrival order: request i is sent ~10 ms after request i-1, all in flight together.
        box: list[Any] = [None] * len(requests)
        threads = []
        for i, q in enumerate(requests):
            t = threading.Thread(target=self._one, args=(q, box, i), daemon=True)
            t.start()
            threads.append(t)
            time.sleep(0.01)
        for t in threads:
            t.join(self.timeout + 5)
        results = []
        for q, item in zip(requests, box):
            if isinstance(item, BaseException):
                raise item if isinstance(item, (EngineError, UsageError)) else EngineError(
                    f"request {q.id}: {type(item).__name__}: {item}")
            if item is None:
                raise EngineError(f"request {q.id}: no answer within {self.timeout:g}s")
            results.append(item)
        if spec and len(results) == 1:
            after = self._spec_counters()
            proposed, accepted = (int(after[0] - before[0]), int(after[1] - before[1]))
            results[0] = _evolve(results[0], draft_proposed=proposed, draft_accepted=accepted)
        return results

    # -- helpers ----------------------------------------------------------------------------------
    def _spec_counters(self) -> tuple[float, float]:
        totals = prometheus_totals(self.http.call("GET", "/metrics", raw=True))
        return (totals.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
                totals.get("vllm:spec_decode_num_accepted_tokens_total", 0.0))

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = self._ckpt.load_tokenizer()
        return self._tokenizer

    def _salt(self, salt: str | None) -> str | None:
        if not self.salt:
            return None
        if self.reset_mode == "salt":
            return f"kvp{self.epoch}-{salt or ''}"
        return salt

    def _body(self, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int], ident) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": int(max_tokens), "temperature": 0.0,
                                "stream": False}
        if self.prompt_mode == "tokens":
            body["prompt"] = [int(t) for t in prompt]
        else:
            body["prompt"] = self.tokenizer().decode(list(prompt), skip_special_tokens=False)
        if self.serve == "vllm" or self.prompt_mode == "tokens":
            body.update(stop_token_ids=[int(s) for s in stop_ids], return_token_ids=True,
                        return_tokens_as_token_ids=True, skip_special_tokens=False)
        if self.want_logprobs:
            body["logprobs"] = 2
        if ident is not None:
            if ident.adapter is not None:
                body["model"] = ident.adapter
            salt = self._salt(ident.salt)
            if salt is not None:
                body["cache_salt"] = salt
        return body

    def _one(self, q: Request, box: list, i: int) -> None:
        try:
            t0 = time.monotonic()
            data = self.http.call("POST", "/v1/completions", self._body(q.prompt, q.max_tokens, q.stop_ids, q.identity))
            box[i] = self._result(q, data, time.monotonic() - t0)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box[i] = exc

    def _result(self, q: Request, data: Any, wall: float) -> Result:
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"request {q.id}: malformed completion (no choices): {str(data)[:80]}") from exc
        if not isinstance(choice, dict):
            raise EngineError(f"request {q.id}: malformed choice {str(choice)[:80]}")
        extra: dict[str, Any] = {"prompt_tokens": len(q.prompt), "http_finish_reason": choice.get("finish_reason"),
                                 "http_stop_reason": choice.get("stop_reason")}
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            toks = lp.get("tokens") if isinstance(lp, dict) else None
            if toks and all(isinstance(t, str) and _TOKEN_ID.match(t) for t in toks):
                ids = [int(_TOKEN_ID.match(t).group(1)) for t in toks]
            else:
                text = choice.get("text")
                if not isinstance(text, str):
                    raise EngineError(f"request {q.id}: completion has neither token_ids nor text")
                ids = self.tokenizer().encode(text, add_special_tokens=False).ids
                extra["output_from_text"] = True
        try:
            ids = [int(t) for t in ids]
        except (TypeError, ValueError) as exc:
            raise EngineError(f"request {q.id}: non-integer token ids") from exc
        from adapters.vllm import normalise_finish  # shared normalisation (no vLLM import)

        stop_reason = choice.get("stop_reason")
        output, reason = normalise_finish(ids, choice.get("finish_reason"), stop_reason, q.stop_ids, EOS,
                                          q.max_tokens)
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is not None and not isinstance(cached, int):
            raise EngineError(f"request {q.id}: cached_tokens is {cached!r}, not an integer")
        if isinstance(usage.get("prompt_tokens"), int):
            extra["server_prompt_tokens"] = usage["prompt_tokens"]
        if self.budget is not None:  # certain lower bound: more uncached tokens than one step's budget
            uncached = len(q.prompt) - (cached or 0)
            extra["prefill_chunks"] = max(1, -(-uncached // self.budget))
            extra["chunked"] = uncached > self.budget
        return Result(q.id, output, reason, cached_tokens=cached if self.reports_cached else None,
                      top2=self._top2(lp) if self.want_logprobs else None, timings={"http_s": wall}, extra=extra)

    @staticmethod
    def _top2(lp: Any) -> tuple | None:
        top = lp.get("top_logprobs") if isinstance(lp, dict) else None
        if not top:
            return None
        rows = []
        for step in top:
            if not isinstance(step, dict) or len(step) < 2:
                return None
            ranked = sorted(step.items(), key=lambda kv: -float(kv[1]))[:2]
            ids = []
            for tok, _ in ranked:
                m = _TOKEN_ID.match(tok) if isinstance(tok, str) else None
                if m is None:
                    return None
                ids.append(int(m.group(1)))
            rows.append((ids[0], float(ranked[0][1]), ids[1], float(ranked[1][1])))
        return tuple(rows)


def _evolve(result: Result, **changes: Any) -> Result:
    import attrs

    return attrs.evolve(result, **changes)
