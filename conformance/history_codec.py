"""Values of a history line, both ways: contract value types -> JSON-able data (`encode`), and back
(`request_from`, `result_from`, `baseline_from`, `capabilities_from`), including the keys and fields of
histories written by earlier versions (`legacy_knob_role`, `current_key`, results whose scheduling facts
were in `extra`), so that an old history is re-read the way it was first analysed.

Apart from the history's reading and building (`conformance.history`) because the two change for
different reasons: the codec when a contract type gains a field, the reader when the event stream does.
"""

from __future__ import annotations

import functools
from collections import abc
from typing import Any, Mapping

import attrs

from conformance import untrusted
from conformance.contract import Baseline, Capabilities, Identity, Request, Result
from conformance.knobs import LEGACY_KNOB_MAPS, OFF_SPELLINGS, Knob

_SCALARS = frozenset({str, int, float, bool, type(None)})
_NUMBERS = frozenset({int, float})


@functools.cache
def _attrs_fields(cls: type) -> tuple[str, ...] | None:
    return tuple(a.name for a in attrs.fields(cls)) if attrs.has(cls) else None


def encode(obj: Any) -> Any:
    """Contract value -> JSON-able data (tuples become lists, frozensets sorted lists).

    On the run path: every event goes through here, so the common shapes (scalars, token lists,
    contract values) are tested first, by exact type."""
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t is tuple or t is list:
        # token lists, top-2 rows and (id, logprob) pairs: flat numbers, copied as they are
        return list(obj) if all(type(v) in _NUMBERS for v in obj) else [encode(v) for v in obj]
    names = _attrs_fields(t)
    if names is not None:
        return {n: encode(getattr(obj, n)) for n in names}
    if isinstance(obj, (frozenset, set)):
        return sorted(encode(v) for v in obj)
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, abc.Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (bool, int, float, str)):  # subclasses: a str Enum is its value
        return obj
    return repr(obj)


def json_default(obj: Any) -> Any:
    """`encode` for what `json.dumps` cannot write itself (`default=`): contract values, sets, other
    mappings and, as a repr, anything else. The history writes every event this way: the JSON encoder
    walks the token lists and logprob rows in C, and only the contract values cost Python. (Keys of
    plain dicts follow JSON's rules; an engine's are strings, validated at the boundary.)"""
    names = _attrs_fields(type(obj))
    if names is not None:
        return {n: getattr(obj, n) for n in names}
    if isinstance(obj, abc.Mapping):
        return {str(k): v for k, v in obj.items()}
    return encode(obj)


def identity_from(d: Mapping[str, Any] | None) -> Identity:
    return Identity(**d) if d else Identity()


def request_from(d: Mapping[str, Any]) -> Request:
    return Request(id=d["id"], prompt=d["prompt"], max_tokens=int(d["max_tokens"]),
                   stop_ids=d.get("stop_ids", ()), identity=identity_from(d.get("identity")),
                   arrive_at_step=_opt_int(d.get("arrive_at_step")), abort_after=_opt_int(d.get("abort_after")))


def _opt_int(v: Any) -> int | None:
    """A timeline field: absent in histories written before timelines (issue 30), None there."""
    return None if v is None else int(v)


def result_from(d: Mapping[str, Any]) -> Result:
    top2 = d.get("top2")
    extra = dict(d.get("extra") or {})
    # Histories written before the scheduling facts were typed fields carried them in `extra`.
    chunks = d.get("prefill_chunks", extra.get("prefill_chunks"))
    if chunks is None and extra.get("chunked") is not None:
        chunks = 2 if extra["chunked"] else 1
    return Result(request_id=d["request_id"], output=d["output"], finish_reason=d["finish_reason"],
                  cached_tokens=d.get("cached_tokens"), draft_proposed=d.get("draft_proposed"),
                  draft_accepted=d.get("draft_accepted"),
                  top2=None if top2 is None else tuple(tuple(t) for t in top2),
                  timings=dict(d.get("timings") or {}), evictions=d.get("evictions", extra.get("evictions")),
                  prefill_chunks=chunks, preempted=d.get("preempted", extra.get("preempted")), extra=extra,
                  arrived_at_step=_opt_int(d.get("arrived_at_step")), ended_at_step=_opt_int(d.get("ended_at_step")),
                  logprobs=d.get("logprobs"))  # absent in histories written before logprobs existed


def baseline_from(d: Mapping[str, Any]) -> Baseline:
    return Baseline(output=d["output"], finish_reason=d["finish_reason"], margins=d.get("margins", ()),
                    runner_up=d.get("runner_up", ()), contenders=d.get("contenders", ()),
                    logprobs=d.get("logprobs", ()))


def capabilities_from(d: Mapping[str, Any]) -> Capabilities:
    """A recorded `Capabilities`. Histories record `knobs`; older ones the four per-knob maps
    (`config_space`, ...), which `Capabilities` converts to knobs; the oldest no `knob_roles`."""
    d = dict(d)
    d["revisions"] = tuple(d.get("revisions", ("a",)))
    d["adapters"] = tuple(d.get("adapters", ()))
    if "knobs" in d:
        d["knobs"] = tuple(Knob.from_json(k) for k in d["knobs"] or ())
    else:
        d["config_space"] = {k: tuple(v) for k, v in (d.get("config_space") or {}).items()}
        d["prefix_caching_off"] = {k: tuple(v) for k, v in (d.get("prefix_caching_off") or {}).items()}
        if "knob_roles" not in d:  # written before knobs declared their roles
            d["knob_roles"] = {k: legacy_knob_role(k) for k in d["config_space"]}
            d["prefix_caching_off"] = {k: OFF_SPELLINGS for k in d["config_space"]
                                       if "prefix" in k.lower()}
    known = {a.name for a in attrs.fields(Capabilities)} | set(LEGACY_KNOB_MAPS)
    return Capabilities(**{k: v for k, v in d.items() if k in known})


def legacy_knob_role(name: str) -> str:
    """The role that histories written before `Capabilities.knob_roles` existed were judged by: guessed
    from the knob's name. Used only to re-read those histories the way they were first analysed."""
    n = name.lower()
    if any(s in n for s in ("spec", "draft", "assist", "lookup", "ngram", "gamma")) or n in ("k", "num_k"):
        return "speculation"
    if any(s in n for s in ("cache", "block", "pool", "evict", "memory", "kv", "prefix")):
        return "cache"
    return "schedule"


@functools.lru_cache(maxsize=1 << 16)
def oracle_key_str(request: Request) -> str:
    """The oracle key as a stable string (JSON object keys must be strings): the repr of a tuple of
    strings, None and ints, which is deterministic and far cheaper than JSON. Kept per request (a request
    hashes faster than its key prints): the checks, the oracle and the history ask for it again and again."""
    return repr(request.oracle_key())


def current_key(key: str) -> str:
    """Histories written before keys were reprs stored them as JSON lists; read them as today's."""
    if not key.startswith("["):
        return key
    revision, adapter, digest, prompt, max_tokens, stop_ids = untrusted.loads(key, "a baseline key")
    return repr((revision, adapter, digest, tuple(int(t) for t in prompt), int(max_tokens),
                 tuple(int(t) for t in stop_ids)))


def alone_pairs(raw: Any) -> tuple[tuple[int, str], ...] | None:
    """The `alone` field of an `example` event, read as untrusted data: (example, request id) pairs."""
    if not isinstance(raw, list):
        return None
    pairs = tuple((p[0], p[1]) for p in raw if isinstance(p, list) and len(p) == 2
                  and isinstance(p[0], int) and not isinstance(p[0], bool) and isinstance(p[1], str))
    return pairs or None
