"""Reproducers for the reference engine: `reference_engine.faults.build_engine` with the witness's
`EngineConfig`, `Engine.generate`, `Engine.flush`, `Engine.snapshot` — what adapters/reference.py drives,
with every engine argument resolved at export time into the `EngineConfig` fields it stands for (so the
script needs no knob parsing). The script imports `reference_engine` (the engine itself) and nothing of
kvparity; `--fault NAME|none` runs it with another fault of the zoo planted, or none."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

from conformance.contract import Baseline, Request, UsageError

NEEDS = ("the reference engine: the `reference_engine` package with its checkpoints (from a kvparity checkout:\n"
         "PYTHONPATH=<checkout>) and what it needs (torch, attrs, safetensors, tokenizers)")

DRIVER = r'''
# --- the engine: reference_engine, driven as adapters/reference.py drives it ---
class Driver:
    OPTIONS = [("--fault", {"default": None, "help": "the fault of the zoo to plant (none: the correct engine); "
                            "default: the witness's"})]

    def __init__(self, params, args):
        import torch
        from reference_engine.model_registry import ModelRegistry
        from reference_engine.weights import Weights

        fault = params["fault"] if args.fault is None else args.fault
        self.fault = None if str(fault).lower() in ("", "none", "off") else fault
        self.registry = ModelRegistry(weights=Weights(torch.float64))
        self.configure(params["config"])

    def configure(self, config):
        from reference_engine.config import EngineConfig
        from reference_engine.faults import build_engine

        self.engine = build_engine(EngineConfig(**config), self.registry, self.fault)

    def reset(self):
        self.engine.flush()

    def _identity(self, identity):
        from reference_engine.sequence import Identity

        if identity["adapter"] is not None and identity["adapter_digest"]:
            self.registry.bind_adapter(identity["adapter"], identity["adapter_digest"])  # an in-place reload
        return Identity(identity["revision"], identity["adapter"], identity["salt"])

    def run(self, requests):
        from reference_engine.engine import Request

        batch = [Request(q["id"], q["prompt"], q["max_tokens"], q["stop_ids"], self._identity(q["identity"]))
                 for q in requests]
        return [{"output": list(rep.output), "finish_reason": rep.finish_reason, "cached_tokens": rep.cached_tokens,
                 "draft_proposed": rep.draft_proposed, "draft_accepted": rep.draft_accepted,
                 "evictions": rep.evictions} for rep in self.engine.generate(batch)]

    def snapshot(self):
        return self.engine.snapshot()

    def close(self):
        self.engine = None
'''


def _config(knobs: Mapping[str, Any]) -> dict[str, Any]:
    from adapters.reference import engine_config

    return attrs.asdict(engine_config(knobs))


def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
    from adapters.reference import DEFAULTS

    knobs = {k: v for k, v in args.items() if k != "fault"}
    fault = args.get("fault")
    return {"fault": None if fault is None or str(fault).lower() in ("", "none", "off") else str(fault),
            "config": _config({**DEFAULTS, **knobs})}


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """What `ReferenceAdapter.configure` builds: the engine arguments, overridden by the step's knobs."""
    from adapters.reference import DEFAULTS

    knobs = {k: v for k, v in args.items() if k != "fault"}
    return _config({**DEFAULTS, **knobs, **{k: str(v) for k, v in config.items()}})


def check_request(args: Mapping[str, str], request: Request) -> None:
    """Every identity the suite draws is expressible here (salt, adapter and digest, revision)."""


def oracle(args: Mapping[str, str], caps: Any) -> tuple[Callable[[Request], Baseline], Callable[[], None]]:
    """The adapter's own baseline (float64 greedy on the very weights, adapter reloads included), from an
    adapter without the fault: the oracle never runs the planted bug."""
    from adapters.reference import ReferenceAdapter

    try:
        adapter = ReferenceAdapter(**{k: v for k, v in args.items() if k != "fault"})
    except (TypeError, ValueError) as exc:
        raise UsageError(f"reference engine arguments {dict(args)}: {exc}") from exc
    return adapter.baseline, adapter.close
