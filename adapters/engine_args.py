"""Parsing engine arguments. They arrive as strings (`--engine-arg k=v`); a bad one is a `UsageError`
naming the argument, never a crash deep inside an engine."""

from __future__ import annotations

from typing import Any, Callable, Sequence

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
