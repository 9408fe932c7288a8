"""Parsing engine arguments. They arrive as strings (`--engine-arg k=v`); a bad one is a `UsageError`
naming the argument, never a crash deep inside an engine."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence, TypeVar

import attrs

from conformance.contract import UsageError

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "none")


def bool_arg(name: str, value: Any) -> bool:
    s = str(value).strip().lower()
    if s in TRUE:
        return True
    if s in FALSE:
        return False
    raise UsageError(f"engine argument {name}={value!r}: say true or false")


def num_arg(name: str, value: Any, cast: Callable[[Any], Any] = float, lo: float = 0):
    try:
        v = cast(value)
    except (TypeError, ValueError):
        raise UsageError(f"engine argument {name}={value!r} is not {'an integer' if cast is int else 'a number'}") from None
    if v < lo:
        raise UsageError(f"engine argument {name}={v} must be >= {lo}")
    return v


def int_arg(name: str, value: Any, lo: int = 1, allow_none: bool = False) -> int | None:
    """An integer >= lo; with `allow_none`, "none" / "off" / "" (or None) mean no value."""
    if allow_none and (value is None or str(value).strip().lower() in ("none", "off", "")):
        return None
    return num_arg(name, value, int, lo)


def choice_arg(name: str, value: Any, allowed: Sequence[str]) -> str:
    """One of `allowed` (compared in lower case)."""
    s = str(value).lower()
    if s not in allowed:
        raise UsageError(f"engine argument {name}={value!r}: choose one of {', '.join(allowed)}")
    return s


def list_arg(value: Any) -> list[str]:
    return [s.strip() for s in str(value or "").replace(";", ",").split(",") if s.strip()]


# --------------------------------------------------------------------------- attrs converters
# Each adapter's arguments are a frozen attrs class (`ReferenceArgs`, `VllmArgs`, ...) whose fields
# convert the command line's strings with these: the converter knows its field's name, so a bad value is
# one UsageError line naming the argument, raised where the arguments are parsed, before any engine starts.


def to_bool() -> attrs.Converter:
    return attrs.Converter(lambda v, f: v if isinstance(v, bool) else bool_arg(f.name, v), takes_field=True)


def to_int(lo: int = 1, allow_none: bool = False) -> attrs.Converter:
    return attrs.Converter(lambda v, f: int_arg(f.name, v, lo, allow_none), takes_field=True)


def to_num(lo: float = 0) -> attrs.Converter:
    return attrs.Converter(lambda v, f: num_arg(f.name, v, float, lo), takes_field=True)


def to_choice(allowed: Sequence[str]) -> attrs.Converter:
    return attrs.Converter(lambda v, f: choice_arg(f.name, v, allowed), takes_field=True)


def to_list() -> attrs.Converter:
    """A comma (or semicolon) list as a tuple; a tuple or list given as is stays one."""
    return attrs.Converter(lambda v: tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else tuple(list_arg(v)))


def to_opt_str() -> attrs.Converter:
    """A string, or None for "", "none" and "off" (and None)."""
    return attrs.Converter(lambda v: None if v is None or str(v).strip().lower() in ("", "none", "off") else str(v))


A = TypeVar("A")


def engine_arguments(cls: type) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorates an adapter's `__init__(self, args=None, **engine_args)` with the signature of the engine
    arguments it accepts: each field of the arguments class `cls`, with its default as the command line
    would say it. Tools that read an adapter's arguments from its constructor (`inspect.signature`, the
    `kvparity export` settings) see them as before the arguments became a class."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(a.alias or a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default)
               for a in attrs.fields(cls) if a.init]

    def mark(init: Callable[..., None]) -> Callable[..., None]:
        init.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return init

    return mark


def parse(cls: type[A], engine: str, args: Mapping[str, Any]) -> A:
    """`cls(**args)` for the engine arguments of engine `engine`: an argument the class does not name is
    a UsageError listing the known ones (not a TypeError from deep in attrs)."""
    known = [a.alias or a.name for a in attrs.fields(cls) if a.init]
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise UsageError(f"unknown {engine} engine argument(s) {unknown}; known: {', '.join(known)}")
    return cls(**args)
