"""A request stream while it is being drawn, and the kinds of step that extend it."""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Mapping, Union

from attrs import frozen
from hypothesis import strategies as st

from conformance.contract import Capabilities, Request
from conformance.domains import (all_identities, at_context_end, configs, derived_salts,
                                 max_prompt_len, max_tokens, one_binding_per_adapter, prompt_lengths, roots, sampled,
                                 spec_knobs, stop_ids, token_lists)
from conformance.scenario import Batch, Configure, Continuation, Step


class Stream:
    """A request stream while it is being drawn: what the step kinds build on — the shared roots, the
    identities, the requests sent so far (`pool`), the configuration in effect and the steps so far.

    One object for `scenarios` (a whole stream drawn up front) and the state machine (a live session),
    so the two draw the same kinds of step the same way. `draw` is Hypothesis' draw function of the
    moment (a composite's `draw`, or `data.draw` inside a rule)."""

    def __init__(self, draw: st.DrawFn, caps: Capabilities, max_batch: int = 4, id_prefix: str = "r") -> None:
        self.draw, self.caps, self.max_batch, self.id_prefix = draw, caps, max_batch, id_prefix
        self.top = max_prompt_len(caps)
        self.limit = caps.context_limit()  # tokens one request may take in the configuration in effect
        self.roots = draw(roots(caps))
        self.identities = all_identities(caps, draw(derived_salts(caps)))
        self.ident = sampled(self.identities)
        self._ids = itertools.count()
        self.steps: list[Step] = []
        self.pool: list[Union[Request, Continuation]] = []
        self.bs = caps.block_size  # the block size and longest prompt in effect (a Configure may change them)
        self.current: dict[str, Any] = {}  # the configuration in effect
        self.spec = spec_knobs(caps)

    def next_id(self) -> str:
        return f"{self.id_prefix}{next(self._ids)}"

    def requests_in_pool(self) -> list[Request]:
        return [p for p in self.pool if isinstance(p, Request)]

    def fresh_request(self) -> Request:
        """A new request: its prompt a shared root cut or extended to a drawn length. One in four fills
        the context in effect (two fair booleans), the far end of the length domain."""
        draw, caps = self.draw, self.caps
        budget = draw(max_tokens(caps))
        if draw(st.booleans()) and draw(st.booleans()):
            length = draw(at_context_end(budget, self.limit, caps.refuses))
        else:
            length = draw(prompt_lengths(caps, self.top))
        which = draw(st.integers(0, len(self.roots)))
        base = self.roots[which] if which < len(self.roots) else ()
        prompt = base[:length] if len(base) >= length else base + draw(token_lists(caps, length - len(base)))
        return Request(self.next_id(), prompt, budget, draw(stop_ids(caps)), draw(self.ident))

    def fit(self, item: Union[Request, Continuation]) -> int:
        """The longest prompt `item` may keep when sent again here: what the context in effect leaves
        after its max_tokens (a request that filled a larger context is cut to fill this one)."""
        if isinstance(item, Continuation):
            return self.top
        return max(1, self.limit - item.max_tokens) if len(item.prompt) > self.top else self.top

    def configure(self, config: Mapping[str, Any] | None = None) -> None:
        self.assume(self.draw(configs(self.caps)) if config is None else config)
        self.steps.append(Configure(self.current))

    def assume(self, config: Mapping[str, Any]) -> None:
        """Draw from here on for `config` (the block size and longest prompt it allows)."""
        self.current = dict(config)
        self.bs = int(self.current.get("block_size", self.caps.block_size))
        self.top = max_prompt_len(self.caps, self.current)
        self.limit = self.caps.context_limit(self.current)

    def respeculate(self) -> None:
        """Another value of one speculation knob, every other knob as configured."""
        knob = self.draw(sampled(self.spec))
        others = [v for v in self.caps.config_space[knob] if str(v) != str(self.current.get(knob))]
        self.configure({**self.current, knob: self.draw(sampled(others))})

    def pick_from_pool(self) -> list[Union[Request, Continuation]]:
        return self.draw(_some_of(tuple(self.pool), self.max_batch))

    def add_batch(self, items: tuple) -> None:
        items = one_binding_per_adapter(items)
        self.steps.append(Batch(items))
        self.pool.extend(items)

def _item_id(item: Union[Request, Continuation]) -> str:
    return item.id


@functools.lru_cache(maxsize=1024)
def _some_of(pool: tuple, most: int) -> st.SearchStrategy[list]:
    """One to `most` distinct items of `pool` (built once per pool: see `domains.sampled`)."""
    return st.lists(sampled(pool), min_size=1, max_size=most, unique_by=_item_id)


@frozen
class StepKind:
    """One kind of step: when it can be drawn (`applies`) and how (`build` returns the batch's items, or
    None for a step that sends nothing, having appended its own Configure or Reset)."""

    name: str
    build: Callable[[Stream], tuple | None]
    applies: Callable[[Stream], bool] = lambda s: True
