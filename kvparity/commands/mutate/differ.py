"""The bounded differential search that classifies a mutant the suite did not kill: random scenarios
(conformance/strategies.py, the suite's own step kinds) through the mutant and through the unmutated
engine, what each shows compared. No difference within the budget: *equivalent* (as far as anyone
could tell from outside); a difference: *survivor*, a blind spot of the suite, and the smallest
differing scenario is its evidence.

What is compared is what the suite could see: every batch's results (output, finish reason and the
reported counts: cached tokens, drafts proposed and accepted, evictions, prefill chunks, preempted),
whether a step failed and with which exception; in white-box mode also every snapshot. Not compared:
timings and the adapter's free-form `extra` (no check reads them), and whether a request past the
engine's declared limits was refused or answered (the contract allows either; an answer is still compared
with an answer). After such a refusal on one side and answer on the other the two engines hold different
KV, legitimately, so the rest of that scenario is compared by its answers alone (output, finish reason,
errors), not by the counts and snapshots that depend on what each engine holds.

The engine runs in a subprocess (`python -m kvparity.commands.mutate.differ IN OUT`) whose PYTHONPATH
puts the mutant's reference_engine/ first; the unmutated engine's observations are computed once per
scenario set and reused for every mutant.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from attrs import frozen

from kvparity.commands.mutate.process import end_group

RESULT_FIELDS = ("request_id", "output", "finish_reason", "cached_tokens", "draft_proposed", "draft_accepted",
                 "evictions", "prefill_chunks", "preempted")
CALL_TIMEOUT_S = 20.0  # one engine call of a mutant that loops forever ends as an error, not a hang
_EXC = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exhausted))\b")


def engine_args(blackbox: bool) -> dict[str, str]:
    return {"introspection": "off"} if blackbox else {}


# --------------------------------------------------------------------------- drawing scenarios


def draw_scenarios(n: int, seed: int, profile: str, blackbox: bool) -> list[list[dict[str, Any]]]:
    """`n` scenarios as the suite draws them (same strategies, same capabilities, the profile's step
    cap), from Hypothesis seed `seed`: the same list on every call. Each is a list of `step_to_json`."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from adapters.reference import ReferenceAdapter
    from conformance.run_config import PROFILES
    from conformance.scenario import step_to_json
    from conformance.strategies import scenarios

    caps = ReferenceAdapter(**engine_args(blackbox)).capabilities()
    drawn: list[list[dict[str, Any]]] = []

    @settings(max_examples=n, database=None, derandomize=False, phases=(Phase.generate,), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(caps, max_steps=PROFILES[profile]))
    def collect(steps) -> None:
        drawn.append([step_to_json(s) for s in steps])

    hypothesis_seed(seed)(collect)()
    return drawn[:n]


def scenario_size(steps: Sequence[Mapping[str, Any]]) -> tuple[int, int, int]:
    """(requests, tokens sent and asked for, steps): what "smallest" means for the evidence."""
    items = [r for s in steps if s["step"] == "batch" for r in s["requests"]]
    tokens = sum(len(r.get("prompt") or r.get("extra") or ()) + int(r.get("max_tokens", 0)) for r in items)
    return len(items), tokens, len(steps)


# --------------------------------------------------------------------------- running them (subprocess side)


def observe(engine_kwargs: Mapping[str, str], scenarios: Sequence[Sequence[Mapping[str, Any]]],
            deadline_s: float) -> list[list[dict[str, Any]] | None]:
    """Run each scenario from a cold engine and return what it showed, step by step; None for the
    scenarios the deadline left unrun. Runs in the process whose reference_engine is under test."""
    from adapters.reference import ReferenceAdapter
    from conformance.calls import EngineCalls
    from conformance.contract import EngineError
    from conformance.history import HistoryWriter
    from conformance.oracle import Oracle
    from conformance.scenario_runner import ScenarioRunner
    from conformance.scenario import step_from_json

    class NoBaselines(Oracle):
        """The differential compares engine against engine: no plain-greedy baseline is computed."""

        def missing(self, request) -> bool:
            return False

    start, out = time.monotonic(), []
    calls = EngineCalls(CALL_TIMEOUT_S)
    for steps in scenarios:
        if time.monotonic() - start > deadline_s or calls.abandoned:
            out.append(None)
            continue
        writer, caps = HistoryWriter(None), None
        try:
            adapter = ReferenceAdapter(**engine_kwargs)
            caps = adapter.capabilities()
            ScenarioRunner(adapter, writer, NoBaselines(lambda q: None), caps, calls=calls).run(
                [step_from_json(s) for s in steps], 0)
        except EngineError:
            pass  # recorded as an `error` event
        except Exception as exc:  # noqa: BLE001 - a mutant that breaks the adapter itself
            writer.events.append({"event": "error", "cause": f"{type(exc).__name__}: {exc}"})
        out.append(_observations(writer.events, caps))
    calls.close()
    return out


def _observations(events: Sequence[Mapping[str, Any]], caps: Any = None) -> list[dict[str, Any]]:
    """What the suite could see, step by step. A result whose request lies past the limits the engine
    declares for the configuration in effect is marked `free`: the contract lets such a request be
    refused or answered exactly, so a refusal on one side and an answer on the other is no difference."""
    seen, config, submitted = [], {}, []
    for ev in events:
        if ev["event"] == "config":
            config = ev.get("config") or {}
        elif ev["event"] == "submit":
            submitted = ev.get("requests") or []
        elif ev["event"] == "batch":
            limit = caps.context_limit(config) if caps is not None and caps.refuses else None
            rows = [{k: r.get(k) for k in RESULT_FIELDS} for r in ev["results"]]
            for row, q in zip(rows, submitted):
                if limit is not None and len(q.get("prompt") or ()) + int(q.get("max_tokens") or 0) > limit:
                    row["free"] = True
            seen.append({"results": rows, "snapshot": ev.get("snapshot")})
        elif ev["event"] == "reset":
            seen.append({"reset": ev.get("snapshot")})
        elif ev["event"] == "error":
            seen.append({"error": sorted(set(_EXC.findall(str(ev.get("cause", ""))))),
                         "cause": str(ev.get("cause", ""))[:300]})
    return seen


def _strip_cause(obs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """An error's wording is not compared, only that there was one and its exception classes."""
    return [{k: v for k, v in o.items() if k != "cause"} for o in obs]


# What a result shows whatever state the engine is in: once the two engines' states have legitimately
# diverged, only these are still compared.
ANSWER_FIELDS = ("request_id", "output", "finish_reason")


def _latitude(x: Mapping[str, Any], y: Mapping[str, Any]) -> bool:
    """A request past the declared limits refused on one side and answered on the other."""
    reasons = (x.get("finish_reason"), y.get("finish_reason"))
    return bool(x.get("free") and y.get("free")) and "refused" in reasons and reasons[0] != reasons[1]


def _same_result(x: Mapping[str, Any], y: Mapping[str, Any], diverged: bool) -> bool:
    """Equal (after a divergence: the same answer), or the contract's latitude past the declared limits."""
    if _latitude(x, y):
        return True
    return all(x.get(k) == y.get(k) for k in ANSWER_FIELDS) if diverged else x == y


def _same(x: Mapping[str, Any] | None, y: Mapping[str, Any] | None, diverged: bool = False) -> bool:
    if x is None or y is None:
        return x == y
    if diverged and "reset" in x and "reset" in y:
        return True  # a reset's snapshot holds the counters the divergence legitimately changed
    if set(x) != set(y) or "results" not in x:
        return x == y
    return (len(x["results"]) == len(y["results"]) and (diverged or x.get("snapshot") == y.get("snapshot"))
            and all(_same_result(a, b, diverged) for a, b in zip(x["results"], y["results"])))


def _diverges(x: Mapping[str, Any] | None, y: Mapping[str, Any] | None) -> bool:
    """Whether the two engines' states legitimately part here: one answered a request the other refused
    (both conformant), so the KV each holds, and what that batch's other requests and every later one
    evict, cache, chunk or draft, may differ without either being wrong."""
    return bool(x and y and "results" in x and "results" in y
                and any(_latitude(a, b) for a, b in zip(x["results"], y["results"])))


def first_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first step at which two observation lists differ: {step, unmutated, mutant}; None if equal.
    From the batch where a refusal on one side meets an answer on the other (`_diverges`), the rest of the
    scenario is compared by its answers only (`ANSWER_FIELDS`, and whether a step failed), not by counts
    or snapshots."""
    sa, sb = _strip_cause(a), _strip_cause(b)
    diverged = False
    for i in range(max(len(sa), len(sb))):
        x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        ox, oy = (sa[i] if i < len(sa) else None), (sb[i] if i < len(sb) else None)
        diverged = diverged or _diverges(ox, oy)  # its batch-mates shared their step budget and pool with it
        if not _same(ox, oy, diverged):
            return {"observation": i, "unmutated": x, "mutant": y}
    return None


def differing_fields(d: Mapping[str, Any]) -> list[str]:
    """What differs at a first difference: result fields, "error", "snapshot" or "steps" (one side
    has more observations). A difference only in counts (e.g. cached_tokens) is an efficiency
    difference the outputs do not show; one in "output" or "finish_reason" is a wrong answer."""
    a, b = d.get("unmutated"), d.get("mutant")
    if a is None or b is None or set(a) != set(b):
        return ["steps"]
    fields = set()
    if "results" in a:
        for x, y in zip(a["results"], b["results"]):
            fields |= {k for k in RESULT_FIELDS if x.get(k) != y.get(k)}
        if len(a["results"]) != len(b["results"]):
            fields.add("results")
        if a.get("snapshot") != b.get("snapshot"):
            fields.add("snapshot")
    for k in ("reset", "error"):
        if k in a and a[k] != b[k]:
            fields.add("snapshot" if k == "reset" else k)
    return sorted(fields)


def difference_summary(d: Mapping[str, Any]) -> dict[str, list]:
    """Only what differs at a first difference, as "where": [unmutated, mutant] (for the README)."""
    a, b = d.get("unmutated") or {}, d.get("mutant") or {}
    out: dict[str, list] = {}
    for x, y in zip(a.get("results") or (), b.get("results") or ()):
        out.update({f"{x.get('request_id')}.{k}": [x.get(k), y.get(k)] for k in RESULT_FIELDS if x.get(k) != y.get(k)})
    for side in ("snapshot", "reset"):
        sa, sb = a.get(side) or {}, b.get(side) or {}
        out.update({f"{side}.{k}": [sa.get(k), sb.get(k)] for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)})
    if a.get("error") != b.get("error") or set(a) != set(b):
        out["step"] = [a.get("cause") or sorted(a), b.get("cause") or sorted(b)]
    return out


# --------------------------------------------------------------------------- the parent side


def run_observer(pythonpath_first: Path, engine_kwargs: Mapping[str, str],
                 scenarios: Sequence[Sequence[Mapping[str, Any]]], deadline_s: float,
                 workdir: Path) -> list[list[dict[str, Any]] | None]:
    """`observe` in a subprocess importing reference_engine from `pythonpath_first`. A subprocess that
    dies or overruns leaves every scenario it did not report as unrun (None)."""
    workdir.mkdir(parents=True, exist_ok=True)
    inp, outp = workdir / "scenarios.json", workdir / "observed.json"
    inp.write_text(json.dumps({"engine_args": dict(engine_kwargs), "scenarios": list(scenarios),
                               "deadline_s": deadline_s}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath_first), str(project_root())])}
    proc = subprocess.Popen([sys.executable, "-m", "kvparity.commands.mutate.differ", str(inp), str(outp)], env=env,
                            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=deadline_s + 60 + CALL_TIMEOUT_S)
    except BaseException as exc:  # over time, or Ctrl-C (which reaches this process only)
        end_group(proc)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
    try:
        return json.loads(outp.read_text())
    except (OSError, ValueError):
        return [None] * len(scenarios)


def project_root() -> Path:
    """The folder holding conformance/ and adapters/ (what PYTHONPATH points at after the mutant)."""
    return Path(__file__).resolve().parents[3]


@frozen
class Classification:
    verdict: str  # "equivalent", "survivor" or "undecided" (no scenario could be compared)
    compared: int  # scenarios run through both
    scenario: list[dict[str, Any]] | None = None  # the smallest differing scenario (survivor)
    difference: dict[str, Any] | None = None
    differing: int = 0  # how many of the compared scenarios differed
    fields: tuple[str, ...] = ()  # what differs in the evidence (`differing_fields`)


def classify(reference: Sequence[list | None], mutant: Sequence[list | None],
             scenarios: Sequence[Sequence[Mapping[str, Any]]]) -> Classification:
    compared, differing = 0, []
    for steps, a, b in zip(scenarios, reference, mutant):
        if a is None or b is None:
            continue
        compared += 1
        d = first_difference(a, b)
        if d is not None:
            differing.append((scenario_size(steps), list(steps), d))
    if differing:
        _, steps, d = min(differing, key=lambda t: t[0])
        return Classification("survivor", compared, steps, d, len(differing), tuple(differing_fields(d)))
    return Classification("equivalent" if compared else "undecided", compared)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    job = json.loads(Path(args[0]).read_text())
    out = observe(job["engine_args"], job["scenarios"], float(job["deadline_s"]))
    Path(args[1]).write_text(json.dumps(out))
    os._exit(0)  # an abandoned engine-call thread may still be inside torch: do not wait for it


if __name__ == "__main__":
    raise SystemExit(main())
