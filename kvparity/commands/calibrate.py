"""`kvparity calibrate`: measure an engine's numerical noise floor, and the tau that follows from it.

    kvparity calibrate --engine transformers --engine-arg dtype=bfloat16 --out reports/calibration/x.json
    kvparity run --engine transformers --engine-arg dtype=bfloat16 --calibration reports/calibration/x.json

In bf16/fp16, plain greedy decoding is not batch-invariant: a request decoded alone and decoded in a batch
of others (or at another position in it) sees different GEMM shapes and reduction orders, and its logits
move in the last bits. Where the top-1/top-2 margin is below that movement the argmax flips. This command
measures the movement, with no feature of the engine switched on:

  batch   plain decoding of each request alone (A) against the same request in batches of
          `--batch-sizes` others, at every position of the batch (B);
  oracle  A against the oracle's baseline (O): the float64 reference, or the engine itself with
          `oracle=self` (then this source is zero by construction).

At every decoding step both runs share (up to and including their first difference) the sample is the
difference of the signed top-1/top-2 margin, |s_A - s_V|: where both chose the same token the difference
of their margins, where they differ the sum (the gap crossed zero). A feature run is compared with the
oracle, and its deviation from it is at most (O vs A) + (A vs the feature's own shapes), so

  tau = bound(oracle) + bound(batch),

each bound a distribution-free upper confidence bound on the `--quantile` of its sample at
`--confidence` (conformance.numerics.quantile_bound: an order statistic chosen by the binomial
distribution; the sample maximum, said so, when the sample is too small for the claim). The file also
holds the samples' histogram and quantiles, every flip seen, and plain mode's per-step flip rate against
the oracle, which `kvparity run --calibration` tests each feature's near-tie rate against.

Logprobs (where the runs report them): at the same steps, |logprob(run) - logprob(reference)| of every
token of the run's top-k the reference's top-k holds, for the same two sources; logprob_parity's epsilon
is max(oracle) + max(batch) + max(config) (sample maxima: that check fails on a whole run's largest
deviation), in the file's `logprobs` section, which `kvparity run --calibration` reads. Where logprobs are measured, the
requests take the engine's revisions and adapters in turn (each set of weights rounds differently). The `config`
source, for every engine that reports logprobs (through run(), also where plain() measures the other two):
every non-default value of every knob, each batch run cold and then warm, against plain decoding alone
(the shapes a run's features decode in: a verification window, a chunk, a cache hit).

An engine whose adapter has `plain(requests) -> list[Baseline]` (plain decoding of the requests as one
batch; the transformers adapter: one left-padded `generate`) is measured through it. Any other engine is
measured through `run()` under its default configuration, with the top-2 logits or the top-k logprobs
it reports (then the
"alone" runs are batches of one and the file says so).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from kvparity.parsing import UsageParser, output_file, run_command, summary
from conformance.exit_codes import ExitCode
from conformance.arguments import DEFAULT_TIMEOUT_S, positive_int, positive_seconds
from conformance.engine_lifecycle import build_engine, close_engine
from conformance.contract import Baseline, Capabilities, EngineError, Identity, Request, Result, UsageError
from conformance.numerics import CALIBRATION_VERSION, feature_of, quantile_bound, round_up, value_counts

HISTOGRAM_EDGES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, math.inf)


def parse(argv: list[str]) -> argparse.Namespace:
    from conformance.engines import parse_engine_args, resolve

    p = UsageParser(prog="kvparity calibrate", description=summary(__doc__))
    p.add_argument("--engine", required=True, help="adapter name (see `kvparity engines`) or module:Class")
    p.add_argument("--engine-arg", action="append", default=[], metavar="K=V", help="adapter argument (repeatable)")
    p.add_argument("--out", required=True, help="the calibration file to write (JSON)")
    p.add_argument("--prompts", type=positive_int, default=32, help="distinct requests measured")
    p.add_argument("--max-tokens", type=positive_int, default=16, help="tokens decoded per request")
    p.add_argument("--max-prompt-len", type=positive_int, default=64,
                   help="longest prompt measured (capped at the longest a run sends); logprob deviations grow "
                        "with the context, so an epsilon for a run's long prompts needs them measured")
    p.add_argument("--batch-sizes", default="2,4", help="batch sizes each request is also decoded in")
    p.add_argument("--quantile", type=float, default=0.999, help="quantile of the margin difference tau bounds")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of that upper bound")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the batch compositions")
    p.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                   help="seconds to build or close the engine before it counts as hung")
    args = p.parse_args(argv)
    args.engine_args = parse_engine_args(args.engine_arg)
    try:
        args.sizes = sorted({int(s) for s in args.batch_sizes.split(",") if s.strip()})
    except ValueError:
        raise UsageError(f"--batch-sizes {args.batch_sizes!r}: comma-separated integers") from None
    if not args.sizes or min(args.sizes) < 2 or max(args.sizes) > args.prompts:
        raise UsageError(f"--batch-sizes {args.batch_sizes!r}: each between 2 and --prompts ({args.prompts})")
    for name in ("quantile", "confidence"):
        if not 0.0 < getattr(args, name) < 1.0:
            raise UsageError(f"--{name} {getattr(args, name)}: a number strictly between 0 and 1")
    args.out = output_file(args.out)
    resolve(args.engine)
    return args


# --------------------------------------------------------------------------- measuring


def plain_runner(engine: Any, caps: Capabilities) -> tuple[Callable[[Sequence[Request]], list[Baseline]], str]:
    """How plain decoding of a batch is asked of this engine, and that said in words."""
    if callable(getattr(engine, "plain", None)):
        return engine.plain, "the adapter's plain(): plain decoding of the requests as one batch"
    if not caps.top2_logits and caps.logprobs_k < 2:
        raise UsageError(f"engine {caps.name!r} reports neither top-2 logits nor top-k logprobs and has no "
                         f"plain(): nothing to measure")
    engine.configure({})

    def via_run(requests: Sequence[Request]) -> list[Baseline]:
        return [as_baseline(r) for r in engine.run(list(requests))]
    source = "top-2 logits" if caps.top2_logits else "top-k logprobs (a logprob difference is a logit difference)"
    return via_run, f"run() under the default configuration, margins from the reported {source}"


def as_baseline(r: Result) -> Baseline:
    """A result as plain decoding's record: margins and runner-up from its top-2 logits, or else from its
    logprobs (log-softmax shifts every logit of a position by the same amount), and its logprobs."""
    lps = r.logprobs or ()
    if r.top2:
        margins, runner_up = [t[1] - t[3] for t in r.top2], [t[2] for t in r.top2]
    else:
        margins = [step[0][1] - step[1][1] for step in lps if len(step) > 1]
        runner_up = [step[1][0] for step in lps if len(step) > 1]
    n = len(margins)
    return Baseline(r.output[:n], r.finish_reason, margins, runner_up, logprobs=lps[:n])


def logprob_deltas(a: Baseline, v: Baseline) -> list[float]:
    """|logprob difference| of every token of v's top-k that a's top-k holds too, at every step both
    record up to and including their first token difference (what logprob_parity compares)."""
    out: list[float] = []
    for ta, tv, la, lv in zip(a.output, v.output, a.logprobs, v.logprobs):
        theirs = dict(la)
        out.extend(abs(g - theirs[t]) for t, g in lv if t in theirs)
        if ta != tv:
            break
    return out


def config_logprob_deltas(engine: Any, caps: Capabilities, requests: Sequence[Request], alone: Sequence[Baseline],
                          size: int) -> dict[str, list[float]]:
    """Logprob deviations of the engine's own features from its plain mode: under every non-default
    value of every knob, the requests (those its context limit admits) in batches of `size`, each batch
    run twice (cold, then warm: the second run is served from whatever the first cached), against the
    same requests decoded alone under the defaults. A lossless feature changes only the rounding; these
    are the shapes (chunks, verification windows, cache hits, small blocks) a run's results come from.
    By feature ("knob=value"), so that one far off the others can be told apart (`flag_features`)."""
    out: dict[str, list[float]] = {}
    for knob in caps.knobs:
        for value in knob.values[1:]:
            engine.configure({knob.name: value})
            deltas = out.setdefault(feature_of({knob.name: value}, caps.config_space), [])
            limit = caps.context_limit({knob.name: value})
            fits = [j for j, r in enumerate(requests) if len(r.prompt) + r.max_tokens <= limit]
            for start in range(0, len(fits), size):
                chunk = fits[start:start + size]
                for _ in range(2):
                    for j, r in zip(chunk, engine.run([requests[j] for j in chunk])):
                        deltas.extend(logprob_deltas(alone[j], as_baseline(r)))
    engine.configure({})
    return out


# A feature is lossless when it changes only the rounding: its deviations stay within a small multiple of
# plain mode's own. One that goes past FLAG_FACTOR times that, and past FLAG_FLOOR in absolute terms (a
# float64 engine's rounding differs by orders of magnitude between shapes, harmlessly), is not noise to
# widen epsilon by: it is left out, named, and a run judges it against the others' epsilon.
FLAG_FACTOR, FLAG_FLOOR = 100.0, 1e-3


def flag_features(plain: Sequence[float], features: dict[str, list[float]]) -> tuple[list[float], dict[str, float]]:
    """The config sample without the flagged features, and each flagged feature's largest deviation."""
    bound = FLAG_FACTOR * max(plain, default=0.0)
    flagged = {f: max(d) for f, d in features.items() if d and max(d) > max(bound, FLAG_FLOOR)}
    return [x for f, d in features.items() if f not in flagged for x in d], flagged


def logprob_section(samples: dict[str, list[float]], quantile: float, confidence: float,
                    flagged: dict[str, float] | None = None) -> dict[str, Any] | None:
    """Epsilon of logprob_parity: the sum of each source's sample maximum (a run's result deviates from
    the oracle by at most oracle-vs-plain + plain-vs-batched + batched-vs-feature). The check fails on
    the largest deviation of a whole run (tens of thousands of comparisons), so each source contributes
    its maximum, not a quantile bound (which a run would exceed by design); None where nothing was
    measured."""
    if not any(samples.values()):
        return None
    sources = {k: describe(v, quantile, confidence) for k, v in samples.items()}
    return {"epsilon": sum(src["max"] for src in sources.values()),
            "rule": "sample max(oracle) + sample max(batch) + sample max(config)",
            "sample": "|logprob(run) - logprob(reference)| per token of the run's top-k the reference's top-k "
                      "holds, per shared decoding step", "sources": sources,
            "flagged": dict(flagged or {})}  # features left out of epsilon: far past plain mode's noise


def compare_runs(a: Baseline, v: Baseline) -> tuple[list[float], dict[str, Any] | None]:
    """Signed-margin differences at every step a and v share (up to and including their first
    difference), and the flip there if there is one."""
    deltas = []
    for j, (ta, tv) in enumerate(zip(a.output, v.output)):
        if j >= len(a.margins) or j >= len(v.margins):
            break
        ma, mv = a.margins[j], v.margins[j]
        if ta == tv:
            deltas.append(abs(ma - mv))
            continue
        deltas.append(ma + mv)
        return deltas, {"position": j, "expected": int(ta), "got": int(tv), "margin_expected_side": ma,
                        "margin_got_side": mv}
    return deltas, None


def batches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    """Every request in batches of `size` others, once at every position: chunks of a shuffled order,
    each chunk rotated through all its positions."""
    order = list(range(n))
    rng.shuffle(order)
    chunks = [order[i:i + size] for i in range(0, n - size + 1, size)]
    return [chunk[r:] + chunk[:r] for chunk in chunks for r in range(size)]


def histogram(sample: Sequence[float]) -> list[dict[str, Any]]:
    rows = []
    for lo, hi in zip(HISTOGRAM_EDGES, HISTOGRAM_EDGES[1:]):
        count = sum(1 for x in sample if lo <= x < hi)
        rows.append({"from": lo, "to": None if math.isinf(hi) else hi, "count": count})
    return rows


def describe(sample: Sequence[float], quantile: float, confidence: float) -> dict[str, Any]:
    xs = sorted(sample)
    q = (lambda f: xs[min(len(xs) - 1, int(f * len(xs)))] if xs else 0.0)
    return {"n": len(xs), "zero": sum(1 for x in xs if x == 0.0), "max": xs[-1] if xs else 0.0,
            "quantiles": {"0.5": q(0.5), "0.9": q(0.9), "0.99": q(0.99), "0.999": q(0.999)},
            "bound": quantile_bound(xs, quantile, confidence).to_json(), "histogram": histogram(xs)}


def identities(caps: Capabilities) -> list[Identity]:
    """The weights a run may decode under, taken in turn by the requests: every revision, and each
    adapter the engine declares, under its first binding ("name@digest") only (two bindings of one name
    in a batch are an in-place reload, not noise). Other weights have other logit magnitudes, so other
    rounding."""
    out = [Identity(revision=r) for r in caps.revisions or ("a",)]
    seen: set[str] = set()
    for binding in caps.adapters:
        name, _, digest = binding.partition("@")
        if name not in seen:
            seen.add(name)
            out.append(Identity(adapter=name, adapter_digest=digest or None))
    return out


# Up to this prompt length calibrate draws lengths as it always did; above it, --max-prompt-len reaches
# the context's end, where a run's longest prompts sit.
SHORT_TOP = 64


def prompt_top(caps: Capabilities, asked: int, max_tokens: int, suite_longest: int) -> int:
    """The longest prompt measured: `asked`, within the room the context leaves for `max_tokens`. Up to
    SHORT_TOP the suite's own cap applies as before; beyond it, the context itself (the strategies send
    prompts up to the context's end, past the cap of their random prompts)."""
    if asked <= SHORT_TOP:
        return max(2, min(asked, suite_longest))
    return max(2, min(asked, caps.context_limit() - max_tokens - 1))


def prompt_lengths(n: int, top: int, rng: random.Random, long_rng: random.Random) -> list[int]:
    """`n` prompt lengths uniform in [2, top]; when top exceeds SHORT_TOP every fourth is drawn from the
    range's top eighth instead (from its own generator, so the others are the lengths they always were):
    rounding grows with the position (transformers computes RoPE angles in float32: at position ~1000
    their ulp is 6e-5 rad), and a run's largest logprob deviations come from its context-end prompts."""
    lengths = [rng.randint(2, top) for _ in range(n)]
    if top > SHORT_TOP:
        for i in range(3, n, 4):
            lengths[i] = long_rng.randint(top - top // 8, top)
    return lengths


def calibrate(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    from conformance.domains import max_prompt_len, seeded_tokens

    caps = engine.capabilities()
    plain, how = plain_runner(engine, caps)
    rng = random.Random(args.seed)
    top = prompt_top(caps, args.max_prompt_len, args.max_tokens, max_prompt_len(caps))
    # every set of weights where logprobs are measured (their epsilon must hold for each); elsewhere the
    # default identity, as calibrations of those engines always were
    idents = identities(caps) if caps.logprobs_k > 0 else [Identity()]
    lengths = prompt_lengths(args.prompts, top, rng, random.Random(args.seed + 1))
    requests = [Request(f"cal{i}", seeded_tokens(caps, n, args.seed * 100003 + i), args.max_tokens,
                        identity=idents[i % len(idents)])
                for i, n in enumerate(lengths)]
    started = time.monotonic()
    alone = [plain([r])[0] for r in requests]
    oracle = [engine.baseline(r) for r in requests]
    samples: dict[str, list[float]] = {"batch": [], "oracle": []}
    lp_samples: dict[str, list[float]] = {"batch": [], "oracle": [], "config": []}
    flips: list[dict[str, Any]] = []
    plain_flips = plain_steps = 0
    plain_noise: list[float] = []  # plain outputs (alone and batched) against the oracle, per shared step

    def against_oracle(i: int, out: Baseline) -> None:
        nonlocal plain_flips, plain_steps
        deltas, flip = compare_runs(oracle[i], out)
        plain_steps += len(deltas)
        plain_flips += flip is not None
        plain_noise.extend(deltas)

    for i, (o, a) in enumerate(zip(oracle, alone)):
        deltas, flip = compare_runs(o, a)
        samples["oracle"] += deltas
        lp_samples["oracle"] += logprob_deltas(o, a)
        against_oracle(i, a)
        if flip:
            flips.append({"source": "oracle", "request": requests[i].id, **flip})
    for size in args.sizes:
        for chunk in batches(len(requests), size, rng):
            outs = plain([requests[j] for j in chunk])
            for position, (j, out) in enumerate(zip(chunk, outs)):
                deltas, flip = compare_runs(alone[j], out)
                samples["batch"] += deltas
                lp_samples["batch"] += logprob_deltas(alone[j], out)
                against_oracle(j, out)
                if flip:
                    flips.append({"source": f"batch of {size}, position {position}", "request": requests[j].id, **flip})
    flagged: dict[str, float] = {}
    if caps.logprobs_k > 0:  # plain() decodes in plain mode's shapes only: the features' need run()
        features = config_logprob_deltas(engine, caps, requests, alone, max(args.sizes))
        lp_samples["config"], flagged = flag_features(lp_samples["oracle"] + lp_samples["batch"], features)
    sources = {k: describe(v, args.quantile, args.confidence) for k, v in samples.items()}
    tau = sources["oracle"]["bound"]["value"] + sources["batch"]["bound"]["value"]
    widest = max((f["margin_expected_side"] for f in flips), default=0.0)
    return {
        "kvparity_calibration": CALIBRATION_VERSION, "engine": args.engine, "engine_args": args.engine_args,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "capabilities": {"name": caps.name, "version": caps.version, "oracle": caps.oracle,
                         "declared_tolerance": caps.tolerance, "vocab_size": caps.vocab_size},
        "method": {"plain": how, "requests": len(requests), "max_tokens": args.max_tokens, "prompt_lengths": [2, top],
                   "batch_sizes": args.sizes, "seed": args.seed, "quantile": args.quantile,
                   "confidence": args.confidence,
                   "sample": "|signed top-1/top-2 margin difference| per shared decoding step",
                   "tau": "bound(oracle) + bound(batch)"},
        "tau": tau,
        "tau_covers_every_flip_seen": widest <= tau,
        "sources": sources,
        "plain_near_ties": {"flips": plain_flips, "steps": plain_steps,
                            "what": "plain outputs (alone and in every batch) diverging from the oracle, per "
                                    "step compared"},
        "flips": flips,
        # `kvparity run --calibration` reads P(noise > margin) from it (numerics.flip_probability)
        "plain_noise": value_counts(round_up(x) for x in plain_noise),
        "logprobs": logprob_section(lp_samples, args.quantile, args.confidence, flagged),
        "seconds": round(time.monotonic() - started, 1),
    }


def dumps(data: dict[str, Any]) -> str:
    """The file's JSON, indented, with the noise sample's pairs on one line and one flip per line (a
    bf16 file of a 128-prompt sample was 67 KB at one value per line)."""
    compact = (lambda v: json.dumps(v, separators=(",", ":")))
    flips = data.get("flips") or []
    text = json.dumps({**data, "plain_noise": "@noise", "flips": "@flips"}, indent=1)
    listed = "[\n  " + ",\n  ".join(compact(f) for f in flips) + "\n ]" if flips else "[]"
    return text.replace('"@noise"', compact(data["plain_noise"]), 1).replace('"@flips"', listed, 1) + "\n"


def work(args: argparse.Namespace) -> int:
    """Exit 0 with the file written; 3 (one line) when the engine cannot be built or fails."""
    try:
        engine = build_engine(args.engine, args.engine_args, args.timeout)
    except (UsageError, EngineError) as exc:
        print(f"kvparity calibrate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        data = calibrate(engine, args)
    except (UsageError, EngineError) as exc:
        print(f"kvparity calibrate: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as exc:  # noqa: BLE001 - an engine crash is one line and exit 3, never a file
        print(f"kvparity calibrate: engine error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return ExitCode.USAGE
    finally:
        closed = close_engine(engine, args.timeout)
        if closed:
            print(f"ERROR: {closed}")
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(dumps(data))
    except OSError as exc:  # measured, and not lost: the calibration goes to stdout instead
        print(dumps(data))
        print(f"kvparity calibrate: error: cannot write {args.out}: {exc.strerror or exc}; the calibration "
              f"is on stdout", file=sys.stderr)
        return ExitCode.USAGE
    b, o = data["sources"]["batch"], data["sources"]["oracle"]
    print(f"tau {data['tau']:.4g} = oracle bound {o['bound']['value']:.4g} (n {o['n']}) + batch bound "
          f"{b['bound']['value']:.4g} (n {b['n']}), quantile {args.quantile} at confidence {args.confidence}; "
          f"flips seen {len(data['flips'])}, plain per-step flip rate {data['plain_near_ties']['flips']}/"
          f"{data['plain_near_ties']['steps']}; {logprob_words(data['logprobs'])}; wrote {args.out}")
    return 0


def logprob_words(section: dict[str, Any] | None) -> str:
    if section is None:
        return "logprobs not measured (the engine reports none)"
    parts = [f"{name} max {src['max']:.3g} (n {src['n']})" for name, src in section["sources"].items()]
    flagged = "".join(f"; FLAGGED {f}: logprobs up to {m:.3g} from plain decoding, left out of epsilon (a lossless "
                      f"feature changes only the rounding: a run will judge it)"
                      for f, m in (section.get("flagged") or {}).items())
    return f"logprob epsilon {section['epsilon']:.3g} = " + " + ".join(parts) + flagged


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("kvparity calibrate", parse, work, argv)
