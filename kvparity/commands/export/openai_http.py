"""Reproducers for any OpenAI-compatible server: plain `urllib` POSTs to `/v1/completions` with token-id
prompts, `stop_token_ids`, `cache_salt` and the adapter as the model name, cached tokens read from
`usage.prompt_tokens_details.cached_tokens`, and the cache flushed with `POST /reset_prefix_cache` (vLLM's
dev mode) or a fresh salt namespace — as adapters/openai_http/ does it. A batch's requests are in flight
together, sent 10 ms apart in arrival order.

The server is the user's: the script attaches to `--base-url`. For a witness whose run started the server
itself (serve=vllm), the docstring gives the command the adapter used. Text prompts (prompt_mode=text, as
llama-cpp-python's server needs) are not exported: what such a server answers depends on the
tokenizer round trip the adapter compensates for, which a plain script would have to restate."""

from __future__ import annotations

import os
import shlex
from typing import Any, Mapping

from adapters import vllm as vllm_adapter  # imports no vLLM: `normalise_finish` is embedded by source
from conformance.contract import Request, UsageError

NEEDS = "only the Python standard library, and the server running (--base-url)"
HELPERS = (vllm_adapter.normalise_finish,)

DRIVER = r'''
# --- the engine: an OpenAI-compatible /v1/completions server, spoken to as kvparity's adapters/openai_http does ---
import threading
import time
import urllib.error
import urllib.request


class Driver:
    OPTIONS = [("--base-url", {"default": None, "help": "the server, e.g. http://127.0.0.1:8000 (default: the "
                               "witness's, if it attached to one)"}),
               ("--model", {"default": None, "help": "the served base model name (default: the witness's, else "
                            "the first of /v1/models)"})]

    def __init__(self, params, args):
        self.params = params
        self.base = (args.base_url or params["base_url"] or "").rstrip("/")
        if not self.base:
            raise ValueError("give the server with --base-url URL")
        self.model = args.model or params["model"] or self._call("GET", "/v1/models")["data"][0]["id"]
        self.epoch = 0

    def _call(self, method, path, body=None, raw=False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.params["timeout"]) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:200]}") from None
        return text if raw else json.loads(text)

    def configure(self, config):
        if config:
            raise ValueError(f"a server has no configuration steps (got {config}); start it with other arguments")

    def reset(self):
        if self.params["reset"] == "endpoint":
            self._call("POST", "/reset_prefix_cache", raw=True)
        elif self.params["reset"] == "salt":
            self.epoch += 1

    def close(self):
        pass

    def _body(self, q):
        body = {"model": self.model, "max_tokens": q["max_tokens"], "temperature": 0.0, "stream": False,
                "prompt": list(q["prompt"]), "stop_token_ids": list(q["stop_ids"]), "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        if self.params["logprobs"]:
            body["logprobs"] = 2
        ident = q["identity"]
        if ident["adapter"] is not None:
            body["model"] = ident["adapter"]
        if self.params["salt"]:
            salt = ident["salt"]
            if self.params["reset"] == "salt":
                salt = f"kvp{self.epoch}-{salt or ''}"
            if salt is not None:
                body["cache_salt"] = salt
        body.update(self.params["extra_body"])
        return body

    def _one(self, q, box, i):
        try:
            data = self._call("POST", "/v1/completions", self._body(q))
            choice = data["choices"][0]
            ids = choice.get("token_ids")
            if ids is None:
                raise RuntimeError(f"request {q['id']}: the completion carries no token_ids")
            output, reason = normalise_finish([int(t) for t in ids], choice.get("finish_reason"),
                                              choice.get("stop_reason"), q["stop_ids"], self.params["eos_id"],
                                              q["max_tokens"])
            details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            box[i] = {"output": output, "finish_reason": reason, "cached_tokens": cached, "draft_proposed": None,
                      "draft_accepted": None, "evictions": None}
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box[i] = exc

    def run(self, requests):
        box, threads = [None] * len(requests), []
        for i, q in enumerate(requests):  # arrival order: all in flight together, 10 ms apart
            t = threading.Thread(target=self._one, args=(q, box, i), daemon=True)
            t.start()
            threads.append(t)
            time.sleep(0.01)
        for t in threads:
            t.join(self.params["timeout"] + 5)
        for q, item in zip(requests, box):
            if item is None:
                raise RuntimeError(f"request {q['id']}: no answer within {self.params['timeout']:g}s")
            if isinstance(item, BaseException):
                raise item
        return box
'''


def _settings(args: Mapping[str, str]) -> dict[str, Any]:
    import inspect
    import json

    from adapters.engine_args import bool_arg, num_arg
    from adapters.openai_http import OpenAIHttpAdapter

    sig = {n: p.default for n, p in inspect.signature(OpenAIHttpAdapter.__init__).parameters.items() if n != "self"}
    unknown = set(args) - set(sig)
    if unknown:
        raise UsageError(f"unknown openai_http engine argument(s) {sorted(unknown)}; known: {', '.join(sig)}")
    m = {**sig, **args}
    if m["prompt_mode"] != "tokens" or m["serve"] == "llama_cpp":
        raise UsageError("only token-id prompts are exported (prompt_mode=tokens); a text-prompt server's answers "
                         "depend on the tokenizer round trip the adapter compensates for")
    salt = (m["serve"] == "vllm") if str(m["salt"]).lower() == "auto" else bool_arg("salt", m["salt"])
    reset = m["reset"]
    if reset == "auto":
        reset = "endpoint" if m["serve"] == "vllm" else ("salt" if salt else "none")
    try:
        extra = json.loads(m["extra_body"]) if m["extra_body"] else {}
    except ValueError:
        raise UsageError(f"extra_body={m['extra_body']!r} is not JSON") from None
    return {"base_url": m["base_url"] or None, "model": m["model"] or ("kvparity" if m["serve"] else None),
            "salt": salt, "reset": reset, "timeout": num_arg("timeout", m["timeout"], float, 1),
            "logprobs": bool_arg("logprobs", "false" if m["logprobs"] == "auto" and m["serve"] == "kvparity"
                                 else "true" if m["logprobs"] == "auto" else m["logprobs"]), "extra_body": extra, "eos_id": 2,
            "serve": m["serve"], "raw": m}


def declared_capabilities(args: Mapping[str, str]) -> Any:
    """What the adapter would declare, without a server to probe: cached tokens assumed reported (a server
    that reports none gets no cached-token claim checked: its counts read None)."""
    from adapters.openai_http.adapter import DEFAULT_TOLERANCE
    from conformance.contract import Capabilities

    s = _settings(args)
    raw = s["raw"]
    tolerance = raw["tolerance"]
    tolerance = (0.0 if s["serve"] == "kvparity" else DEFAULT_TOLERANCE) if str(tolerance) == "auto" else float(tolerance)
    block = int(raw["block_size"])
    return Capabilities(name="openai_http", vocab_size=1024, max_context=1024, eos_id=2, block_size=block,
                        prefix_caching=True, reports_cached_tokens=True, tolerance=tolerance, min_hit_prompt=block + 1)


def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
    s = _settings(args)
    return {k: v for k, v in s.items() if k not in ("serve", "raw")}


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    if config:
        raise UsageError(f"the openai_http adapter has no config space (got {dict(config)})")
    return {}


def check_request(args: Mapping[str, str], request: Request) -> None:
    from reference_engine import checkpoints

    s, ident = _settings(args), request.identity
    if ident.revision != s["raw"]["revision"]:
        raise UsageError(f"request {request.id}: revision {ident.revision!r} not served (one server, one revision)")
    if ident.salt is not None and not s["salt"]:
        raise UsageError(f"request {request.id}: has salt {ident.salt!r}, but cache_salt is not sent (salt=true)")
    if ident.adapter is not None and ident.adapter_digest and ident.adapter in checkpoints.ADAPTERS and \
            not checkpoints.adapter_digest(ident.adapter).startswith(ident.adapter_digest):
        raise UsageError(f"request {request.id}: adapter {ident.adapter!r}@{ident.adapter_digest[:8]}: a server "
                         f"serves its adapters' own weights (no in-place reload over HTTP)")


def oracle(args: Mapping[str, str], caps: Any):
    from adapters.reference_oracle import ReferenceOracle

    return ReferenceOracle(caps.eos_id).baseline, lambda: None


def how(args: Mapping[str, str]) -> str:
    """For serve=vllm: the server command the adapter ran (port 8000 here), to start before the script."""
    s = _settings(args)
    if s["serve"] != "vllm":
        return ""
    from adapters.openai_http.server import vllm_command
    from adapters.vllm import MAX_CONTEXT
    from reference_engine import checkpoints

    raw = s["raw"]
    loras = {a: str(checkpoints.adapter_dir(a)) for a in ("upper", "rot13")} if str(raw["lora"]) == "true" else {}
    budget = None if str(raw["max_num_batched_tokens"]).lower() in ("none", "") else int(raw["max_num_batched_tokens"])
    cmd = vllm_command(folder=str(checkpoints.revision_dir(raw["revision"])), port=8000,
                       block_size=int(raw["block_size"]), max_context=MAX_CONTEXT, loras=loras, budget=budget,
                       spec=raw["spec"], k=int(raw["k"]), draft_folder=str(checkpoints.CHECKPOINTS / checkpoints.DRAFT))
    root = str(checkpoints.CHECKPOINTS.parent.parent) + os.sep  # paths relative to a kvparity checkout
    cmd = ["python", *(a.replace(root, "") for a in cmd[1:])]
    return ("\nThe witness's run started the server itself; start it the same way (from the root of a kvparity\n"
            "checkout, for the checkpoints), then run this script with --base-url http://127.0.0.1:8000:\n"
            "  VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_SERVER_DEV_MODE=1 \\\n  "
            + shlex.join(cmd) + "\n")
