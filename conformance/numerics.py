"""The numerical noise floor: what a calibration file says, and how a run's near-ties are read against it.

In bf16/fp16 plain decoding is not batch-invariant: the same request alone and in a batch of others gives
logits that differ in the last bits, and where the top-1/top-2 margin is smaller than that difference the
argmax flips. A flip there is numerics, not a KV-reuse bug; a flip at a margin well above it is a bug. So
tau — the margin below which a divergence counts as a near-tie — is *measured*: `kvparity calibrate`
(kvparity/commands/calibrate.py) runs plain mode against itself under different batch compositions and
positions, and against the oracle, and records the distribution of margin differences; tau is a
distribution-free upper confidence bound on a high quantile of it (`quantile_bound`).

Near-ties are never silently passed: a run's near-ties are counted by margin band, per feature (a value of
a configuration knob), and a feature whose near-tie rate is significantly above plain mode's own is
flagged (`feature_flags`): a numerics bug that only ever flips near-ties stays visible. With a
calibration the test conditions on margins, because the strategies steer to near-ties on purpose: each
step the feature compared, at baseline margin m, would flip under plain mode with probability
P(plain-vs-oracle noise > m) (the calibration's sample), so plain mode's expected flip count is the sum
over those steps, and the feature is flagged when its near-tie count is improbably high under a Poisson
law with that mean (one-sided). Without a calibration: a one-sided Fisher exact test of near-ties per
compared step against the run's own plain configuration (every knob at its first value). alpha 0.01,
Bonferroni-corrected over the features tested.

Pure functions over data (a history, a calibration file); imports no engine.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from attrs import frozen

from conformance.contract import UsageError
from conformance.untrusted import read_json

CALIBRATION_VERSION = 1
ALPHA = 0.01
BANDS = (1e-3, 1e-2, 1e-1, 1.0)  # near-tie margin bands: [0, 1e-3), [1e-3, 1e-2), ... [1, tau)
# The plain-vs-oracle sample a calibration file may expand to: the committed ones hold 3,045-21,504 values
# (reports/calibration/); its [value, count] pairs are expanded, so the counts are bounded, not trusted.
MAX_NOISE_VALUES = 1_000_000


# --------------------------------------------------------------------------- statistics


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exactly (sums in log space; n is at most a few thousand)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                          + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)


def poisson_sf(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam): the flip count of many steps each with a small probability."""
    if k <= 0:
        return 1.0
    if lam <= 0.0:
        return 0.0
    below = sum(math.exp(i * math.log(lam) - lam - math.lgamma(i + 1)) for i in range(k))
    return max(0.0, 1.0 - below)


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return 1.0 - binom_sf(k + 1, n, p)


def fisher_greater(a: int, n1: int, b: int, n2: int) -> float:
    """One-sided Fisher exact p-value that rate a/n1 exceeds rate b/n2 (hypergeometric upper tail)."""
    total, k = n1 + n2, a + b
    if k == 0:
        return 1.0

    def log_comb(n: int, r: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    denom = log_comb(total, k)
    return min(1.0, sum(math.exp(log_comb(n1, i) + log_comb(n2, k - i) - denom)
                        for i in range(a, min(n1, k) + 1)))


@frozen
class Bound:
    """A distribution-free upper confidence bound on the `quantile` of a sample: the smallest order
    statistic X_(r) with P(X_(r) >= true quantile) >= `confidence`, i.e. the smallest r with
    P(Binomial(n, q) <= r - 1) >= confidence. Where no r <= n qualifies the sample is too small for that
    claim, and the bound is the sample maximum, said so (`exact` False)."""

    value: float
    rank: int  # r (1-based) of the order statistic used
    n: int
    quantile: float
    confidence: float
    exact: bool

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "rank": self.rank, "n": self.n, "quantile": self.quantile,
                "confidence": self.confidence, "distribution_free": self.exact}


def quantile_bound(sample: Sequence[float], quantile: float, confidence: float) -> Bound:
    xs = sorted(float(x) for x in sample)
    n = len(xs)
    if n == 0:
        return Bound(0.0, 0, 0, quantile, confidence, False)
    for r in range(max(1, math.floor(quantile * n)), n + 1):
        if binom_cdf(r - 1, n, quantile) >= confidence:
            return Bound(xs[r - 1], r, n, quantile, confidence, True)
    return Bound(xs[-1], n, n, quantile, confidence, False)


# --------------------------------------------------------------------------- calibration files


@frozen
class Calibration:
    path: str
    engine: str
    engine_args: Mapping[str, str]
    tau: float
    plain_flips: int  # plain-mode outputs (alone and in batches) that diverged from the oracle
    plain_steps: int  # decoding steps compared to find them (up to and including each divergence)
    data: Mapping[str, Any]
    logprob_epsilon: float | None = None  # measured logprob deviation bound; None: not measured

    @property
    def plain_rate(self) -> float:
        """Near-tie flips per compared step, on the calibration's own prompts."""
        return self.plain_flips / self.plain_steps if self.plain_steps else 0.0

    def flip_probability(self, margin: float) -> float:
        """P(plain mode's deviation from the oracle exceeds `margin`): the chance that plain decoding
        flips a step whose baseline margin is `margin`. From the stored sample of plain-vs-oracle
        margin differences ((count above + 1) / (n + 1): never 0), else, conservatively, from the
        oracle source's histogram (a bin counts when its upper edge is above the margin)."""
        sample = self.data.get("plain_noise")
        if sample:
            above = len(sample) - bisect.bisect_right(sample, margin)
            return (above + 1) / (len(sample) + 1)
        rows = self.data.get("sources", {}).get("oracle", {}).get("histogram", [])
        n = sum(r["count"] for r in rows)
        above = sum(r["count"] for r in rows if r["to"] is None or r["to"] > margin)
        return (above + 1) / (n + 1)


def _epsilon(data: Mapping[str, Any]) -> float | None:
    """The logprob epsilon of a calibration file (files written before logprobs were measured: None)."""
    section = data.get("logprobs")
    if section is None or section.get("epsilon") is None:
        return None
    eps = float(section["epsilon"])
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"logprobs.epsilon {eps!r} is not a finite number >= 0")
    return eps


def round_up(x: float, digits: int = 3) -> float:
    """`x` rounded up to `digits` significant digits: the stored noise is never below what was measured
    (flip_probability then never under-counts), and a sample of a few distinct values stays a few KB."""
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return float(f"{math.ceil(x / scale - 1e-9) * scale:.{digits}g}")


def value_counts(sample: Iterable[float]) -> list[list[float | int]]:
    """A sample as ascending [value, count] pairs (numerics.noise_sample reads it back): rounded noise
    is mostly repeats, and reports/ has a size cap."""
    counts: dict[float, int] = {}
    for x in sample:
        counts[x] = counts.get(x, 0) + 1
    return [[x, counts[x]] for x in sorted(counts)]


def noise_sample(stored: Any) -> list[float]:
    """A file's `plain_noise` as the sorted sample flip_probability reads. Written as ascending
    [value, count] pairs (the values are rounded to 1e-7, so most of a sample is repeats: a flat list
    made a calibration file ~100 KB under reports/' size cap); files written before that hold the flat
    sorted list, read as it is."""
    if not stored:
        return []
    if not isinstance(stored[0], list):
        return [float(x) for x in stored]
    out: list[float] = []
    for value, count in stored:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"plain_noise count {count!r} is not a whole number >= 0")
        if len(out) + count > MAX_NOISE_VALUES:  # counted before the list is grown: a count is not a size
            raise ValueError(f"plain_noise holds over {MAX_NOISE_VALUES:,} values; a calibration measures "
                             "tens of thousands")
        out.extend([float(value)] * count)
    if any(a > b for a, b in zip(out, out[1:])):
        raise ValueError("plain_noise values are not ascending")
    return out


def load_calibration(path: str | Path) -> Calibration:
    """A file `kvparity calibrate` wrote; anything else is a one-line UsageError."""
    try:
        data = read_json(path, "calibration")
        if data.get("kvparity_calibration") != CALIBRATION_VERSION:
            raise ValueError(f"format version {data.get('kvparity_calibration')!r}, this kvparity reads "
                             f"{CALIBRATION_VERSION}")
        tau = float(data["tau"])
        data = {**data, "plain_noise": noise_sample(data.get("plain_noise"))}
        plain = data["plain_near_ties"]
        cal = Calibration(str(path), str(data["engine"]), dict(data.get("engine_args") or {}), tau,
                          int(plain["flips"]), int(plain["steps"]), data, _epsilon(data))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:  # int(Infinity)
        raise UsageError(f"--calibration {path}: not a kvparity calibration file ({exc})") from None
    if not math.isfinite(cal.tau) or cal.tau < 0:
        raise UsageError(f"--calibration {path}: tau {cal.tau!r} is not a finite number >= 0")
    return cal


# --------------------------------------------------------------------------- a run's near-ties


def band_of(margin: float | None) -> str:
    if margin is None:
        return "unknown"
    lo = 0.0
    for edge in BANDS:
        if margin < edge:
            return f"[{lo:g}, {edge:g})"
        lo = edge
    return f">= {BANDS[-1]:g}"


def feature_of(config: Mapping[str, Any], space: Mapping[str, Sequence[Any]]) -> str:
    """The feature a result ran under: its knobs that differ from their first (plain-most) value, or
    "plain" when none does."""
    changed = [f"{k}={config[k]}" for k in sorted(config)
               if k in space and space[k] and str(config[k]) != str(space[k][0])]
    return ",".join(changed) or "plain"


def steps_compared(c: Any, baseline_length: int) -> int:
    """Decoding steps a comparison looked at: up to and including the first difference, else all."""
    return baseline_length if c.position is None else c.position + 1


def near_ties(history: Any, calibration: Calibration | None = None) -> dict[str, Any]:
    """Per feature: results compared with the oracle, the decoding steps compared, near-ties among them,
    and near-ties by margin band of the baseline at the flip — the same tie-aware comparison the parity
    check makes. Each distinct request (oracle key) counts once per feature: the suite sends the same
    request again and again (cold and warm, under each configuration), and a request whose plain
    decoding sits on a near-tie would otherwise count as many independent flips."""
    from conformance.history_codec import oracle_key_str
    from conformance.oracle import NEAR_TIE, compare

    caps = history.capabilities
    space = dict(caps.config_space) if caps else {}
    per: dict[str, dict[str, Any]] = {}
    seen: set[tuple[str, str]] = set()
    for record in history.batches():
        feature = feature_of(record.config, space)
        row = per.setdefault(feature, {"compared": 0, "steps": 0, "near_ties": 0, "bands": {}, "expected": 0.0})
        for q, r in zip(record.requests, record.results):
            base = history.baseline_for(q)
            if base is None or r.finish_reason == "abort" or (feature, oracle_key_str(q)) in seen:
                continue
            seen.add((feature, oracle_key_str(q)))
            c = compare(base, r.output, r.finish_reason, history.tolerance)
            row["compared"] += 1
            steps = steps_compared(c, len(base.output))
            row["steps"] += steps
            if calibration is not None:  # plain mode's expected flips at exactly these margins
                row["expected"] += sum(calibration.flip_probability(m) for m in base.margins[:steps])
            if c.kind == NEAR_TIE:
                row["near_ties"] += 1
                band = band_of(c.margin)
                row["bands"][band] = row["bands"].get(band, 0) + 1
    return per


def feature_flags(per: Mapping[str, Mapping[str, Any]], calibration: Calibration | None = None,
                  alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Features whose near-tie rate is significantly above plain mode's (see the module docstring)."""
    tested = [f for f in per if f != "plain" and per[f]["steps"]]
    plain = per.get("plain", {"steps": 0, "near_ties": 0})
    if not tested or (calibration is None and not plain["steps"]):
        return []
    level = alpha / len(tested)
    flags = []
    for f in tested:
        k, n = int(per[f]["near_ties"]), int(per[f]["steps"])
        if calibration is not None:
            lam = float(per[f].get("expected", 0.0))
            p = poisson_sf(k, lam)
            test = (f"Poisson tail vs plain mode's expected {lam:.3g} flips at these steps' baseline margins "
                    f"(calibrated plain-vs-oracle noise)")
        else:
            p = fisher_greater(k, n, int(plain["near_ties"]), int(plain["steps"]))
            test = f"Fisher exact vs this run's plain {plain['near_ties']}/{plain['steps']} steps"
        if p < level:
            flags.append({"feature": f, "near_ties": k, "steps": n, "p_value": p, "test": test,
                          "alpha": alpha, "bonferroni_level": level})
    return flags


def summarise(history: Any, calibration: Calibration | None = None) -> dict[str, Any]:
    per = near_ties(history, calibration)
    return {"oracle": history.oracle, "tau": history.tolerance,
            "calibration": calibration.path if calibration else None,
            "features": per, "flags": feature_flags(per, calibration), "alpha": ALPHA}


def summary_lines(summary: Mapping[str, Any]) -> Iterable[str]:
    src = f"calibrated, {summary['calibration']}" if summary["calibration"] else "declared by the adapter"
    yield f"oracle: {summary['oracle'] or 'not named by the adapter'}; tau {summary['tau']:g} ({src})"
    for f, row in sorted(summary["features"].items()):
        if row["near_ties"]:
            bands = ", ".join(f"{b}: {c}" for b, c in sorted(row["bands"].items()))
            yield f"  near-ties {f}: {row['near_ties']} in {row['steps']} steps of {row['compared']} results ({bands})"
    for flag in summary["flags"]:
        yield (f"FLAG: {flag['feature']} flips near-ties significantly more often than plain mode: "
               f"{flag['near_ties']} in {flag['steps']} steps, p = {flag['p_value']:.2g} < {flag['bonferroni_level']:.2g} "
               f"({flag['test']}; alpha {flag['alpha']}, Bonferroni)")
