"""`kvparity bench --engine transformers`: collect the economics numbers transformers lets us observe
(rendered by `report.transformers_sections`).

transformers reports neither prefix hits, draft acceptance nor per-token timing; the adapter
(adapters/transformers.py) observes hits (`generate_batch` paged cache) and drafts (candidate generators),
and times whole calls. So this report has reuse ratios, acceptance, tokens per verification and wall cost
per token with and without speculation (batch 1), next to the predicted speedup — and says plainly that
TTFT / TPOT, per-position acceptance and temporary KV are not observable here.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvparity.commands.bench.collect import COST_MODEL, Text, draft_available, forward_seconds
from conformance.contract import Request, Result


def _with_prompt(results: list[Result], requests: list[Request]) -> list[Result]:
    by = {r.id: len(r.prompt) for r in requests}
    return [attrs.evolve(r, extra={**r.extra, "prompt_tokens": by[r.request_id]}) for r in results]


def collect(size: dict, k: int) -> dict[str, Any]:
    from adapters.transformers import TransformersAdapter

    adapter = TransformersAdapter(mode="batch", k=k)
    workloads: dict[str, list[Result]] = {}
    text = Text(seed=100)
    system = text.snippet(64)
    reqs = [Request(f"sys{i}", system + text.snippet(text.rng.randint(6, 20)), size["max_tokens"])
            for i in range(size["requests"])]
    out: list[Result] = []
    wave = size["max_batch"]
    for i in range(0, len(reqs), wave):  # later waves can reuse the blocks earlier waves filled
        out += _with_prompt(adapter.run(reqs[i:i + wave]), reqs[i:i + wave])
    workloads["shared system prompt"] = out
    adapter.reset()
    text = Text(seed=101)
    convs = [text.snippet(32) + text.snippet(12) for _ in range(size["conversations"])]
    out = []
    for t in range(size["turns"]):
        batch = [Request(f"chat{c}.{t}", p, size["max_tokens"]) for c, p in enumerate(convs)]
        res = _with_prompt(adapter.run(batch), batch)
        out += res
        convs = [p + tuple(r.output) + text.snippet(text.rng.randint(6, 14)) for p, r in zip(convs, res)]
    workloads["multi-turn chat"] = out
    adapter.reset()
    text = Text(seed=102)
    reqs = [Request(f"solo{i}", text.snippet(text.rng.randint(40, 80)), size["max_tokens"])
            for i in range(size["requests"])]
    workloads["no sharing"] = _with_prompt(adapter.run(reqs), reqs)

    spec: dict[str, list[Result]] = {}
    modes = ["generate", "prompt_lookup"] + (["assisted"] if draft_available() else [])
    text = Text(seed=103)
    prompts = [Request(f"p{i}", text.snippet(48), size["max_tokens"] * 2) for i in range(max(3, size["requests"] // 2))]
    for mode in modes:
        adapter.configure({"mode": mode})
        adapter.run(prompts[:1])  # warm
        spec[mode] = adapter.run(prompts)
    c_wall = None
    if draft_available():
        from adapters.reference import shared_registry
        from reference_engine.sequence import Identity

        reg = shared_registry()
        c_wall = forward_seconds(reg.draft()) / forward_seconds(reg.model(Identity()))
    return {"workloads": workloads, "spec": spec, "c_wall": c_wall, "cost_model": COST_MODEL}

