"""The `kvparity bench` collector for the reference engine, and what both collectors share (workload
sizes, held-out token sources, the cost model): it runs the workloads and returns plain data (`Result`s,
step traces, dicts) for `kvparity.commands.bench.report` to render. The analysis is
`conformance.economics` (pure, engine-free).

For the reference engine the driver steps `Engine` itself, so it can record what a finished request's
report cannot: when each request was first scheduled (queueing), when each output token was committed
(inter-token gaps), which target passes it shared and with how many sequences (cost attribution), and
per step the provisional blocks reserved for drafts (temporary KV peak). Everything is put into plain
`Result`s (`Result.extra`) so the analysis reads one format for every engine.

Cost units: `COST_MODEL` below (a target pass over n tokens = 3 + n; a proposed draft-model token =
1.8, c = 0.45; n-gram lookup proposals are free). Wall times come from a shared 2-core CPU: compare
ratios, not absolute numbers.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

import attrs

from conformance.contract import Result
from conformance.economics import CostModel

OPEN_LOOP_STEPS = 100  # open-loop feeds schedule every arrival before this step
COST_MODEL = CostModel(fixed=3.0, per_token=1.0, per_draft=1.8)
SIZES = {
    # workload requests, arrival gap (steps), max_batch, chunk-sweep long prompt, chunk reps, spec prompts
    "ci": dict(requests=6, turns=2, conversations=2, gap=1, max_batch=3, max_tokens=12, long_prompt=192,
               decoders=3, decode_tokens=16, chunks=(8, 32, None), reps=1, search=300),
    "full": dict(requests=24, turns=4, conversations=4, gap=2, max_batch=4, max_tokens=32, long_prompt=768,
                 decoders=4, decode_tokens=48, chunks=(8, 16, 32, 64, 128, 256, 512, None), reps=3, search=3000),
}


# -- token sources ----------------------------------------------------------------------------------
class Text:
    """Held-out corpus text (never trained on), tokenized with the shipped tokenizer."""

    def __init__(self, seed: int = 7) -> None:
        from reference_engine import checkpoints
        from reference_engine.training import corpus

        self.ids = checkpoints.load_tokenizer().encode("\n".join(corpus.texts("heldout"))).ids
        self.rng = random.Random(seed)

    def snippet(self, n: int) -> tuple[int, ...]:
        i = self.rng.randrange(0, len(self.ids) - n)
        return tuple(self.ids[i:i + n])


# -- workloads: a feed is called before every step with (step, finished results) -> new requests ------
@attrs.frozen
class Req:
    id: str
    prompt: tuple[int, ...]
    max_tokens: int


Feed = Callable[[int, list[Result]], list[Req]]


def shared_system(text: Text, n: int, gap: int, max_tokens: int, system: int = 64) -> Feed:
    """One system prompt, n users with their own short question, one arrival every `gap` steps."""
    sys_prompt = text.snippet(system)
    reqs = [Req(f"sys{i}", sys_prompt + text.snippet(text.rng.randint(6, 20)), max_tokens) for i in range(n)]
    return lambda step, done: [r for i, r in enumerate(reqs) if i * gap == step]


def no_sharing(text: Text, n: int, gap: int, max_tokens: int) -> Feed:
    reqs = [Req(f"solo{i}", text.snippet(text.rng.randint(40, 80)), max_tokens) for i in range(n)]
    return lambda step, done: [r for i, r in enumerate(reqs) if i * gap == step]


def multi_turn(text: Text, conversations: int, turns: int, max_tokens: int) -> Feed:
    """Each conversation's next turn = its whole history (prompt + answer) + a new user message, sent
    when the previous turn finishes."""
    state = {c: (text.snippet(32) + text.snippet(12), 0) for c in range(conversations)}
    prompts: dict[str, tuple[int, ...]] = {}

    def feed(step: int, done: list[Result]) -> list[Req]:
        out = []
        if step == 0:
            for c, (p, _) in state.items():
                prompts[f"chat{c}.0"] = p
                out.append(Req(f"chat{c}.0", p, max_tokens))
        for r in done:
            c, t = r.request_id[4:].split(".")
            c, t = int(c), int(t)
            if t + 1 < turns:
                p = prompts[r.request_id] + tuple(r.output) + text.snippet(text.rng.randint(6, 14))
                rid = f"chat{c}.{t + 1}"
                prompts[rid] = p
                out.append(Req(rid, p, max_tokens))
        return out
    return feed


# -- the reference-engine driver ------------------------------------------------------------------------
class Driver:
    """Steps a reference `Engine`, feeding arrivals, recording per-request timelines and a step trace."""

    def __init__(self, engine: Any, model: CostModel = COST_MODEL) -> None:
        self.engine, self.model = engine, model
        self.clock = 0.0  # cost-model units, engine-wide
        self.trace: list[dict[str, Any]] = []
        self.seqs: dict[str, Any] = {}
        self.rec: dict[str, dict[str, Any]] = {}

    def submit(self, r: Req) -> None:
        self.engine.add_request(r.id, r.prompt, r.max_tokens)
        seq = self.engine.live[r.id]
        self.seqs[r.id] = seq
        self.rec[r.id] = dict(arrival_units=self.clock, queue_s=None, queue_units=None, token_times_s=[],
                              token_costs=[], decode_passes=0.0, decode_forwards=0, passes=0.0)

    def step(self) -> list[Result]:
        eng = self.engine
        before = {rid: (s.target_forwards, len(s.output), s.draft_proposed, s.provisional_allocated)
                  for rid, s in eng.live.items()}
        t0, c0 = time.perf_counter(), eng.target_cost
        reports = eng.step()
        t1 = time.perf_counter()
        fed = {rid: self.seqs[rid].target_forwards - b[0] for rid, b in before.items()}
        in_pass = [rid for rid, n in fed.items() if n > 0]
        proposed = sum(self.seqs[rid].draft_proposed - before[rid][2] for rid in before)
        prov = sum(self.seqs[rid].provisional_allocated - before[rid][3] for rid in before)
        tokens = eng.target_cost - c0
        self.clock += self.model.fixed * (1 if in_pass else 0) + self.model.per_token * tokens \
            + self.model.per_draft * proposed
        self.trace.append(dict(t0=t0, t1=t1, tokens=tokens, sequences=len(in_pass), proposed=proposed,
                               provisional_allocated=prov, units=self.clock,
                               blocks_in_use=eng.pool.num_blocks - eng.pool.num_available()))
        for rid in in_pass:
            seq, rec, (_, out0, _, _) = self.seqs[rid], self.rec[rid], before[rid]
            share = 1.0 / len(in_pass)  # the pass's fixed cost is shared by the sequences in it
            rec["passes"] += share
            if rec["queue_s"] is None:
                rec["queue_s"] = t0 - seq.t_arrival
                rec["queue_units"] = self.clock_at_start(rec)
            if out0 >= 1:
                rec["decode_passes"] += share
                rec["decode_forwards"] += fed[rid]
            for _ in range(len(seq.output) - out0):
                rec["token_times_s"].append(t1)
                rec["token_costs"].append(self.clock)
        return [self.result(rep) for rep in reports]

    def clock_at_start(self, rec: dict[str, Any]) -> float:
        prev = self.trace[-2]["units"] if len(self.trace) > 1 else 0.0
        return prev - rec["arrival_units"]

    def result(self, rep: Any) -> Result:
        from adapters.reference import ReferenceAdapter

        base = ReferenceAdapter._result(rep)
        rec = self.rec[rep.request_id]
        costs = rec["token_costs"]
        extra = {**base.extra, **{k: v for k, v in rec.items() if k not in ("queue_units", "arrival_units")},
                 "queue_cost": rec["queue_units"],
                 "ttft_cost": costs[0] - rec["arrival_units"] if costs else None,
                 "tpot_cost": (costs[-1] - costs[0]) / (len(costs) - 1) if len(costs) > 1 else None,
                 "token_times_s": [t - self.seqs[rep.request_id].t_arrival for t in rec["token_times_s"]],
                 "abs_token_times_s": rec["token_times_s"]}
        return attrs.evolve(base, extra=extra)

    def run(self, feed: Feed, max_steps: int = 100_000) -> list[Result]:
        done: list[Result] = []
        new: list[Result] = []
        step = 0
        while step < max_steps:
            for r in feed(step, new):
                self.submit(r)
            if not self.engine.has_unfinished() and step >= OPEN_LOOP_STEPS:
                break
            new = self.step() if self.engine.has_unfinished() else []
            done.extend(new)
            step += 1
        return done


def reference_engine(drafter: str = "none", k: int = 4, chunk_size: int | None = None, max_batch: int = 64,
                     prefix_cache: bool = True, num_blocks: int = 1024, block_size: int = 16) -> Any:
    from adapters.reference import shared_registry
    from reference_engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_cache=prefix_cache,
                               drafter=drafter, k=k, chunk_size=chunk_size, max_batch=max_batch), shared_registry())


def draft_available() -> bool:
    from reference_engine import checkpoints

    return (checkpoints.CHECKPOINTS / checkpoints.DRAFT / "model.safetensors").exists()


def forward_seconds(model: Any, context: int = 64, reps: int = 100) -> float:
    """Seconds per single-token decode pass at `context` tokens (the wall-time c is draft / target)."""
    import torch
    from reference_engine.model import DenseKV

    kv = DenseKV(model.config, model.dtype)
    with torch.no_grad():
        model(torch.arange(3, 3 + context), torch.arange(context), kv)
        t = time.perf_counter()
        for i in range(reps):
            model(torch.tensor([5]), torch.tensor([context + i]), kv)
    return (time.perf_counter() - t) / reps


# -- the pieces of the report ---------------------------------------------------------------------------
def run_workloads(size: dict, drafters: list[str], k: int) -> dict[str, dict[str, Any]]:
    """workload -> drafter -> {"results", "trace"}: the same request stream under each drafter."""
    out: dict[str, dict[str, Any]] = {}
    feeds = {
        "shared system prompt": lambda t: shared_system(t, size["requests"], size["gap"], size["max_tokens"]),
        "multi-turn chat": lambda t: multi_turn(t, size["conversations"], size["turns"], size["max_tokens"]),
        "no sharing": lambda t: no_sharing(t, size["requests"], size["gap"], size["max_tokens"]),
        # the same stream one request at a time: where the speedup formula's batch-1 assumption holds
        "no sharing, batch 1": lambda t: no_sharing(t, size["requests"], size["gap"], size["max_tokens"]),
    }
    for w, (name, make) in enumerate(feeds.items()):
        out[name] = {}
        seed = 102 if name.startswith("no sharing") else 100 + w
        for drafter in drafters:
            batch = 1 if name.endswith("batch 1") else size["max_batch"]
            driver = Driver(reference_engine(drafter, k, max_batch=batch))
            results = driver.run(make(Text(seed=seed)))
            out[name][drafter] = {"results": results, "trace": driver.trace}
    return out


def chunk_sweep(size: dict) -> list[dict[str, Any]]:
    """Decoders run; a long prompt arrives; per chunk size: the decoders' inter-token gaps while it is
    prefilled, its TTFT, and the whole batch's completion time (median of `reps` runs)."""
    from conformance.economics import inter_token_gaps, percentile

    text = Text(seed=5)
    decoders = [Req(f"dec{i}", text.snippet(16), size["decode_tokens"]) for i in range(size["decoders"])]
    long_req = Req("long", text.snippet(size["long_prompt"]), 8)
    rows = []
    for chunk in size["chunks"]:
        reps = []
        for _ in range(size["reps"]):
            driver = Driver(reference_engine(chunk_size=chunk, prefix_cache=False))
            start = time.perf_counter()
            results = driver.run(lambda step, done: decoders if step == 0 else [long_req] if step == 3 else [])
            total = time.perf_counter() - start
            by = {r.request_id: r for r in results}
            seq = driver.seqs["long"]
            arr, first = seq.t_arrival, by["long"].extra["abs_token_times_s"][0]
            dec = [r for r in results if r.request_id != "long"]
            gaps = inter_token_gaps(dec, (arr, first), key="abs_token_times_s")
            arr_u = driver.rec["long"]["arrival_units"]
            gaps_u = inter_token_gaps(dec, (arr_u, by["long"].extra["token_costs"][0]), key="token_costs")
            reps.append(dict(total_s=total, total_units=driver.clock, ttft_s=first - arr,
                             p50_s=percentile(gaps, 50), p99_s=percentile(gaps, 99),
                             p50_units=percentile(gaps_u, 50), p99_units=percentile(gaps_u, 99),
                             passes=sum(1 for s in driver.trace if s["sequences"]), gaps=len(gaps)))
        reps.sort(key=lambda r: r["total_s"])
        mid = reps[len(reps) // 2]
        rows.append({"chunk": chunk or size["long_prompt"], "whole": chunk is None, **mid})
    return rows


def speculation_demo(size: dict) -> dict[str, Any] | None:
    """12 / 9 / 18 on the real engine: find held-out text where, after the first token, n-gram lookup and
    the draft model each propose 5 tokens of which exactly the first 2 are the target's; then run plain,
    n-gram (k=5) and draft (k=5) with max_tokens 4 (1 prefill token + 3 decode tokens) and price the
    decode phase with COST_MODEL."""
    if not draft_available():
        return None
    from types import SimpleNamespace

    from adapters.reference import shared_registry
    from reference_engine.baseline import greedy
    from reference_engine.drafters import DraftModelDrafter, NgramDrafter
    from reference_engine.sequence import Identity

    reg = shared_registry()
    target = reg.model(Identity())
    ngram, draft = NgramDrafter(reg), DraftModelDrafter(reg)
    text = Text(seed=11)
    found = None
    for i in range(size["search"]):
        prompt = text.snippet(text.rng.randint(40, 120))
        g = greedy(target, prompt, 4).output
        if len(g) < 4:  # eos inside the first four tokens
            continue
        seq = SimpleNamespace(request_id=f"s{i}", tokens=list(prompt) + [g[0]])
        p_ng = ngram.propose(seq, 5)
        if len(p_ng) != 5 or p_ng[:2] != list(g[1:3]) or p_ng[2] == g[3]:
            continue
        p_dr = draft.propose(seq, 5)
        draft.forget(seq.request_id)
        if p_dr[:2] == list(g[1:3]) and p_dr[2] != g[3]:
            found = (prompt, g, p_ng, p_dr, i + 1)
            break
    if found is None:
        return {"found": False, "searched": size["search"]}
    prompt, g, p_ng, p_dr, tried = found
    rows = {}
    for name, drafter in (("plain", "none"), ("n-gram k=5", "ngram"), ("draft model k=5", "draft")):
        runs = []
        for _ in range(7):  # wall time on a shared CPU is noisy: keep the run with the median decode time
            driver = Driver(reference_engine(drafter, 5, prefix_cache=False))
            [res] = driver.run(lambda step, done: [Req("demo", prompt, 4)] if step == 0 else [])
            runs.append(res)
        runs.sort(key=lambda r: r.timings.get("tpot_s", 0.0))
        rows[name] = runs[len(runs) // 2]
    return {"found": True, "tried": tried, "prompt_len": len(prompt), "output": list(g), "ngram": p_ng,
            "draft": p_dr, "results": rows}


def collect_reference(size: dict, k: int) -> dict[str, Any]:
    from adapters.reference import shared_registry
    from reference_engine.sequence import Identity

    # oracle: the test drafter proposing the target's own tokens (α = 1), shown as the ceiling
    drafters = ["none", "ngram"] + (["draft"] if draft_available() else []) + ["oracle"]
    reg = shared_registry()
    for drafter in drafters:  # load weights and warm the code paths before anything is timed
        Driver(reference_engine(drafter, k)).run(lambda step, done: [Req("warm", (5, 6, 7, 8) * 6, 8)] if step == 0
                                                 else [])
    c_wall = None
    if draft_available():
        c_wall = forward_seconds(reg.draft()) / forward_seconds(reg.model(Identity()))
    return {"workloads": run_workloads(size, drafters, k), "chunks": chunk_sweep(size),
            "demo": speculation_demo(size), "c_wall": c_wall, "drafters": drafters, "cost_model": COST_MODEL}

