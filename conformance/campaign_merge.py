"""`kvparity merge`: one verdict for a campaign, from its shards' histories — failing closed as one run does.

A campaign is n shards (`kvparity run --shard i/n`, conformance.shards) that each wrote a run folder.
Their verdict is not "the worst of the n results.json": a results.json is a summary, and a shard that
never ran leaves no folder to be the worst of. So the merge works from the evidence:

- every folder's history is verified (conformance.history_chain, as `kvparity report` does): a history
  that is edited, cut, unchained (legacy: nothing seals it) or not the one its results.json was judged
  on makes the campaign `error`; so does a shard that did not finish (no `run_end`, interrupted) or
  whose engine failed (its `error` events, named by shard), or whose process died after its verdict (its
  supervisor's results.json says so: conformance.reanalysis.read_verified);
- the folders must be one campaign's: each records its shard (i/n) in `run_start`, all with the same n,
  engine, engine arguments, profile, checks, capabilities, known findings (and `--strict-known`) and
  campaign seed, each index once; a shard
  of the n declared that is not given is *missing*, and the campaign is `error`;
- the shards' examples are judged as one run's: joined in shard order into one History (examples
  renumbered), each example-scoped check over each example as the run judged it, and the run-scoped
  checks (`exercised`: what the engine claims must have been exercised) over all of them, so coverage
  is summed: a situation one shard reached counts for the campaign;
- findings are deduplicated across shards by signature (conformance.signature: a bug's identity
  without its seed or sizes), each listed once with the shards that found it.

The exit code is the verdict's, as for `kvparity run`. The merged report (results.json with a
`campaign` block, report.md / .html, junit.xml, witnesses/) goes to `--out`, never into a shard's folder.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
from attrs import define, field

from conformance import known
from conformance.analysis import Analysis, analyse, select_checks
from conformance.checks import CHECKS
from conformance.contract import UsageError
from conformance.history import Example, History
from conformance.history_chain import VERIFIED
from conformance.shards import MAX_SHARDS, Shard, shard_of
from conformance.verdicts import combine

NAMED_MISSING = 10  # missing shards named in the problem; the rest counted
# What every shard of one campaign must have recorded alike in its run_start. `strict_known` too: the merge
# judges the known findings as the first shard recorded them, so a shard run `--strict-known` (FAIL: a
# stale file) beside a first shard without it merged to PASS.
SAME = ("engine", "engine_args", "profile", "checks", "capabilities", "known", "strict_known")


@define
class ShardRun:
    """One given run folder: its verified events and shard, or why it cannot stand in the campaign."""

    run_dir: Path
    history: History | None = None
    shard: Shard | None = None
    campaign_seed: Any = None
    problems: list[str] = field(factory=list)

    @property
    def name(self) -> str:
        return f"shard {self.shard} ({self.run_dir})" if self.shard else str(self.run_dir)


def read_shard(run_dir: Path) -> ShardRun:
    """A run folder as a shard: its history verified and sealed, its shard record read."""
    from conformance.reanalysis import read_verified

    run = ShardRun(Path(run_dir))
    try:
        verified = read_verified(run.run_dir)
    except (UsageError, OSError) as exc:
        run.problems.append(f"{run_dir}: {' '.join(str(exc).split())}")
        return run
    history, integrity, reading = verified.history, verified.integrity, verified.problems
    run.history = history
    if integrity.status != VERIFIED:
        run.problems.append(f"{run_dir}: {integrity.line()}; a campaign's shards must be sealed")
    found = shard_of(history.meta)
    if found is None and "shard" in history.meta:
        run.problems.append(f"{run_dir}: not a shard: its run_start's shard record is not one a run writes "
                            f"(i/n, 1 <= i <= n <= {MAX_SHARDS:,}): {str(history.meta['shard'])[:200]}")
    elif found is None:
        run.problems.append(f"{run_dir}: not a shard (its run_start records none; run with --shard i/n)")
    else:
        run.shard, run.campaign_seed = found
    run.problems += [f"{run.name}: {p}" for p in reading]
    if history.incomplete():
        run.problems.append(f"{run.name}: {history.incomplete()}")
    return run


def campaign_problems(runs: Sequence[ShardRun]) -> tuple[list[str], int | None]:
    """Why the given shards are not all of one campaign (missing, repeated, disagreeing), and its n."""
    shards = [r for r in runs if r.shard is not None and r.history is not None]
    if not shards:
        return ["no shard of a campaign was given"], None
    first = shards[0]
    count = first.shard.count
    problems = []
    for r in shards[1:]:
        if r.shard.count != count:
            problems.append(f"{r.name} is of {r.shard.count} shards, {first.name} of {count}: not one campaign")
        if r.campaign_seed != first.campaign_seed:
            problems.append(f"{r.name} has campaign seed {r.campaign_seed!r}, {first.name} {first.campaign_seed!r}: "
                            "not one campaign")
        if r.shard.own_engine_args != first.shard.own_engine_args:
            problems.append(f"{r.name} has engine arguments of its own {list(r.shard.own_engine_args)}, "
                            f"{first.name} {list(first.shard.own_engine_args)}: not one campaign")
        for key in SAME:
            if common(r, key) != common(first, key):
                problems.append(f"{r.name} differs from {first.name} in {key}: not one campaign")
    seen: dict[int, ShardRun] = {}
    for r in shards:
        if r.shard.index in seen:
            problems.append(f"shard {r.shard} given twice ({seen[r.shard.index].run_dir} and {r.run_dir})")
        seen.setdefault(r.shard.index, r)
    missing = count - len(seen)
    if missing:
        named = list(itertools.islice((i for i in range(1, count + 1) if i not in seen), NAMED_MISSING))
        more = f" and {missing - len(named):,} more" if missing > len(named) else ""
        problems.append(f"shard(s) {', '.join(f'{i}/{count}' for i in named)}{more} missing: {count} declared, "
                        f"{len(seen)} given")
    return problems, count


def common(run: ShardRun, key: str) -> Any:
    """What the shard recorded for `key` in its run_start, less its own engine arguments (`--shard-engine-arg`:
    where shards differ by design, e.g. each drives its own replica)."""
    value = run.history.meta.get(key)
    if key == "engine_args" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in run.shard.own_engine_args}
    return value


def combined_history(runs: Sequence[ShardRun]) -> tuple[History, list[tuple[int, int, ShardRun]]]:
    """The shards' examples as one History, in shard order, renumbered; and each shard's example range
    (first, past-last). The examples are moved, not copied: each shard's History lends its own, renumbered
    in place (`renumber`), so a merge holds each example once — it had held each shard's events three times
    (read, parsed for the shard, parsed again for the campaign). Each shard's end and completion are left
    out (the campaign's end is set here); its engine errors are kept, named by shard. A request whose plain
    decoding differs between shards (replicas on other hardware, an engine not deterministic across
    processes) keeps the first shard's in the campaign's baselines, which count coverage (a near-tie the
    landmarks steer every shard to) and tell a finding's story, while each shard's examples are judged by its
    own (`judged`); `meta["campaign"]["baselines_differ"]` counts those requests. Dropping them instead lost
    the near-ties every shard met: two replicas 1e-6 apart in their margins, each PASS, merged INCONCLUSIVE."""
    h = History()
    ranges = []
    differ: set[str] = set()
    usable = sorted((r for r in runs if r.history is not None and r.shard is not None), key=lambda r: r.shard.index)
    for run in usable:
        first = len(h.examples)
        for example in run.history.examples:
            renumber(example, first)
            h.examples.append(example)
            h.errors += [f"{run.name}: {e}" for e in example.errors]  # the engine's, as recorded (not reading's)
        for key, base in run.history.baselines.items():
            if h.baselines.setdefault(key, base) != base:  # the first shard's stands in the campaign's
                differ.add(key)
        ranges.append((first, len(h.examples), run))
    if usable:
        h.meta = {k: v for k, v in usable[0].history.meta.items() if k != "shard"}
        h.capabilities = usable[0].history.capabilities
        h.meta["engine_args"] = common(usable[0], "engine_args")  # each shard's own are in the shard table
    h.meta["seed"] = "per shard"
    h.meta["campaign"] = {"shards": len(usable), "campaign_seed": usable[0].campaign_seed if usable else None,
                          "baselines_differ": len(differ)}
    duration = sum(float((r.history.ended or {}).get("duration_s") or 0) for r in usable)
    engine = [r.history.engine_s for r in usable]  # None for a shard written before runs kept it
    h.ended = {"event": "run_end", "examples": len(h.examples), "shrink_steps": sum(map(shrink_steps, usable)),
               "duration_s": round(duration, 3), **({"engine_s": round(sum(engine), 3)}
                                                    if usable and None not in engine else {})}
    return h, ranges


def judged(history: History, ranges: Sequence[tuple[int, int, Mapping[str, Any]]],
           checks: Sequence[str] | None) -> Analysis:
    """The campaign's analysis: each shard's examples (`ranges`: first, past-last, the shard's baselines)
    judged as its own run judged them — by its own plain decoding: judged by another shard's, two replicas
    that each PASSed merged to FAIL —, the run-scoped checks over all of them (coverage summed), the
    failures of every shard kept side by side.

    Judged as one run, a check kept one failure per title across all shards — the last shard's — as a run
    keeps the last failure of a check (its shrunk witness). A shard's new bug was then displaced by a
    later shard's failure of the same check: measured, shard 1 FAILing on a bug of its own and shard 2
    PASSing on a known one merged to PASS (exit 0). Now the merge holds every failure any shard reported,
    and findings are folded by signature, across shards, when they are grouped."""
    chosen = select_checks(checks)
    scoped = [n for n in chosen if CHECKS[n].scope != "run"]
    if not ranges or not scoped:
        return analyse(history, chosen)
    run_scoped = [n for n in chosen if n not in scoped]
    parts = [analyse(attrs.evolve(history, examples=history.examples[first:last], baselines=baselines), scoped)
             for first, last, baselines in ranges]
    out = analyse(history, run_scoped) if run_scoped else Analysis(errors=list(parts[0].errors))
    for name in scoped:
        results = [p.checks[name] for p in parts]
        out.checks[name] = attrs.evolve(combine(name, results), failures=[f for r in results for f in r.failures])
    out.checks = {name: out.checks[name] for name in chosen}  # in the order the run lists them
    return out


def renumber(example: Example, first: int) -> None:
    """A shard's example, in place, as example `first` + its own index of the campaign, with the examples
    its probes re-send (`alone`, `kin`, `rebatch`: conformance.alone) moved with it. They had kept the
    shard's own numbers and so pointed into shard 1's examples: a campaign of two vLLM shards lost the
    probes' "another identity in its batch", and the known LoRA finding each shard waived failed the merge
    under the signature of every scheduling bug."""
    example.index += first
    for key in ("alone", "kin", "rebatch"):
        pairs = getattr(example, key)
        if pairs is not None:
            setattr(example, key, tuple((first + at, request_id) for at, request_id in pairs))
    example.batches = [attrs.evolve(b, example=example.index) for b in example.batches]
    example.failed_batches = [attrs.evolve(b, example=example.index) for b in example.failed_batches]


def shrink_steps(run: ShardRun) -> int:
    """The examples a shard ran while shrinking (its `run_end` says; within what it recorded): judged with
    the rest, but not "examples" in a report (conformance.shrink_budget)."""
    steps = (run.history.ended or {}).get("shrink_steps") if run.history is not None else None
    return steps if isinstance(steps, int) and 0 <= steps <= len(run.history.examples) else 0


def merge(run_dirs: Sequence[Path]) -> tuple[History, Analysis, dict[str, Any]]:
    """The campaign's History, its analysis (errors include every shard's and the campaign's problems),
    and the `campaign` block of its results.json."""
    runs = [read_shard(Path(d)) for d in run_dirs]
    problems, count = campaign_problems(runs)
    history, ranges = combined_history(runs)
    analysis = known.apply(history, judged(history, [(first, last, run.history.baselines) for first, last, run in ranges],
                                           history.meta.get("checks") or None))
    analysis.errors[:0] = [p for r in runs for p in r.problems] + problems
    block = {"count": count, "campaign_seed": history.meta["campaign"]["campaign_seed"],
             "baselines_differ": history.meta["campaign"]["baselines_differ"],
             "given": [str(r.run_dir) for r in runs],
             "shards": [{"shard": str(run.shard), "run_dir": str(run.run_dir), "examples": [first, last],
                         "shrink_steps": shrink_steps(run),
                         "seed": run.history.meta.get("seed"), "history_digest": run.history.digest,
                         "own_engine_args": own_engine_args(run),
                         **stated(run.run_dir)} for first, last, run in ranges],
             "problems": [p for r in runs for p in r.problems] + problems}
    return history, analysis, {**block, "_ranges": ranges}


def own_engine_args(run: ShardRun) -> dict[str, Any]:
    """The engine arguments that are this shard's own, with the values it ran with."""
    recorded_args = run.history.meta.get("engine_args") if run.history is not None else None
    if run.shard is None or not isinstance(recorded_args, dict):
        return {}
    return {k: recorded_args.get(k) for k in run.shard.own_engine_args}


def stated(run_dir: Path) -> dict[str, Any]:
    """What the shard's own results.json states: its verdict and its findings' signatures (for the
    table and for which shards found a finding; the verdict is judged from the histories). The file was
    written from this very history (`refuse_unmatched` compared their digests)."""
    from conformance.reanalysis import recorded

    data = recorded(run_dir)
    verdict = data.get("verdict")
    signed = [fd.get("signature") for fd in data.get("findings") or [] if isinstance(fd, dict)]
    return {"verdict": verdict if isinstance(verdict, str) else None,
            "signatures": [s["signature"] for s in signed
                           if isinstance(s, dict) and isinstance(s.get("signature"), str)]}
