"""A FAKE third-party adapter for the export tests: the reference engine behind the Engine contract, in a
module that imports kvparity only where kvparity alone calls it (capabilities(), baseline(), and the
result type when kvparity is there). So `kvparity export --engine standalone_adapter:SaltAwareReference`
writes a reproducer that imports this module and runs without kvparity installed — what an engine
developer's own adapter can do too. Used from a copy on its own folder (tests/test_reproduction.py).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, Mapping, Sequence

_PlainResult = namedtuple("_PlainResult", "request_id output finish_reason cached_tokens draft_proposed "
                          "draft_accepted evictions")


def _result_type() -> Any:
    """kvparity's Result under kvparity (its validation wants that type); a plain tuple without it."""
    try:
        from conformance.contract import Result
    except ImportError:
        return _PlainResult
    return Result


class SaltAwareReference:
    def __init__(self, fault: str = "none") -> None:
        import torch
        from reference_engine.model_registry import ModelRegistry
        from reference_engine.weights import Weights

        self.fault = None if fault in ("", "none") else fault
        self.registry = ModelRegistry(weights=Weights(torch.float64))
        self.configure({})

    def capabilities(self) -> Any:  # kvparity only
        import attrs

        from adapters.reference import ReferenceAdapter

        adapter = ReferenceAdapter(fault=self.fault or "none")
        return attrs.evolve(adapter.capabilities(), name="standalone", config_space={}, knob_roles={},
                            context_limits={})

    def baseline(self, request: Any) -> Any:  # kvparity only
        from adapters.reference import ReferenceAdapter

        return ReferenceAdapter().baseline(request)

    def configure(self, config: Mapping[str, Any]) -> None:
        from reference_engine.config import EngineConfig
        from reference_engine.faults import build_engine

        sizes = {k: int(v) for k, v in config.items() if k == "block_size"}
        self.engine = build_engine(EngineConfig(**sizes), self.registry, self.fault)

    def reset(self) -> None:
        self.engine.flush()

    def run(self, requests: Sequence[Any]) -> list[Any]:
        from reference_engine.engine import Request
        from reference_engine.sequence import Identity

        batch = [Request(q.id, tuple(q.prompt), q.max_tokens, tuple(q.stop_ids),
                         Identity(q.identity.revision, q.identity.adapter, q.identity.salt)) for q in requests]
        result = _result_type()
        return [result(request_id=r.request_id, output=tuple(r.output), finish_reason=r.finish_reason,
                       cached_tokens=r.cached_tokens, draft_proposed=r.draft_proposed,
                       draft_accepted=r.draft_accepted, evictions=r.evictions) for r in self.engine.generate(batch)]

    def snapshot(self) -> Mapping[str, Any]:
        return self.engine.snapshot()

    def close(self) -> None:
        self.engine = None
