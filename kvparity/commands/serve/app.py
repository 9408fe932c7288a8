"""The OpenAI-compatible HTTP surface of `kvparity serve`, on aiohttp.

Why aiohttp: one well-kept package (aio-libs) that is an asyncio HTTP server with keep-alive and
concurrent connections out of the box, without an ASGI framework plus a separate ASGI server
(FastAPI/Starlette + uvicorn, what vLLM uses) for five routes. It is the `serve` extra, so the core suite
stays stdlib + torch.

Routes (the wire format is vLLM's, so the HTTP adapter drives this server and vLLM the same way):
  GET  /v1/models            the base model (`--model-name`, default kvparity) and the shipped LoRA names
  POST /v1/completions       prompt: token ids or text (tokenized with the shipped tokenizer, no BOS);
                             max_tokens, stop_token_ids, logprobs (top-n), cache_salt, user,
                             return_token_ids, return_tokens_as_token_ids, seed; greedy only. Any other
                             parameter, or one at a value this server cannot honour, is a 400 (`params`)
  POST /reset_prefix_cache   forget every reusable KV (vLLM's dev-mode endpoint, same name)
  GET  /health, GET /version, GET /metrics   (Prometheus text: engine steps, the largest batch, requests)
Answers carry `usage.prompt_tokens_details.cached_tokens` — the engine's own count of prompt tokens whose
KV came from the prefix cache (so with a fault planted, whatever the faulty engine reports), and
`kvparity_timeline` (an extension, no vLLM field): the engine steps run when the request was admitted and when
it ended, so a client that paces its arrivals learns where they really landed. Every error
is OpenAI-style JSON: a body over `MAX_BODY` a 413, a body nested too deep for the JSON decoder a 400.

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
import json
import logging
import time
from typing import Any

import torch
from aiohttp import web

from kvparity.commands.serve.loop import EngineFailed, EngineLoop, RequestRefused
from kvparity.commands.serve.params import BadRequest, Completion, parse
from reference_engine.model import DenseKV
from reference_engine.model_registry import ModelRegistry
from reference_engine.sequence import Identity, Report

SCOPES = ("user", "tenant", "global")
VERSION = "0.1.0"


def cache_salt(scope: str, salt: str | None, user: str | None) -> str | None:
    """The engine's salt for a request under `scope` (see the module docstring)."""
    if scope == "global":
        return None
    if scope == "tenant":
        return salt
    if salt is None and user is None:
        return None
    return f"{len(salt or '')}:{salt or ''}|user:{user or ''}"  # length-prefixed: no two pairs collide


MAX_BODY = 4 * 1024 * 1024  # bytes: a 1024-token context needs a few KB; more is a mistake or an attack


async def _event(resp: web.StreamResponse, data: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")


def _error(status: int, message: str) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """Every error as OpenAI-style JSON: aiohttp's own (413 body too large, 404, 405) and a handler's
    unexpected exception (a 500 that says what broke, never aiohttp's plain-text page)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.text or exc.reason)
    except Exception as exc:  # noqa: BLE001 — answered, and logged with its traceback
        logging.getLogger("kvparity.serve").exception("unhandled error in %s", request.path)
        return _error(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}")


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
        app = web.Application(client_max_size=MAX_BODY, middlewares=[json_errors])
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
            body = await request.json()  # past MAX_BODY aiohttp raises its 413, answered by json_errors
        except ValueError:
            return _error(400, "the body is not JSON")
        except RecursionError:  # the C decoder's guard against a document nested thousands deep
            return _error(400, "the body is not JSON this server reads: nested too deep")
        try:
            q = parse(body, model_name=self.model_name, adapters=self.registry.adapters(), tokenizer=self.tokenizer,
                      vocab=self.vocab, revision=self.revision,
                      salt_of=lambda salt, user: cache_salt(self.scope, salt, user))
        except BadRequest as exc:
            return _error(400, str(exc))
        request_id = f"cmpl-{next(self._ids)}"  # numbered in arrival order
        self.requests += 1
        if q.stream:
            return await self._stream(request, request_id, q)
        fut = asyncio.get_running_loop().create_future()
        try:
            self.loop.submit(request_id, q.prompt, q.max_tokens, q.stop_ids, q.identity, self._resolver(fut))
        except EngineFailed as exc:
            return _error(503, str(exc))
        outcome = await fut
        if isinstance(outcome, RequestRefused):
            return _error(400, str(outcome))
        if isinstance(outcome, BaseException):
            return _error(500, str(outcome))
        return web.json_response(self._answer(request_id, q, outcome))

    async def _stream(self, request: web.Request, request_id: str, q: Completion) -> web.StreamResponse:
        """Server-sent events: a chunk per engine step with the tokens it added, then one with the finish
        reason and the usage (and the logprobs of the whole output, where asked), then `data: [DONE]`. A
        client that goes away aborts the request in the engine at the next step (`EngineLoop.abort`):
        how an OpenAI server's front end stops work nobody will read."""
        aio = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def progress(tokens: tuple[int, ...]) -> None:
            aio.call_soon_threadsafe(events.put_nowait, tokens)

        def done(value: object) -> None:
            aio.call_soon_threadsafe(events.put_nowait, value)

        try:
            self.loop.submit(request_id, q.prompt, q.max_tokens, q.stop_ids, q.identity, done, progress)
        except EngineFailed as exc:
            return _error(503, str(exc))
        first = await events.get()
        if isinstance(first, RequestRefused):
            return _error(400, str(first))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        sent, item = 0, first
        try:
            await resp.prepare(request)
            while True:
                if isinstance(item, tuple):  # the output so far, after a step
                    if len(item) > sent:
                        await _event(resp, self._chunk(request_id, q, list(item[sent:])))
                        sent = len(item)
                elif isinstance(item, BaseException):
                    await _event(resp, {"error": {"message": str(item), "type": "server_error", "code": 500}})
                    break
                else:
                    final = self._answer(request_id, q, item)
                    choice = final["choices"][0]
                    rest = list(item.output[sent:])
                    choice["text"] = self.tokenizer.decode(rest, skip_special_tokens=False)
                    if q.ids:
                        choice["token_ids"] = rest
                    await _event(resp, {**final, "object": "text_completion.chunk"})
                    await resp.write(b"data: [DONE]\n\n")
                    break
                item = await events.get()
        except ConnectionResetError:  # the client went away mid-stream: nobody will read the rest
            self.loop.abort(request_id)
        except asyncio.CancelledError:  # the same, where aiohttp cancels the handler on disconnect
            self.loop.abort(request_id)
            raise
        return resp

    def _chunk(self, request_id: str, q: Completion, tokens: list[int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": self.tokenizer.decode(tokens, skip_special_tokens=False),
                                  "finish_reason": None}
        if q.ids:
            choice["token_ids"] = tokens
        admitted = self.loop.timeline.get(request_id, (None, None))[0]
        return {"id": request_id, "object": "text_completion.chunk", "created": int(time.time()), "model": q.model,
                "choices": [choice], "kvparity_timeline": {"admitted_at_step": admitted, "ended_at_step": None}}

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

    def _answer(self, request_id: str, q: Completion, rep: Report) -> dict[str, Any]:
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
        if q.ids:
            choice["token_ids"] = output
            choice["prompt_token_ids"] = list(q.prompt)
        if q.logprobs is not None:  # 0: each chosen token's logprob, no alternatives
            choice["logprobs"] = self._logprobs(q.prompt, output, q.identity, q.logprobs, q.as_ids)
        admitted, ended = self.loop.timeline.pop(request_id, (None, None))
        return {"id": request_id, "object": "text_completion", "created": int(time.time()),
                "model": q.model, "choices": [choice],
                "kvparity_timeline": {"admitted_at_step": admitted, "ended_at_step": ended},
                "usage": {"prompt_tokens": len(q.prompt), "completion_tokens": len(output),
                          "total_tokens": len(q.prompt) + len(output),
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
