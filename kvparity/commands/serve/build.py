"""A `kvparity serve` server from its arguments: the same engine arguments and fault zoo as the in-process
reference adapter (`adapters.reference`), so a fault planted here is exactly the fault
`--engine reference --engine-arg fault=NAME` runs."""

from __future__ import annotations

from typing import Mapping

from kvparity.commands.serve.app import SCOPES, CompletionServer
from kvparity.commands.serve.loop import EngineLoop


def build(*, scope: str = "tenant", fault: str | None = None, engine_args: Mapping[str, str] | None = None,
          revision: str = "a", model_name: str = "kvparity") -> CompletionServer:
    """A server (not yet listening) over a fresh engine; bad arguments raise `UsageError`."""
    from adapters.reference import engine_config, shared_registry
    from conformance.contract import UsageError
    from reference_engine import checkpoints
    from reference_engine.faults import FAULTS, build_engine

    if scope not in SCOPES:
        raise UsageError(f"--cache-scope {scope!r}: choose {', '.join(SCOPES)}")
    if fault is not None and fault not in FAULTS:
        raise UsageError(f"--fault {fault!r}: unknown fault; known: {', '.join(sorted(FAULTS))}")
    if revision not in checkpoints.REVISIONS:
        raise UsageError(f"--revision {revision!r}: shipped revisions are {sorted(checkpoints.REVISIONS)}")
    config = engine_config(dict(engine_args or {}))
    registry = shared_registry()
    engine = build_engine(config, registry, fault)
    return CompletionServer(EngineLoop(engine), registry, checkpoints.load_tokenizer(), revision=revision,
                            scope=scope, model_name=model_name, fault=fault)
