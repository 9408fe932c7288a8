"""Economics: does an optimization pay? Pure analysis over `Result`s (and, where a driver recorded one, a
per-step trace of plain dicts). Imports no engine — `kvparity/commands/bench/` runs engines and hands us data.

Correctness is half the story (the checks); this module measures the other half:

- **reuse ratio** Σ Lhit / Σ Lin, token-weighted over a stream (DESIGN.md "Prefix hit");
- **latency budget**: a request's life decomposes into queueing (arrival → first scheduled), prefill
  (first scheduled → first token; queueing + prefill = TTFT) and decode ((n − 1) × TPOT), each as a
  distribution, in wall seconds and in *cost units*;
- **speculation**: acceptance α overall and per draft position, mean committed tokens per verification,
  cost per committed token with and without speculation, and the speedup predicted from α and the cost
  ratio c, (1 − α^(k+1)) / ((1 − α)(k·c + 1)), next to the measured one;
- **temporary KV**: blocks allocated for draft positions, freed again for rejected branches, and the
  peak held at once.

Acceptance alone omits what proposing and verifying cost. `CostModel` makes that explicit: a target pass
over n tokens costs `fixed + per_token · n` units (weights are read once per pass, compute grows with n),
and every proposed draft token costs `per_draft` units. Plain decoding pays `fixed + per_token` per token;
a verification of k proposals pays `fixed + per_token · (k + 1) + per_draft · k` and commits accepted + 1.

Result fields read (all optional; what an engine does not report is reported as unknown, never 0):
  cached_tokens, draft_proposed, draft_accepted, timings["ttft_s"/"tpot_s"/"total_s"],
  extra["prompt_tokens", "queue_s", "queue_cost", "ttft_cost", "tpot_cost", "proposed_per_position",
        "accepted_per_position", "verification_steps", "provisional_allocated", "provisional_freed",
        "target_passes", "target_forwards", "token_times_s", "token_costs"].
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import attrs

from conformance.contract import Result


# -- small statistics ---------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no data."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@attrs.frozen
class Dist:
    """Summary of a distribution: n, mean, p50, p90, p99, max (None where there is no data)."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> "Dist":
        xs = [float(v) for v in values if v is not None]
        if not xs:
            return cls(0, None, None, None, None, None)
        return cls(len(xs), sum(xs) / len(xs), percentile(xs, 50), percentile(xs, 90), percentile(xs, 99), max(xs))


@attrs.frozen
class Ratio:
    num: float
    den: float

    @property
    def value(self) -> float | None:
        return self.num / self.den if self.den else None


def _extra(r: Result, key: str, default: Any = None) -> Any:
    return r.extra.get(key, default) if r.extra else default


# -- reuse ----------------------------------------------------------------------------------------------
def reuse_ratio(results: Sequence[Result], prompt_tokens: Mapping[str, int] | None = None) -> Ratio | None:
    """Token-weighted Σ Lhit / Σ Lin. Lin comes from `prompt_tokens[request_id]` or extra["prompt_tokens"].
    None when the engine reports no cached-token counts at all (unknown, not zero)."""
    hit = total = 0
    seen = False
    for r in results:
        lin = (prompt_tokens or {}).get(r.request_id, _extra(r, "prompt_tokens"))
        if lin is None:
            raise ValueError(f"no prompt length for {r.request_id!r}")
        total += int(lin)
        if r.cached_tokens is not None:
            seen = True
            hit += int(r.cached_tokens)
    return Ratio(hit, total) if seen else None


# -- latency budget -------------------------------------------------------------------------------------
@attrs.frozen
class LatencyBudget:
    """Per-request components, summarised. queue + prefill = TTFT; decode = (n − 1) · TPOT."""

    queue: Dist
    prefill: Dist
    decode: Dist
    ttft: Dist
    tpot: Dist
    unit: str  # "s" or "cost"

    def medians(self) -> dict[str, float | None]:
        return {"queue": self.queue.p50, "prefill": self.prefill.p50, "decode": self.decode.p50}


def latency_budget(results: Sequence[Result], unit: str = "s") -> LatencyBudget:
    """unit "s": timings ttft_s / tpot_s and extra queue_s; unit "cost": extra ttft_cost / tpot_cost /
    queue_cost (target token-forwards engine-wide, or cost-model units if the driver priced them)."""
    queue, prefill, decode, ttft, tpot = [], [], [], [], []
    for r in results:
        if unit == "s":
            t_first, t_tok, q = r.timings.get("ttft_s"), r.timings.get("tpot_s"), _extra(r, "queue_s")
        else:
            t_first, t_tok, q = _extra(r, "ttft_cost"), _extra(r, "tpot_cost"), _extra(r, "queue_cost")
        ttft.append(t_first)
        tpot.append(t_tok)
        queue.append(q)
        prefill.append(None if (t_first is None or q is None) else t_first - q)
        n = len(r.output)
        if n <= 1:  # one token: nothing to decode after it
            decode.append(0.0 if t_first is not None else None)
        else:
            decode.append(None if t_tok is None else t_tok * (n - 1))
    return LatencyBudget(Dist.of(queue), Dist.of(prefill), Dist.of(decode), Dist.of(ttft), Dist.of(tpot), unit)


def inter_token_gaps(results: Sequence[Result], window: tuple[float, float] | None = None,
                     key: str = "token_times_s") -> list[float]:
    """Gaps between consecutive output tokens (extra[key]: one timestamp per token). Several tokens of
    one verification share a timestamp and so a zero gap. With `window`, only gaps whose *later* token
    lies inside (start, end] — e.g. decoding requests' gaps while a long prompt is being prefilled."""
    gaps = []
    for r in results:
        times = _extra(r, key) or []
        for a, b in zip(times, times[1:]):
            if window is None or window[0] < b <= window[1]:
                gaps.append(b - a)
    return gaps


# -- speculation ----------------------------------------------------------------------------------------
@attrs.frozen
class Acceptance:
    proposed: int
    accepted: int
    per_position: tuple[tuple[int, int], ...]  # (proposed, accepted) at draft position 1, 2, ...
    verifications: int | None

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def alpha_per_position(self) -> list[float | None]:
        return [a / p if p else None for p, a in self.per_position]

    @property
    def committed_per_verification(self) -> float | None:
        """Each verification commits its accepted prefix plus the target's own token."""
        if not self.verifications:
            return None
        return (self.accepted + self.verifications) / self.verifications


def acceptance(results: Sequence[Result]) -> Acceptance | None:
    """Σ accepted / Σ proposed, and per position. None when the engine reports no drafts."""
    proposed = accepted = 0
    per: list[list[int]] = []
    verifications: int | None = 0
    seen = False
    for r in results:
        if r.draft_proposed is None:
            continue
        seen = True
        proposed += int(r.draft_proposed)
        accepted += int(r.draft_accepted or 0)
        for i, (p, a) in enumerate(zip(_extra(r, "proposed_per_position") or [],
                                       _extra(r, "accepted_per_position") or [])):
            while len(per) <= i:
                per.append([0, 0])
            per[i][0] += int(p)
            per[i][1] += int(a)
        v = _extra(r, "verification_steps", _extra(r, "verifications"))
        verifications = None if (v is None or verifications is None) else verifications + int(v)
    if not seen:
        return None
    return Acceptance(proposed, accepted, tuple((p, a) for p, a in per), verifications)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Expected tokens per verification (1 − α^(k+1)) / (1 − α) over its cost relative to one plain step,
    k·c + 1 (k draft steps at c each, verification priced like one plain step)."""
    if k < 0 or c < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need 0 <= alpha <= 1, k >= 0, c >= 0; got alpha={alpha}, k={k}, c={c}")
    tokens = (k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)


# -- cost model -----------------------------------------------------------------------------------------
@attrs.frozen
class CostModel:
    """Units per pass: a target pass over n tokens costs fixed + per_token·n; a proposed draft token
    costs per_draft (0 for n-gram lookup, which runs no model)."""

    fixed: float = 3.0
    per_token: float = 1.0
    per_draft: float = 0.0

    def target_pass(self, n: int) -> float:
        return self.fixed + self.per_token * n if n > 0 else 0.0

    def plain(self, tokens: int) -> float:
        """Plain decoding: one single-token pass per token."""
        return tokens * self.target_pass(1)

    def verification(self, proposed: int) -> float:
        """One propose+verify round: `proposed` drafts and one pass over them plus the last token."""
        return self.per_draft * proposed + self.target_pass(proposed + 1)

    @property
    def c(self) -> float:
        """Cost ratio of one draft token to one plain decode step (the c of `predicted_speedup`)."""
        return self.per_draft / self.target_pass(1)

    def with_draft(self, per_draft: float) -> "CostModel":
        return attrs.evolve(self, per_draft=per_draft)


def rounds_cost(model: CostModel, rounds: Sequence[tuple[int, int]]) -> tuple[float, int, float]:
    """Propose+verify rounds as (proposed, accepted): total cost, committed tokens, acceptance."""
    cost = sum(model.verification(p) for p, _ in rounds)
    committed = sum(a + 1 for _, a in rounds)
    proposed = sum(p for p, _ in rounds)
    return cost, committed, (sum(a for _, a in rounds) / proposed if proposed else 0.0)


def decode_cost(r: Result, model: CostModel) -> float | None:
    """A request's decode-phase cost in model units from what the driver recorded: its decode passes
    (extra["decode_passes"]: target passes after its first token, each counted as 1 / the number of
    sequences sharing it, so a batch splits the fixed part), the tokens it fed to them
    (extra["decode_forwards"]) and its proposals."""
    passes, fwd = _extra(r, "decode_passes"), _extra(r, "decode_forwards")
    if passes is None or fwd is None:
        return None
    return model.fixed * passes + model.per_token * fwd + model.per_draft * (r.draft_proposed or 0)


@attrs.frozen
class TokenCost:
    """Cost per committed decode token (tokens after the first), in wall seconds and in model units."""

    tokens: int
    seconds: float | None
    units: float | None

    @property
    def s_per_token(self) -> float | None:
        return self.seconds / self.tokens if (self.tokens and self.seconds is not None) else None

    @property
    def units_per_token(self) -> float | None:
        return self.units / self.tokens if (self.tokens and self.units is not None) else None


def cost_per_token(results: Sequence[Result], model: CostModel) -> TokenCost:
    tokens = sum(max(0, len(r.output) - 1) for r in results)
    secs = [r.timings.get("tpot_s") for r in results if len(r.output) > 1]
    seconds = None if any(s is None for s in secs) else sum(
        r.timings["tpot_s"] * (len(r.output) - 1) for r in results if len(r.output) > 1)
    units = [decode_cost(r, model) for r in results]
    return TokenCost(tokens, seconds, None if any(u is None for u in units) else sum(units))


def speedup(plain: TokenCost, spec: TokenCost) -> tuple[float | None, float | None]:
    """Measured speedup (plain cost per token / speculative cost per token), wall and units."""
    def ratio(a, b):
        return a / b if (a is not None and b) else None
    return ratio(plain.s_per_token, spec.s_per_token), ratio(plain.units_per_token, spec.units_per_token)


# -- temporary KV ---------------------------------------------------------------------------------------
@attrs.frozen
class TemporaryKV:
    allocated: int
    freed: int  # released again: the rejected branches' blocks
    peak: int | None  # most provisional blocks held at once (from a per-step trace)

    @property
    def promoted(self) -> int:
        """Provisional blocks that accepted drafts filled: kept as ordinary blocks."""
        return self.allocated - self.freed


def temporary_kv(results: Sequence[Result], trace: Sequence[Mapping[str, Any]] | None = None) -> TemporaryKV | None:
    """Σ provisional blocks allocated / freed; the peak is the largest per-step sum from the trace
    (provisional blocks live inside one step: reserved by the plan, settled by verification)."""
    rows = [r for r in results if _extra(r, "provisional_allocated") is not None]
    if not rows:
        return None
    peak = max((int(s.get("provisional_allocated", 0)) for s in trace), default=0) if trace is not None else None
    return TemporaryKV(sum(int(_extra(r, "provisional_allocated")) for r in rows),
                       sum(int(_extra(r, "provisional_freed")) for r in rows), peak)


# -- the 12 / 9 / 18 point ------------------------------------------------------------------------------
def worked_example(model: CostModel | None = None, draft_cost: float = 1.8) -> dict[str, dict[str, float]]:
    """The arithmetic behind "12 / 9 / 18": three committed decode tokens under `model` (default 3 + n per
    target pass, so a plain token costs 4):
      plain      3 single-token passes                                   3 × 4            = 12
      cheap      n-gram lookup (free), k = 5, 2 of 5 accepted (α = 0.4):  (3 + 6)          =  9
      dear       draft model at `draft_cost` per proposal, k = 5, 2 of 5 (α = 0.4): 9 + 5 × 1.8 = 18
    Same acceptance, same target work; what the proposals cost decides whether speculation pays."""
    model = model or CostModel(3.0, 1.0, 0.0)
    cheap = rounds_cost(model, [(5, 2)])
    dear = rounds_cost(model.with_draft(draft_cost), [(5, 2)])
    return {"plain": {"cost": model.plain(3), "tokens": 3, "alpha": float("nan")},
            "cheap": {"cost": cheap[0], "tokens": cheap[1], "alpha": cheap[2]},
            "dear": {"cost": dear[0], "tokens": dear[1], "alpha": dear[2]}}
