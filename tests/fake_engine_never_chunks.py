"""A FAKE engine that claims chunked prefill and never reports a chunked prefill: what coverage completion
cannot make up for (conformance/completion.py), so a run of it stays inconclusive. Named by import path,
`fake_engine_never_chunks:NeverChunksFake`, like `fake_engine:FakeDictEngine`."""

from __future__ import annotations

from conformance.contract import Request, Result
from fake_engine import FakeDictEngine


class NeverChunksFake(FakeDictEngine):
    """FakeDictEngine, its `prefill_chunks` dropped from every result (its capabilities still claim chunking)."""

    def _one(self, q: Request) -> Result:
        r = super()._one(q)
        return Result(r.request_id, r.output, r.finish_reason, cached_tokens=r.cached_tokens,
                      draft_proposed=r.draft_proposed, draft_accepted=r.draft_accepted, evictions=r.evictions)
