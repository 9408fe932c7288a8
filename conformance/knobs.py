"""An engine knob, stated once: its values, the claim a difference in it tests, the values that switch
prefix caching off, and the context each value leaves a request (`Capabilities.knobs`); and the four
per-knob maps of earlier versions, as views of the knobs and converted back into them."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from attrs import field, frozen

# What a difference in a configuration knob tests (Capabilities.knob_roles): the drafter, k or
# speculation on/off; the cache (size, block size, prefix caching on/off); or scheduling (chunk size,
# token budget, batch limits, preemption policy).
KNOB_ROLES = ("speculation", "cache", "schedule")
# How "off" is spelled: what a history recorded before a knob could say which of its values are off is
# read with (the oldest guessed prefix caching's this way; speculation knobs before `Knob.off`).
OFF_SPELLINGS = ("false", "0", "off", "none")


def _limits(limits: Mapping[Any, Any] | Sequence[Sequence[Any]] | None) -> dict[Any, int]:
    items = limits.items() if isinstance(limits, Mapping) else (limits or ())
    return {value: int(n) for value, n in items}


@frozen
class Knob:
    """One engine configuration knob, stated once: everything the strategies and checks need to know
    about it, where earlier versions spread it over four parallel maps of `Capabilities`.

    `values`: what the strategies may configure, the first being what shrinking goes to (the
    declared default). `role`: which claim a difference in it tests, one of KNOB_ROLES (None: undeclared,
    which `validation.capabilities` refuses). `off`: the values that switch the mechanism of its role off —
    prefix caching for a cache knob (the positive control expects no hit under them), speculation for a
    speculation knob (`exercised` asks every other speculation setting to have drafted); recorded as
    `prefix_caching_off` before speculation knobs had them, which is why a knob of no role or a schedule
    role still reads them as prefix caching's. `context_limits`: value -> the most tokens
    (prompt + max_tokens) one request may take under it, for values that hold fewer than `max_context`
    (a KV pool of a few blocks is how an engine is made to evict under short requests, and it cannot
    hold a long one); the strategies keep requests within it."""

    name: str
    values: tuple[Any, ...] = field(converter=tuple)
    role: str | None = None
    off: tuple[Any, ...] = field(default=(), converter=tuple)
    context_limits: Mapping[Any, int] = field(factory=dict, converter=_limits)

    @property
    def prefix_caching_off(self) -> tuple[Any, ...]:
        return () if self.role == "speculation" else self.off

    def switches_off(self, value: Any) -> bool:
        """Whether `value` is one of `off` (compared as lower-case text, as configurations are recorded)."""
        return str(value).lower() in {str(v).lower() for v in self.off}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Knob":
        """A recorded knob. JSON object keys are strings: a context limit's key names the value whose
        str() it is (the same match the strategies' lookup makes)."""
        values = tuple(d.get("values") or ())
        by_str = {str(v): v for v in values}
        limits = {by_str.get(str(k), k): n for k, n in (d.get("context_limits") or {}).items()}
        off = d["off"] if d.get("off") is not None else legacy_off(d.get("role"), values, d.get("prefix_caching_off"))
        return cls(str(d["name"]), values, d.get("role"), tuple(off), limits)


def legacy_off(role: str | None, values: Sequence[Any], prefix_caching_off: Sequence[Any] | None) -> tuple[Any, ...]:
    """What a record or an adapter from before `Knob.off` means by off: prefix caching's values, as
    listed; for a speculation knob, which it had no way to say, its values spelled as off
    (`OFF_SPELLINGS`: `drafter=none`, `k=0`)."""
    if role == "speculation":
        return tuple(v for v in values if str(v).lower() in OFF_SPELLINGS)
    return tuple(prefix_caching_off or ())


def _knob_tuple(knobs: Sequence[Knob | Mapping[str, Any]]) -> tuple[Knob, ...]:
    return tuple(k if isinstance(k, Knob) else Knob.from_json(k) for k in knobs)


# The four per-knob maps of earlier versions: still read (constructor arguments, old histories).
LEGACY_KNOB_MAPS = ("config_space", "knob_roles", "prefix_caching_off", "context_limits")


def knobs_from_maps(config_space: Mapping[str, Sequence[Any]] | None = None,
                    knob_roles: Mapping[str, str] | None = None,
                    prefix_caching_off: Mapping[str, Sequence[Any]] | None = None,
                    context_limits: Mapping[str, Mapping[Any, int]] | None = None) -> tuple[Knob, ...]:
    """The four maps of earlier versions as knobs, in `config_space` order. A context limit keyed by
    str(value) is keyed by that value (a key matching no value is kept as it is). Entries for knobs
    outside `config_space` are dropped: no configuration can name them."""
    roles, off, limits = knob_roles or {}, prefix_caching_off or {}, context_limits or {}
    knobs = []
    for name, values in (config_space or {}).items():
        by_str = {str(v): v for v in values}
        per_value = {by_str.get(str(k), k): n for k, n in (limits.get(name) or {}).items()}
        knobs.append(Knob(name, values, roles.get(name), legacy_off(roles.get(name), values, off.get(name)), per_value))
    return tuple(knobs)


def knob_views(knobs: Sequence[Knob]) -> dict[str, dict[str, Any]]:
    """The four maps of earlier versions, derived from the knobs (what strategies and checks read)."""
    return {name: _VIEWS[name](knobs) for name in LEGACY_KNOB_MAPS}


_VIEWS: dict[str, Callable[[Sequence[Knob]], dict[str, Any]]] = {
    "config_space": lambda knobs: {k.name: k.values for k in knobs},
    "knob_roles": lambda knobs: {k.name: k.role for k in knobs if k.role is not None},
    "prefix_caching_off": lambda knobs: {k.name: k.prefix_caching_off for k in knobs if k.prefix_caching_off},
    "context_limits": lambda knobs: {k.name: {str(v): n for v, n in k.context_limits.items()}
                                     for k in knobs if k.context_limits},
}
