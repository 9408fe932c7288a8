"""kvparity adapter for any OpenAI-compatible completions server, over HTTP on loopback (stdlib only).

Attach to a running server (`base_url=http://127.0.0.1:8000`) or let the adapter start one on a free
127.0.0.1 port and stop it on close():

  serve=vllm        `python -m vllm.entrypoints.openai.api_server` on the shipped checkpoint, with
                    --enable-prompt-tokens-details, --enable-prefix-caching, float32, --enforce-eager,
                    LoRA modules `upper` / `rot13`, VLLM_SERVER_DEV_MODE=1 (for POST /reset_prefix_cache)
  serve=llama_cpp   `python -m llama_cpp.server --model <gguf=...>` (text prompts; no cached-token count)

Greedy means greedy. `temperature: 0` alone is not enough on every server: llama-cpp-python's server
defaults `repeat_penalty` to 1.1 and applies its penalties sampler before the greedy one even at
temperature 0 (reports/llama_cpp F5). With serve=llama_cpp the adapter therefore also sends the
sampling-neutral `repeat_penalty: 1.0, presence_penalty: 0, frequency_penalty: 0, mirostat_mode: 0,
min_tokens: 0`; when attaching to such a server with base_url=, pass them through extra_body= (JSON merged
into every completion body), e.g. extra_body='{"repeat_penalty": 1.0}'.

Text prompts and the oracle. In prompt_mode=text the server never sees our token ids: it tokenizes
`decode(prompt)`, and `encode(decode(ids)) != ids` whenever ids are not in canonical BPE form (e.g.
`[4]*32`, 32 single `"` tokens, comes back as merged tokens). The adapter therefore computes the
baseline on the *effective prompt* `encode(decode(prompt))` (the shipped tokenizer, which equals
llama.cpp's on the exported GGUF: 400/400 texts), i.e. on the tokens the server actually receives, and
records it in Result.extra (`effective_prompt_tokens`, `prompt_roundtrip_exact`, and `effective_prompt`
when it differs; `server_prompt_mismatch` when the server's own usage.prompt_tokens disagrees). This
keeps every strategy-generated prompt usable (restricting strategies to round-trip-stable prompts would
need a text-mode switch inside the generic strategies and would drop exactly the repetitive prompts that
stress prefix reuse). The same memoized oracle key (the request) maps to the same effective prompt, so
repeats stay comparable. The other side of the channel: output ids come from the server's ids where it
gives them, else from its per-token logprob pieces (llama-cpp-python keys logprobs by token text; each
piece maps to one id of the shipped vocabulary except the 128 partial-UTF-8 byte tokens; used only when
the pieces map uniquely and concatenate to the completion text: extra["output_from_pieces"]), else the
completion text re-encoded (extra["output_from_text"], not token-exact: merges lose token boundaries).
When the probe completion shows that the server gives neither ids nor pieces, the baseline output is
passed through the same decode -> encode (margins past the first changed position are the smallest
greedy margin from there on), so that parity compares like with like. Stop ids cannot be sent as ids in text
mode, so the output is cut after the first stop id client-side (greedy decoding is causal: the tokens
before a stop do not depend on it).

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
  extra_body=JSON            merged into every /v1/completions body (after the adapter's own fields)
  logprobs=true|false        ask for logprobs=2: top-2 per step, and on servers that key logprobs by token
                             *text* (llama-cpp-python) the per-token pieces that give exact output ids

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

from adapters.engine_args import bool_arg, num_arg
from adapters.reference_oracle import ReferenceOracle
from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, UsageError

DEFAULT_TOLERANCE = 1e-3
VOCAB, MAX_CONTEXT, EOS = 1024, 1024, 2
LORAS = ("upper", "rot13")
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")




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
                 port: str | int = 0, revision: str = "a", name: str = "", extra_body: str = "") -> None:
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
        self.block_size = int(num_arg("block_size", block_size, int, 1))
        self.timeout = num_arg("timeout", timeout, float, 1)
        self.startup_timeout = num_arg("startup_timeout", startup_timeout, float, 1)
        self.tolerance = num_arg("tolerance", tolerance)
        self.want_logprobs = bool_arg("logprobs", logprobs)
        try:
            self.extra_body = json.loads(extra_body) if extra_body else {}
        except ValueError:
            raise UsageError(f"extra_body={extra_body!r} is not JSON") from None
        if not isinstance(self.extra_body, dict):
            raise UsageError("extra_body= must be a JSON object")
        self._effective_cache: dict[tuple, tuple] = {}
        self.lora = bool_arg("lora", lora) and serve == "vllm"
        self.loras = tuple(a for a in LORAS if (checkpoints.adapter_dir(a) / "adapter_model.safetensors").exists())
        self.lora = self.lora and bool(self.loras)
        self.spec, self.k = spec, int(num_arg("k", k, int, 1))
        self.budget = None if str(max_num_batched_tokens).lower() in ("none", "") else int(
            num_arg("max_num_batched_tokens", max_num_batched_tokens, int, 32))
        self.gguf = gguf
        self.label = name or (f"openai_http-{serve}" if serve else "openai_http")
        self.proc: subprocess.Popen | None = None
        self.log_path: pathlib.Path | None = None
        self._tokenizer = None
        self._pieces: dict[str, int] | None = None
        self._oracle = ReferenceOracle(EOS)
        self.epoch = 0
        self.version = "unknown"
        self._ids_from_server = False  # set by the first (probe) completion: output ids exact, not re-encoded
        if serve:
            base_url = self._start_server(int(num_arg("port", port, int, 0)))
        self.http = Http(base_url, self.timeout)
        try:
            self.model = model or ("kvparity" if serve else self._first_model())
            self.salt = (serve == "vllm") if str(salt).lower() == "auto" else bool_arg("salt", salt)
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
        try:
            choice = data["choices"][0]
            lp = choice.get("logprobs") or {}
            toks = lp.get("tokens") if isinstance(lp, dict) else None
            self._ids_from_server = choice.get("token_ids") is not None or bool(  # ids, or per-token pieces
                toks and isinstance(toks, list) and all(isinstance(t, str) for t in toks))
        except (KeyError, IndexError, TypeError, AttributeError):
            self._ids_from_server = False
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
        b = self._oracle.baseline(request, self.effective_prompt(request.prompt))
        if self.prompt_mode == "text" and not self._ids_from_server:
            return self._through_text(b)
        return b

    def effective_prompt(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """The token ids the server actually receives: the prompt itself, or encode(decode(prompt)) in text mode."""
        key = tuple(int(t) for t in prompt)
        if self.prompt_mode != "text":
            return key
        eff = self._effective_cache.get(key)
        if eff is None:
            eff = self._effective_cache[key] = self.roundtrip(key)
        return eff

    def roundtrip(self, ids: Sequence[int]) -> tuple[int, ...]:
        tok = self.tokenizer()
        return tuple(tok.encode(tok.decode(list(ids), skip_special_tokens=False), add_special_tokens=False).ids)

    def _through_text(self, b: Baseline) -> Baseline:
        """The baseline as seen through the text channel (output ids re-encoded from the completion text)."""
        out = list(b.output)
        tail = [out.pop()] if out and b.finish_reason in ("eos", "stop") else []  # the terminal token is separate
        rt = list(self.roundtrip(out)) if out else []
        if rt == out:
            return b
        same = next((i for i, (x, y) in enumerate(zip(out, rt)) if x != y), min(len(out), len(rt)))
        floor = min(b.margins[same:], default=float("inf"))  # past the change: the smallest greedy margin left
        margins = tuple(b.margins[:same]) + (floor,) * (len(rt) + len(tail) - same)
        return Baseline(tuple(rt + tail), b.finish_reason, margins, tuple(b.runner_up[:same]))

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
        if self._sends_stop_ids():
            body.update(stop_token_ids=[int(s) for s in stop_ids], return_token_ids=True,
                        return_tokens_as_token_ids=True, skip_special_tokens=False)
        if self.want_logprobs:
            body["logprobs"] = 2
        if self.serve == "llama_cpp":  # sampling-neutral: llama_cpp.server defaults repeat_penalty=1.1 (F5)
            body.update(repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, mirostat_mode=0,
                        min_tokens=0)
        if ident is not None:
            if ident.adapter is not None:
                body["model"] = ident.adapter
            salt = self._salt(ident.salt)
            if salt is not None:
                body["cache_salt"] = salt
        body.update(self.extra_body)
        return body

    def _sends_stop_ids(self) -> bool:
        return self.serve == "vllm" or self.prompt_mode == "tokens"

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
        if self.prompt_mode == "text":
            eff = self.effective_prompt(q.prompt)
            extra["effective_prompt_tokens"] = len(eff)
            extra["prompt_roundtrip_exact"] = eff == tuple(q.prompt)
            if eff != tuple(q.prompt):
                extra["effective_prompt"] = list(eff)
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            toks = lp.get("tokens") if isinstance(lp, dict) else None
            ids = self._ids_from_pieces(toks)
            if ids is not None and toks and not _TOKEN_ID.match(str(toks[0])):
                if "".join(toks) == choice.get("text"):
                    extra["output_from_pieces"] = True
                else:
                    ids = None
            if ids is None:
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
        cut = next((k for k, t in enumerate(ids) if t in q.stop_ids), None) if not self._sends_stop_ids() else None
        if cut is not None:  # the server was not told the stop ids: stop client-side at the first one
            output, reason = ids[:cut + 1], ("eos" if ids[cut] == EOS else "stop")
            extra["client_side_stop"] = True
        else:
            output, reason = normalise_finish(ids, choice.get("finish_reason"), stop_reason, q.stop_ids, EOS,
                                              q.max_tokens)
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is not None and not isinstance(cached, int):
            raise EngineError(f"request {q.id}: cached_tokens is {cached!r}, not an integer")
        if isinstance(usage.get("prompt_tokens"), int):
            extra["server_prompt_tokens"] = usage["prompt_tokens"]
            if self.prompt_mode == "text" and usage["prompt_tokens"] != extra["effective_prompt_tokens"]:
                extra["server_prompt_mismatch"] = True  # the server tokenized the text differently
        chunks = None  # certain lower bound: more uncached tokens than one step's budget
        if self.budget is not None:
            chunks = max(1, -(-(len(q.prompt) - (cached or 0)) // self.budget))
        return Result(q.id, output, reason, cached_tokens=cached if self.reports_cached else None,
                      top2=self._top2(lp) if self.want_logprobs else None, timings={"http_s": wall},
                      prefill_chunks=chunks, extra=extra)

    def _piece_map(self) -> dict[str, int]:
        """Token text -> id for every piece of the shipped vocabulary that decodes to a unique, non-empty string."""
        if self._pieces is None:
            tok, seen = self.tokenizer(), collections.Counter()
            pieces = {}
            for i in range(tok.get_vocab_size()):
                p = tok.decode([i], skip_special_tokens=False)
                seen[p] += 1
                pieces[p] = i
            self._pieces = {p: i for p, i in pieces.items() if seen[p] == 1 and p and "\ufffd" not in p}
        return self._pieces

    def _id_of(self, tok: Any) -> int | None:
        if not isinstance(tok, str):
            return None
        m = _TOKEN_ID.match(tok)
        if m is not None:
            return int(m.group(1))
        if self.prompt_mode != "text":
            return None
        return self._piece_map().get(tok)

    def _ids_from_pieces(self, toks: Any) -> list[int] | None:
        if not toks or not isinstance(toks, list):
            return None
        ids = [self._id_of(t) for t in toks]
        return None if any(i is None for i in ids) else ids

    def _top2(self, lp: Any) -> tuple | None:
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
                tid = self._id_of(tok)
                if tid is None:
                    return None
                ids.append(tid)
            rows.append((ids[0], float(ranked[0][1]), ids[1], float(ranked[1][1])))
        return tuple(rows)


def _evolve(result: Result, **changes: Any) -> Result:
    import attrs

    return attrs.evolve(result, **changes)
