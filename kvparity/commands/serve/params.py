"""Which `/v1/completions` parameters `kvparity serve` honours, and a 400 for every other one.

Why refuse rather than ignore: a server that answers 200 to `top_p=0.5` or `presence_penalty=1.5` while
decoding greedily hands the client an answer to a question it did not ask, and a conformance harness
built on it would compare the wrong thing without knowing. So every field of a request is one of:

- honoured: model, prompt, max_tokens, stop_token_ids (ids in the vocabulary), logprobs (0 to
  `MAX_LOGPROBS`, vLLM's default `max_logprobs`), cache_salt, user, return_token_ids,
  return_tokens_as_token_ids, stream (server-sent events, a chunk per engine step; a client that closes
  the stream aborts the request);
- accepted only at its neutral value, the one that asks for nothing this greedy server does not already
  do (`NEUTRAL`: temperature 0, top_p 1, presence_penalty 0, echo false, ...); for these JSON null
  means "not given" and is accepted;
- `seed`: any integer. The server decodes greedily (temperature must be 0), so there is no randomness
  for a seed to choose and every seed is honoured: the answer is the same for all of them;
- anything else, including a field this server has never heard of: a 400 naming it.

Messages show a client's value through `reprlib`, so a hostile value (a list nested hundreds deep, a
megabyte string) cannot blow up the message that refuses it.
"""

from __future__ import annotations

import reprlib
from typing import Any, Iterable, Mapping

import attrs

from reference_engine.sequence import Identity

MAX_LOGPROBS = 20
HONOURED = frozenset({"model", "prompt", "max_tokens", "stop_token_ids", "logprobs", "cache_salt", "user",
                      "return_token_ids", "return_tokens_as_token_ids", "seed", "stream"})
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {  # name: (accepted values, why nothing else is)
    "temperature": ((0,), "this server decodes greedily only: temperature must be 0"),
    "n": ((1,), "n must be 1 (one completion per request)"),
    "best_of": ((1,), "best_of must be 1 (greedy decoding has one best)"),
    "stream_options": ((), "stream_options is not supported (a streamed answer's last chunk carries the usage)"),
    "echo": ((False,), "echo is not supported"),
    "stop": (([], ""), "stop strings are not supported; use stop_token_ids"),
    "suffix": (("",), "suffix is not supported"),
    "top_p": ((1,), "this server decodes greedily only: top_p must be 1"),
    "top_k": ((-1, 0), "this server decodes greedily only: top_k must be -1 or 0 (off)"),
    "min_p": ((0,), "this server decodes greedily only: min_p must be 0"),
    "presence_penalty": ((0,), "penalties are not supported: presence_penalty must be 0"),
    "frequency_penalty": ((0,), "penalties are not supported: frequency_penalty must be 0"),
    "repetition_penalty": ((1,), "penalties are not supported: repetition_penalty must be 1"),
    "logit_bias": (({},), "logit_bias is not supported"),
    "min_tokens": ((0,), "min_tokens is not supported"),
    "ignore_eos": ((False,), "ignore_eos is not supported"),
    "skip_special_tokens": ((False,), "this server's text keeps special tokens: skip_special_tokens must be false"),
    "add_special_tokens": ((False,), "text prompts are tokenized without special tokens: add_special_tokens "
                                     "must be false"),
}
_brief = reprlib.Repr()
_brief.maxlevel, _brief.maxstring, _brief.maxother, _brief.maxlist, _brief.maxdict = 3, 60, 60, 8, 4


class BadRequest(Exception):
    """A request this server cannot answer as asked: HTTP 400 with the message."""


def shown(value: object) -> str:
    """A client's value in a message, bounded in length and depth."""
    return _brief.repr(value)


def _same(value: object, neutral: object) -> bool:
    """JSON equality that keeps booleans apart from numbers (`true` is not `1`)."""
    return (isinstance(value, bool) == isinstance(neutral, bool)
            and isinstance(value, (int, float)) == isinstance(neutral, (int, float))
            and value == neutral)


def refuse_unhonoured(body: Mapping[str, Any]) -> None:
    """A 400 for the first field this server cannot honour (see the module docstring)."""
    for name, value in body.items():
        if name in HONOURED or value is None:
            continue
        if name not in NEUTRAL:
            raise BadRequest(f"unknown parameter {shown(name)}: this server answers only what it can honour "
                             f"(greedy completions; see kvparity's docs/audits.md)")
        accepted, why = NEUTRAL[name]
        if not any(_same(value, a) for a in accepted):
            raise BadRequest(f"{name}={shown(value)}: {why}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {shown(value)}")
    return bool(value)


@attrs.frozen
class Completion:
    """One request, as this server will run it."""

    model: str  # the name answered with: the base model's or an adapter's
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: tuple[int, ...]
    identity: Identity
    logprobs: int | None  # top-n alternatives per token; 0: the chosen token's logprob only
    ids: bool  # return_token_ids
    as_ids: bool  # return_tokens_as_token_ids
    stream: bool = False  # answered as server-sent events, a chunk per engine step


def _prompt(raw: object, tokenizer) -> tuple[int, ...]:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (list, str)):
        raw = raw[0]  # a batch of one prompt
    if isinstance(raw, str):
        return tuple(tokenizer.encode(raw, add_special_tokens=False).ids)
    if isinstance(raw, list) and all(_is_int(t) for t in raw):
        return tuple(raw)
    raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)")


def _stop_ids(raw: object, vocab: int) -> tuple[int, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(_is_int(t) for t in raw):
        raise BadRequest(f"stop_token_ids must be a list of token ids, got {shown(raw)}")
    outside = [t for t in raw if not 0 <= t < vocab]
    if outside:
        raise BadRequest(f"stop_token_ids {shown(outside)}: outside the vocabulary [0, {vocab})")
    return tuple(raw)


def parse(body: object, *, model_name: str, adapters: Iterable[str], tokenizer, vocab: int, revision: str,
          salt_of) -> Completion:
    """The request `body` as a `Completion`, or `BadRequest`; `salt_of(cache_salt, user)` is the cache scope."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    refuse_unhonoured(body)
    model = model_name if body.get("model") is None else body["model"]
    if not isinstance(model, str):
        raise BadRequest(f"model must be a string, got {shown(model)}")
    adapter = None
    if model != model_name:
        if model not in set(adapters):
            raise BadRequest(f"model {shown(model)} is not served; see GET /v1/models")
        adapter = model
    prompt = _prompt(body.get("prompt"), tokenizer)
    max_tokens = body.get("max_tokens", 16)
    if not _is_int(max_tokens):
        raise BadRequest(f"max_tokens must be an integer, got {shown(max_tokens)}")
    if body.get("seed") is not None and not _is_int(body["seed"]):
        raise BadRequest(f"seed must be an integer, got {shown(body['seed'])}")
    salt, user = body.get("cache_salt"), body.get("user")
    for name, value in (("cache_salt", salt), ("user", user)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{name} must be a string")
    logprobs = body.get("logprobs")
    if logprobs is not None and not (_is_int(logprobs) and 0 <= logprobs <= MAX_LOGPROBS):
        raise BadRequest(f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {shown(logprobs)}")
    return Completion(model, prompt, max_tokens, _stop_ids(body.get("stop_token_ids"), vocab),
                      Identity(revision, adapter, salt_of(salt, user)), logprobs,
                      _flag(body, "return_token_ids"), _flag(body, "return_tokens_as_token_ids"),
                      _flag(body, "stream"))
