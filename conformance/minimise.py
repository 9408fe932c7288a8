"""Minimise a failing scenario after Hypothesis: delta debugging on the resolved steps.

Hypothesis shrinks the *choices* that generated a scenario. Some smaller scenarios are out of its reach:
shortening one draw shifts every later draw, and a step whose lengths are drawn from a range (a `flood`
of 100..200-token prompts) never goes below it. This pass works on the resolved steps themselves, where
every prompt is explicit, and replays each candidate against the engine, keeping it while the same check
still fails: drop steps, drop requests, cut every prompt to one common length, cut prompts one by one,
then drop whole blocks from one prompt or hand its tokens to the output (`max_tokens`). The last two keep
the sequence's length modulo the block size, which a bug at a block boundary depends on (a block
registered while its last slot holds a rejected draft fires only when a request ends exactly there),
and which plain halving destroys. The result is what an engine developer reads first, so fewer tokens
matter more than speed here.

Where it starts matters as much. Hypothesis' shrinker goes to the simplest *choices*, and on its way it
may trade one mechanism of the bug for another: the zoo's `scheduled_blocks_cached` was first caught by
an example holding two 16- and 17-token requests that share a block under chunked prefill, and shrunk
to a 33-token preemption under unchunked prefill (chunk size `none` is the simpler choice), from which
no cut leads back. `minimise_from` therefore minimises from several starting points (the run's first
failing example and the shrunk one) and keeps the witness that touches the fewest blocks.

A `logprob_parity` witness must also stay clear of its threshold: a cut that leaves a deviation just
above epsilon is a smaller scenario but a weaker witness (one the next calibration could call noise), so
a candidate is kept only while its deviation is at least FAR_ABOVE_EPSILON times epsilon, or as large
as the starting witness's where that was less.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence

from attrs import evolve

from conformance.history_facts import config_block_size
from conformance.contract import Capabilities, Engine
from conformance.history_codec import capabilities_from
from conformance.run_folder import write_text
from conformance.scenario_runner import replay
from conformance.scenario import MAX_NEW, Batch, Configure, Step, step_from_json, step_to_json
from conformance.untrusted import read_json
from conformance.verdicts import CheckResult

FAR_ABOVE_EPSILON = 10.0


# Lengths around the usual block sizes (4, 16, 32): a hit needs a full block plus one token.
COMMON_CUTS = (1, 2, 4, 5, 8, 9, 16, 17, 24, 32, 33, 48, 64, 65, 96, 128)


def still_fails(new_engine: Callable[[], Engine], caps: Capabilities, check: str, steps: Sequence[Step],
                timeout_s: float = 300.0) -> bool:
    """Replay `steps` on a fresh engine and say whether `check` fails. Fresh, not merely reset: a bug
    that survives a reset (a stale memo) would otherwise let a witness lean on earlier replays."""
    return _failing(new_engine, caps, check, steps, timeout_s) is not None


def _failing(new_engine: Callable[[], Engine], caps: Capabilities, check: str, steps: Sequence[Step],
             timeout_s: float) -> CheckResult | None:
    """`check`'s failing result on a fresh engine, or None. A crash (a candidate the engine declines as
    too long, too) is another finding, unless the check fails on what was recorded before it (a leak's
    stall)."""
    engine = new_engine()
    try:
        result, _ = replay(engine, caps, steps, check, timeout_s)
    finally:
        engine.close()
    return result if result.status == "fail" else None


def strength(result: CheckResult) -> float:
    """How far a failing result is from passing, where the check measures it: a logprob_parity
    failure's largest deviation (0 for every other check: failing is all there is)."""
    return max((float(f.witness.get("logprob_deviation") or 0.0) for f in result.failures), default=0.0)


def size(steps: Sequence[Step]) -> tuple[int, int, int]:
    """(total prompt tokens, requests, steps): what minimisation drives down, in that order."""
    requests = [q for s in steps if isinstance(s, Batch) for q in s.items]
    return sum(len(q.prompt) for q in requests), len(requests), len(steps)


def minimise(new_engine: Callable[[], Engine], caps: Capabilities, check: str, steps: Sequence[Step], *,
             max_replays: int = 400, timeout_s: float = 300.0) -> list[Step]:
    """The smallest scenario found (by `size`) on which `check` still fails; `steps` if it does not."""
    small = _minimise(new_engine, caps, check, steps, max_replays, timeout_s)
    return list(steps) if small is None else small


def _minimise(new_engine: Callable[[], Engine], caps: Capabilities, check: str, steps: Sequence[Step],
              max_replays: int, timeout_s: float) -> list[Step] | None:
    """`minimise`, or None where `steps` does not fail `check` in the first place."""
    best = list(steps)
    replays = 0
    first = _failing(new_engine, caps, check, best, timeout_s)
    if first is None:
        return None
    eps = caps.logprob_epsilon if check == "logprob_parity" else None
    floor = min(strength(first), FAR_ABOVE_EPSILON * eps) if eps else 0.0

    def accept(candidate: list[Step]) -> bool:
        nonlocal best, replays
        if replays >= max_replays or size(candidate) >= size(best):
            return False
        replays += 1
        found = _failing(new_engine, caps, check, candidate, timeout_s)
        if found is not None and strength(found) >= floor:
            best = candidate
            return True
        return False
    progress = True
    while progress and replays < max_replays:
        progress = False
        for candidate in _drop_step_runs(best):
            if accept(candidate):
                progress = True
                break  # the runs were cut from the old `best`
        for candidate in _drop_steps(best):
            progress |= accept(candidate)
        for candidate in _drop_requests(best):
            progress |= accept(candidate)
        for cut in COMMON_CUTS:  # the shortest common prompt length that still fails
            if accept(_map_prompts(best, lambda p, cut=cut: p[:cut])):
                progress = True
                break
        for candidate in _cut_each_prompt(best):
            progress |= accept(candidate)
        for candidate in _keep_length_modulo_block(best, caps.block_size):
            if accept(candidate):
                progress = True
                break  # the candidates were made from the old `best`
    return best


def span(steps: Sequence[Step], default_block_size: int) -> tuple[int, int, int, int]:
    """(blocks the longest prompt touches, in the block size its batch ran with, then `size`): how
    witnesses from different starting points compare. A bug that needs three blocks is a different,
    bigger story than one that needs two, however the tokens add up."""
    return (math.ceil(witness_size(steps, default_block_size)[1]), *size(steps))


def minimise_from(new_engine: Callable[[], Engine], caps: Capabilities, check: str,
                  starts: Sequence[Sequence[Step]], *, max_replays: int = 400, timeout_s: float = 300.0) -> list[Step]:
    """Minimise from each of `starts` (a repeated one is skipped) and keep the smallest by `span`; a tie
    goes to the earlier start. A start that does not fail `check` yields nothing; the first start
    comes back unchanged where none fails."""
    seen: list[list[Step]] = []
    for start in map(list, starts):
        if start not in seen:
            seen.append(start)
    results = [r for r in (_minimise(new_engine, caps, check, start, max_replays, timeout_s) for start in seen)
               if r is not None]
    return min(results, key=lambda r: span(r, caps.block_size)) if results else list(starts[0])


def minimise_witness_file(path: str | Path, new_engine: Callable[[], Engine], *, max_replays: int = 400,
                          timeout_s: float = 300.0, also: Sequence[Sequence[Step]] = ()) -> Path | None:
    """Minimise a witness file `kvparity run` wrote; the result goes beside it as `<case>.min.json` (the
    original stays: it is what the run saw). `also`: further starting points, such as the run's first
    failing example of the same check. None when nothing smaller still fails."""
    path = Path(path)
    data = read_json(path, "witness")
    steps = [step_from_json(s) for s in data["steps"]]
    caps = capabilities_from(data["capabilities"])
    small = minimise_from(new_engine, caps, data["check"], [steps, *also],
                          max_replays=max_replays, timeout_s=timeout_s)
    if span(small, caps.block_size) >= span(steps, caps.block_size):
        return None
    out = path.with_name(path.stem + ".min.json")
    kept = {k: v for k, v in data.items() if k != "failure"}  # the failure text describes the original
    text = json.dumps({**kept, "steps": [step_to_json(s) for s in small], "minimised_from": path.name}, indent=1)
    return write_text(out.parent, out.name, text)  # never through a symlink planted beside the witness


def _drop_step_runs(steps: list[Step]):
    """Drop runs of consecutive steps, halves first, then quarters, down to pairs: a first failing
    example carries dozens of steps that one-at-a-time dropping pays a replay each for."""
    n = len(steps)
    width = n // 2
    while width >= 2:
        for start in range(0, n - width + 1, width):
            yield steps[:start] + steps[start + width:]
        width //= 2


def _drop_steps(steps: list[Step]):
    for i in range(len(steps)):
        yield steps[:i] + steps[i + 1:]


def _drop_requests(steps: list[Step]):
    for i, s in enumerate(steps):
        if isinstance(s, Batch) and len(s.items) > 1:
            for j in range(len(s.items)):
                yield steps[:i] + [Batch(s.items[:j] + s.items[j + 1:])] + steps[i + 1:]


def _map_prompts(steps: list[Step], f: Callable[[tuple[int, ...]], tuple[int, ...]]) -> list[Step]:
    return [Batch(tuple(evolve(q, prompt=f(q.prompt) or q.prompt[:1]) for q in s.items))
            if isinstance(s, Batch) else s for s in steps]


def _cut_each_prompt(steps: list[Step]):
    """Halve one prompt at a time, keeping its head or its tail (a shared prefix may sit at either end)."""
    for i, s in enumerate(steps):
        if not isinstance(s, Batch):
            continue
        for j, q in enumerate(s.items):
            n = len(q.prompt)
            for cut in (q.prompt[: n // 2], q.prompt[n // 2:], q.prompt[: n - 1]):
                if cut and len(cut) < n:
                    items = s.items[:j] + (evolve(q, prompt=cut),) + s.items[j + 1:]
                    yield steps[:i] + [Batch(items)] + steps[i + 1:]



def _keep_length_modulo_block(steps: list[Step], default_block_size: int):
    """Shorten one prompt without changing where its sequence ends within a block: drop whole blocks
    from its head or tail, or move its tail into the output (a longer `max_tokens`, never beyond what the
    strategies draw: a witness must not hide its size in the output). Largest cuts first."""
    bs = default_block_size
    for i, s in enumerate(steps):
        if isinstance(s, Configure):
            bs = config_block_size(s.config, default_block_size)
        if not isinstance(s, Batch):
            continue
        for j, q in enumerate(s.items):
            n = len(q.prompt)
            whole = [d for d in range(((n - 1) // bs) * bs, 0, -bs)]
            cuts = [evolve(q, prompt=q.prompt[:n - d]) for d in whole] + [evolve(q, prompt=q.prompt[d:]) for d in whole]
            cuts += [evolve(q, prompt=q.prompt[:n - d], max_tokens=q.max_tokens + d)
                     for d in sorted({n - 1, n // 2, 1, *whole}, reverse=True)
                     if 0 < d < n and q.max_tokens + d <= max(MAX_NEW, q.max_tokens)]
            for cut in cuts:
                yield steps[:i] + [Batch(s.items[:j] + (cut,) + s.items[j + 1:])] + steps[i + 1:]


def witness_steps(path: str | Path) -> list[Step]:
    """The steps of a witness file, for measuring it (`kvparity replay` reads a file through
    `conformance.witness_replay.read_witness`, which also checks what it names before anything runs)."""
    return [step_from_json(s) for s in read_json(path, "witness")["steps"]]


def witness_size(steps: Sequence[Step], default_block_size: int) -> tuple[int, float, int]:
    """(longest prompt in tokens, in blocks of the block size its batch ran with, requests): the size
    an engine developer reads first, reported by the fault zoo and the museum alike."""
    block_size, sized = default_block_size, []
    for step in steps:
        if isinstance(step, Configure):
            block_size = int(step.config.get("block_size", default_block_size))
        elif isinstance(step, Batch):
            sized += [(len(q.prompt), len(q.prompt) / block_size) for q in step.items]
    return max((t for t, _ in sized), default=0), max((k for _, k in sized), default=0.0), len(sized)
