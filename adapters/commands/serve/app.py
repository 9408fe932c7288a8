"""The OpenAI-compatible HTTP surface of `kvparity serve`, on aiohttp.

Why aiohttp: one well-kept package (aio-libs) that is an asyncio HTTP server with keep-alive and
concurrent connections out of the box, without an ASGI framework plus a separate ASGI server
(FastAPI/Starlette + uvicorn, what vLLM uses) for five routes. It is the `serve` extra, so the core suite
stays stdlib + torch.

Routes (the wire format is vLLM's, so the HTTP adapter drives this server and vLLM the same way):
  GET  /v1/models            the base model (`--model-name`, default kvparity) and the shipped LoRA names
  POST /v1/completions       prompt: token ids or text (tokenized with the shipped tokenizer, no BOS);
                             max_tokens, stop_token_ids, logprobs (top-n), cache_salt, user,
                             return_token_ids, return_tokens_as_token_ids; greedy only
  POST /reset_prefix_cache   forget every reusable KV (vLLM's dev-mode endpoint, same name)
  GET  /health, GET /version, GET /metrics   (Prometheus text: engine steps, the largest batch, requests)
Answers carry `usage.prompt_tokens_details.cached_tokens` — the engine's own count of prompt tokens whose
KV came from the prefix cache (so with a fault planted, whatever the faulty engine reports).

Cache scope: how the request's tenant fields become the engine identity whose salt keys the prefix cache.
  user     salt = (cache_salt, user): KV shared only by the same user of the same tenant
  tenant   salt = cache_salt: KV shared within a tenant (vLLM's semantics; the correct deployment)
  global   salt dropped: KV shared by everyone — the leaky deployment the timing audit must detect.
           A hit there really skips the prefill of the shared blocks, so the timing difference is real work saved.

logprobs: the engine itself returns only argmax tokens, so logprobs are computed by one extra plain forward
pass of the same float64 model over prompt + output (no cache): they are the model's log-probabilities at
the positions of the tokens the engine returned, not numbers taken from the engine's cached path.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import torch
from aiohttp import web

from adapters.commands.serve.loop import EngineFailed, EngineLoop, RequestRefused
from reference_engine.model import DenseKV
from reference_engine.model_registry import ModelRegistry
from reference_engine.sequence import Identity, Report

SCOPES = ("user", "tenant", "global")
VERSION = "0.1.0"


class BadRequest(Exception):
    """A request this server cannot answer as asked: HTTP 400 with the message."""


def cache_salt(scope: str, salt: str | None, user: str | None) -> str | None:
    """The engine's salt for a request under `scope` (see the module docstring)."""
    if scope == "global":
        return None
    if scope == "tenant":
        return salt
    if salt is None and user is None:
        return None
    return f"{len(salt or '')}:{salt or ''}|user:{user or ''}"  # length-prefixed: no two pairs collide


def _error(status: int, message: str) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class CompletionServer:
    """The routes over one `EngineLoop`."""

    def __init__(self, loop: EngineLoop, registry: ModelRegistry, tokenizer, *, revision: str, scope: str,
                 model_name: str, fault: str | None) -> None:
        if scope not in SCOPES:
            raise ValueError(f"cache scope {scope!r}: choose {', '.join(SCOPES)}")
        self.loop, self.registry, self.tokenizer = loop, registry, tokenizer
        self.revision, self.scope, self.model_name, self.fault = revision, scope, model_name, fault
        self.vocab = registry.config().vocab_size
        self._ids = itertools.count()
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.add_routes([web.get("/v1/models", self.models), web.post("/v1/completions", self.completions),
                        web.post("/reset_prefix_cache", self.reset), web.get("/health", self.health),
                        web.get("/version", self.version), web.get("/metrics", self.metrics)])
        app.on_shutdown.append(self._shutdown)
        return app

    async def _shutdown(self, _app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.loop.close)

    # -- small routes -------------------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": f"kvparity-serve {VERSION}", "cache_scope": self.scope,
                                  "fault": self.fault or "none", "revision": self.revision})

    async def metrics(self, _request: web.Request) -> web.Response:
        """What shows batching from outside: steps run, and the most requests live in one step."""
        lines = [f"kvparity_engine_steps_total {self.loop.steps}", f"kvparity_batch_size_max {self.loop.largest_batch}",
                 f"kvparity_requests_total {self.requests}"]
        return web.Response(text="\n".join(lines) + "\n")

    async def models(self, _request: web.Request) -> web.Response:
        names = [self.model_name, *sorted(self.registry.adapters())]
        return web.json_response({"object": "list", "data": [
            {"id": n, "object": "model", "owned_by": "kvparity", "max_model_len": self.registry.config().max_position_embeddings}
            for n in names]})

    async def reset(self, _request: web.Request) -> web.Response:
        fut = asyncio.get_running_loop().create_future()
        self.loop.flush(self._resolver(fut))
        await fut
        return web.Response(text="ok")

    # -- completions --------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        try:
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            prompt, max_tokens, stop_ids, identity, opts = self._parse(body)
        except BadRequest as exc:
            return _error(400, str(exc))
        request_id = f"cmpl-{next(self._ids)}"  # numbered in arrival order
        self.requests += 1
        fut = asyncio.get_running_loop().create_future()
        try:
            self.loop.submit(request_id, prompt, max_tokens, stop_ids, identity, self._resolver(fut))
        except EngineFailed as exc:
            return _error(503, str(exc))
        outcome = await fut
        if isinstance(outcome, RequestRefused):
            return _error(400, str(outcome))
        if isinstance(outcome, BaseException):
            return _error(500, str(outcome))
        return web.json_response(self._answer(request_id, body, prompt, identity, outcome, opts))

    @staticmethod
    def _resolver(fut: asyncio.Future):
        """A callback for the engine thread that completes `fut` on its event loop (once)."""
        loop = fut.get_loop()

        def done(value: object) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_result(value)
            loop.call_soon_threadsafe(settle)
        return done

    def _parse(self, body: dict[str, Any]) -> tuple:
        model = body.get("model", self.model_name)
        adapter = None
        if model != self.model_name:
            if model not in self.registry.adapters():
                raise BadRequest(f"model {model!r} is not served; see GET /v1/models")
            adapter = model
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (list, str)):
            raw = raw[0]  # a batch of one prompt
        if isinstance(raw, str):
            prompt = tuple(self.tokenizer.encode(raw, add_special_tokens=False).ids)
        elif isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            prompt = tuple(raw)
        else:
            raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise BadRequest(f"max_tokens must be an integer, got {max_tokens!r}")
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
            raise BadRequest("stop_token_ids must be a list of token ids")
        if body.get("stop"):
            raise BadRequest("stop strings are not supported; use stop_token_ids")
        if body.get("temperature") not in (None, 0, 0.0) or isinstance(body.get("temperature"), bool):
            raise BadRequest("this server decodes greedily only: temperature must be 0")
        if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
            raise BadRequest("n must be 1")
        if body.get("stream"):
            raise BadRequest("streaming is not supported")
        salt, user = body.get("cache_salt"), body.get("user")
        for name, value in (("cache_salt", salt), ("user", user)):
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"{name} must be a string")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0):
            raise BadRequest("logprobs must be a non-negative integer")
        identity = Identity(self.revision, adapter, cache_salt(self.scope, salt, user))
        opts = {"logprobs": logprobs, "ids": bool(body.get("return_token_ids")),
                "as_ids": bool(body.get("return_tokens_as_token_ids"))}
        return prompt, max_tokens, tuple(stop_ids), identity, opts

    def _answer(self, request_id: str, body: dict, prompt: tuple[int, ...], identity: Identity, rep: Report,
                opts: dict) -> dict[str, Any]:
        output = list(rep.output)
        finish, stop_reason = "length", None
        if rep.finish_reason == "eos":
            finish = "stop"
        elif rep.finish_reason == "stop":
            finish, stop_reason = "stop", output[-1]
        elif rep.finish_reason == "abort":
            finish = "abort"
        choice: dict[str, Any] = {"index": 0, "text": self.tokenizer.decode(output, skip_special_tokens=False),
                                  "finish_reason": finish, "stop_reason": stop_reason}
        if opts["ids"]:
            choice["token_ids"] = output
            choice["prompt_token_ids"] = list(prompt)
        if opts["logprobs"]:
            choice["logprobs"] = self._logprobs(prompt, output, identity, opts["logprobs"], opts["as_ids"])
        return {"id": request_id, "object": "text_completion", "created": int(time.time()),
                "model": body.get("model", self.model_name), "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output),
                          "total_tokens": len(prompt) + len(output),
                          "prompt_tokens_details": {"cached_tokens": rep.cached_tokens}}}

    @torch.no_grad()
    def _logprobs(self, prompt: tuple[int, ...], output: list[int], identity: Identity, n: int,
                  as_ids: bool) -> dict[str, Any]:
        """OpenAI completions logprobs for `output`, by one plain forward over prompt + output (module doc)."""
        model = self.registry.model(identity)
        ids = list(prompt) + output[:-1]
        rows = torch.arange(len(prompt) - 1, len(ids))
        logits = model(torch.tensor(ids), torch.arange(len(ids)), DenseKV(model.config, dtype=model.dtype), rows)
        logp = torch.log_softmax(logits, dim=-1)

        def name(t: int) -> str:
            return f"token_id:{t}" if as_ids else self.tokenizer.decode([t], skip_special_tokens=False)

        tokens, token_lp, top = [], [], []
        for row, t in zip(logp, output):
            values, idx = row.topk(min(n, self.vocab))
            tokens.append(name(t))
            token_lp.append(float(row[t]))
            top.append({name(int(i)): float(v) for v, i in zip(values, idx)})
        return {"tokens": tokens, "token_logprobs": token_lp, "top_logprobs": top}
