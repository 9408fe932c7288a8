"""Find and construct engine adapters lazily (lm-evaluation-harness style).

Built-in and third-party adapters are found the same way: entry points in the group `kvparity.adapters`
(`name = "package.module:Class"`). Nothing is imported until an adapter is chosen, so `kvparity engines`
works without vLLM or llama.cpp installed. `module:Class` names an adapter directly, for adapters that
are not installed as a distribution (and for the suite's own tests).

Adapters are classes constructed as `Cls(**engine_args)`; every value is a string (from `--engine-arg
k=v`), and the adapter parses its own arguments.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from importlib import metadata
from typing import Any, Iterable, Mapping

from conformance.calls import one_line
from conformance.contract import Engine, EngineError, UsageError

GROUP = "kvparity.adapters"


def entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def known_engines() -> dict[str, str]:
    """name -> "module:Class" for every registered adapter (nothing imported)."""
    return {name: ep.value for name, ep in sorted(entry_points().items())}


def parse_engine_args(pairs: Iterable[str]) -> dict[str, str]:
    """`["k=v", ...]` -> `{"k": "v"}`; a pair without `=`, an empty key or a key given twice is a usage
    error (silently keeping the last of two values would test a configuration nobody asked for)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --engine-arg {pair!r}: expected KEY=VALUE")
        if key.strip() in out:
            raise UsageError(f"--engine-arg {key.strip()} given twice ({out[key.strip()]!r} and {value!r})")
        out[key.strip()] = value
    return out


def resolve(name: str) -> type:
    """The adapter class for an entry-point name or a `module:Class` path."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(f"cannot import adapter module {module_name!r}: {exc}") from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no adapter {attr!r}") from None
    eps = entry_points()
    if name not in eps:
        close = difflib.get_close_matches(name, list(eps), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(sorted(eps)) or "none installed"
        raise UsageError(f"unknown engine {name!r}{hint}; known engines: {known}")
    try:
        return eps[name].load()
    except ImportError as exc:
        raise UsageError(f"engine {name!r} is registered but cannot be imported ({exc}); "
                         f"is its optional dependency installed?") from exc


def load_engine(name: str, engine_args: Mapping[str, str] | None = None) -> Engine:
    """Construct the adapter `name` with `engine_args`. Unknown names and arguments the adapter does not
    accept are usage errors; an adapter that fails while starting its engine is an engine error."""
    cls = resolve(name)
    args = dict(engine_args or {})
    try:
        inspect.signature(cls).bind(**args)
    except TypeError as exc:
        params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        raise UsageError(f"bad engine arguments for {name!r}: {exc}; accepted: {', '.join(params) or 'none'}") from None
    except ValueError:
        pass  # no introspectable signature (a C extension); let the call decide
    try:
        engine: Any = cls(**args)
    except (UsageError, EngineError):
        raise
    except (TypeError, ValueError) as exc:
        raise UsageError(f"bad engine arguments for {name!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise EngineError(f"engine {name!r} failed to start: {type(exc).__name__}: {one_line(exc)}") from exc
    missing = [m for m in ("capabilities", "configure", "run", "reset", "baseline", "close")
               if not callable(getattr(engine, m, None))]
    if missing:
        raise UsageError(f"{name!r} does not implement the Engine contract (missing {', '.join(missing)})")
    return engine
