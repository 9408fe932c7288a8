"""The HTTP adapter's engine arguments as one typed, frozen value (`OpenAIHttpArgs`).

They arrive as strings (`--engine-arg serve=kvparity`); each field converts its own and a bad one is a
one-line UsageError naming it, before any server starts. What depends on several arguments (exactly one
of base_url= and serve=; spec= only with serve=vllm; ...) is checked once the value is whole. The
adapter's documentation of each argument is the module docstring of adapters/openai_http/adapter.py.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import attrs
from attrs import field, frozen

from adapters.engine_args import bool_arg, int_arg, list_arg, num_arg, to_bool, to_choice, to_int, to_num, to_opt_str
from conformance.contract import UsageError

SERVES = ("vllm", "llama_cpp", "kvparity")


def _serve(value: Any) -> str:
    s = str(value or "")
    if s not in ("", *SERVES):
        raise UsageError(f"serve={s!r}: choose vllm, llama_cpp or kvparity")
    return s


def _auto_bool(value: Any, f: attrs.Attribute) -> bool | None:
    """true / false, or None for "auto" (decided from the other arguments)."""
    if value is None or isinstance(value, bool):
        return value
    return None if str(value).strip().lower() == "auto" else bool_arg(f.name, value)


def _adapters(value: Any) -> tuple[str, ...] | None:
    """A comma list of served LoRA names, or None for "auto"."""
    if value is None or isinstance(value, tuple):
        return value
    return None if str(value).strip().lower() == "auto" else tuple(list_arg(value))


def _budget(value: Any) -> int | None:
    if value is None or str(value).strip().lower() in ("none", ""):
        return None
    return int_arg("max_num_batched_tokens", value, 32)


def _tolerance(value: Any) -> float | None:
    if value is None or str(value) == "auto":
        return None
    return num_arg("tolerance", value)


def _extra_body(value: Any) -> Mapping[str, Any]:
    """A JSON object merged into every completion body ("" is none)."""
    if isinstance(value, Mapping):
        return dict(value)
    try:
        body = json.loads(value) if value else {}
    except ValueError:
        raise UsageError(f"extra_body={value!r} is not JSON") from None
    if not isinstance(body, dict):
        raise UsageError("extra_body= must be a JSON object")
    return body


def _knobs(value: Any) -> Mapping[str, str]:
    """`chunk_size:5,pool_tokens:64` -> {"chunk_size": "5", "pool_tokens": "64"} (checked by the server)."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    out = {}
    for part in filter(None, (p.strip() for p in str(value or "").split(","))):
        key, sep, val = part.partition(":")
        if not sep or not key:
            raise UsageError(f"knobs={value!r}: expected KNOB:VALUE,KNOB:VALUE")
        out[key.strip()] = val.strip()
    return out


@frozen
class OpenAIHttpArgs:
    """Every engine argument of the HTTP adapter, converted and checked. Defaults are written as the
    command line would say them (converted like any argument). None means "auto" where the argument has
    an auto setting (salt, adapters, logprobs, tolerance): the adapter decides it from the server."""

    base_url: str = field(default="", converter=str)
    serve: str = field(default="", converter=_serve)
    model: str = field(default="", converter=str)
    prompt_mode: str = field(default="tokens", converter=to_choice(("tokens", "text")))
    salt: bool | None = field(default="auto", converter=attrs.Converter(_auto_bool, takes_field=True))
    adapters: tuple[str, ...] | None = field(default="auto", converter=_adapters)
    lora: bool = field(default="true", converter=to_bool())
    reset: str = field(default="auto", converter=to_choice(("auto", "endpoint", "salt", "none")))
    spec: str = field(default="none", converter=to_choice(("none", "ngram", "draft")))
    k: int = field(default=3, converter=to_int())
    max_num_batched_tokens: int | None = field(default="none", converter=_budget)
    block_size: int = field(default=32, converter=to_int())
    timeout: float = field(default=120, converter=to_num(1))
    startup_timeout: float = field(default=600, converter=to_num(1))
    tolerance: float | None = field(default="auto", converter=_tolerance)
    logprobs: bool | None = field(default="auto", converter=attrs.Converter(_auto_bool, takes_field=True))
    gguf: str = field(default="", converter=str)
    port: int = field(default=0, converter=to_int(0))
    revision: str = field(default="a", converter=str)
    name: str = field(default="", converter=str)
    extra_body: Mapping[str, Any] = field(default="", converter=_extra_body)
    scope: str = field(default="tenant", converter=str)
    fault: str | None = field(default="", converter=to_opt_str())
    knobs: Mapping[str, str] = field(default="", converter=_knobs)
    arrival: str = field(default="stagger", converter=to_choice(("stagger", "serial")))
    stagger_ms: float = field(default=10, converter=to_num(0))

    def __attrs_post_init__(self) -> None:
        """What no single argument can say alone."""
        from reference_engine import checkpoints

        if bool(self.base_url) == bool(self.serve):
            raise UsageError("give exactly one of base_url=URL (attach) or serve=vllm|llama_cpp|kvparity (start a server)")
        if self.serve != "kvparity" and (self.fault or self.knobs or self.scope != "tenant"):
            raise UsageError("scope=, fault= and knobs= only apply with serve=kvparity")
        if self.spec != "none" and self.serve != "vllm":
            raise UsageError("spec= only applies with serve=vllm")
        if self.revision not in checkpoints.REVISIONS:
            raise UsageError(f"revision={self.revision!r}: shipped revisions are {sorted(checkpoints.REVISIONS)}")

    # -- the "auto" settings, decided -----------------------------------------------------------
    def effective_prompt_mode(self) -> str:
        """llama-cpp-python's server rejects token-id prompts: text there, whatever was asked."""
        return "text" if self.serve == "llama_cpp" else self.prompt_mode

    def effective_tolerance(self, default: float) -> float:
        """kvparity serve computes on the oracle's own float64 weights: exact (0) unless told otherwise."""
        if self.tolerance is not None:
            return self.tolerance
        return 0.0 if self.serve == "kvparity" else default

    def effective_logprobs(self) -> bool:
        """Off with serve=kvparity, whose logprobs are a recompute (kvparity/commands/serve/app.py)."""
        return (self.serve != "kvparity") if self.logprobs is None else self.logprobs

    def effective_salt(self) -> bool:
        return self.serve in ("vllm", "kvparity") if self.salt is None else self.salt
