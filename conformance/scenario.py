"""The steps a scenario is made of, and how a step is written to (and read from) a history.

A scenario is a tuple of steps: `Configure`, `Reset`, `Batch` (requests and continuations, in arrival
order). The runner always starts a scenario with a reset, so every example begins cold.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

from attrs import evolve, field, frozen

from conformance.contract import Identity, Request, _tuple_of_ints

MAX_PROMPT = 200
MAX_NEW = 12


@frozen
class Configure:
    config: Mapping[str, Any] = field(factory=dict)


@frozen
class Reset:
    pass


@frozen
class Continuation:
    """Next turn of a conversation: parent's prompt + parent's output + `extra`, resolved at run time.

    With `restop=j` it is instead the parent's own text again, stopping at the token the parent produced
    at output position j (or the latest before it that can fire there), resumed just past that token's
    previous occurrence in the output (see `scenario_runner.restop_turn`): a stop id that surely fires
    past position 0, where a random one almost never does — so stop handling on a warm cache, in a draft
    run or a reused engine session is exercised, with the parent's output up to the stop in the turn
    (where a model repeats itself, a drafter gets drafts accepted before the stop)."""

    id: str
    parent: str
    extra: tuple[int, ...] = field(converter=_tuple_of_ints)
    max_tokens: int
    stop_ids: tuple[int, ...] = field(default=(), converter=_tuple_of_ints)
    identity: Identity = field(factory=Identity)
    max_prompt: int = MAX_PROMPT
    restop: int | None = None


@frozen
class Batch:
    items: tuple[Union[Request, Continuation], ...] = field(converter=tuple)


Step = Union[Configure, Reset, Batch]

def renamed(item: Union[Request, Continuation], new_id: str, top: int) -> Union[Request, Continuation]:
    """`item` again under a new id, its prompt kept within `top` (a smaller configuration may hold less
    than the one it was first sent under). A resend is plain: the timeline it was first sent with (an
    arrival step, an abort point) is not carried over."""
    if isinstance(item, Continuation):
        return evolve(item, id=new_id, max_prompt=min(item.max_prompt, top))
    return evolve(item, id=new_id, prompt=item.prompt[:top], arrive_at_step=None, abort_after=None)


# --------------------------------------------------------------------------- (de)serialising steps


def step_to_json(step: Step) -> dict[str, Any]:
    from conformance.history_codec import encode

    if isinstance(step, Configure):
        return {"step": "configure", "config": encode(dict(step.config))}
    if isinstance(step, Reset):
        return {"step": "reset"}
    return {"step": "batch", "requests": [dict(encode(i), kind=type(i).__name__) for i in step.items]}


def step_from_json(d: Mapping[str, Any]) -> Step:
    """Inverse of `step_to_json`; also reads the resolved steps `history.Example.steps()` returns."""
    from conformance.history_codec import identity_from, request_from

    kind = d["step"]
    if kind == "configure":
        return Configure(dict(d.get("config") or {}))
    if kind == "reset":
        return Reset()
    items: list[Union[Request, Continuation]] = []
    for r in d["requests"]:
        if r.get("kind") == "Continuation":
            items.append(Continuation(r["id"], r["parent"], r["extra"], int(r["max_tokens"]), r.get("stop_ids", ()),
                                      identity_from(r.get("identity")), int(r.get("max_prompt", MAX_PROMPT)),
                                      r.get("restop")))
        else:
            items.append(request_from(r))
    return Batch(items)
