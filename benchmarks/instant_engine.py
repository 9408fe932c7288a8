"""How fast the harness alone is: the CI profile's stream against an engine that answers instantly.

    python benchmarks/instant_engine.py [--profile ci] [--repeats 2] [--cprofile N]

The engine is the suite's FAKE (tests/fake_engine.py: a hash for a model, a dict for a cache), so
nearly every second spent is the harness's own — drawing the stream, recording and encoding the
history, the checks, the situations and coverage. A GPU engine answers CI-sized requests at thousands
per second; a harness slower than that is what a campaign waits on (issue 32's goal: >= 2,000 checked
requests per second per core). Prints, per repeat: the stream drawn alone (Hypothesis and the strategies,
nothing run: the ceiling), then the run's requests checked, process CPU seconds, requests per CPU second,
and the engine's share of the wall time. `--cprofile N` prints the self time by package and the
N most expensive functions of the last repeat (cumulative). One process, one core: compare ratios within a run.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

GOAL = 2000  # issue 32: checked requests per CPU second, enough to keep up with a small model on a GPU


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--profile", default="ci", help="suite profile")
    ap.add_argument("--repeats", type=int, default=2, help="runs (the first pays imports and caches)")
    ap.add_argument("--cprofile", type=int, default=0, help="print the N most expensive functions (0: none)")
    ap.add_argument("--sort", default="cumulative", help="cProfile order: cumulative or tottime")
    args = ap.parse_args(argv)

    from fake_engine import FakeDictEngine  # the suite's FAKE engine, for measuring the suite itself

    from timed_run import timed_run  # benchmarks/ is on the path: this script's own folder

    profiler = None
    for n in range(args.repeats):
        drawn, choices, examples, draw_cpu = drawing_alone(FakeDictEngine().capabilities(), args.profile)
        print(f"repeat {n}, drawing alone: {drawn} requests drawn in {draw_cpu:.2f} s of CPU: "
              f"{drawn / draw_cpu:.0f} per CPU second, the ceiling of a harness that draws this stream")
        flat_cpu, blob_cpu = hypothesis_floor(examples, round(choices / examples), drawn)
        print(f"repeat {n}, Hypothesis alone: its {choices / drawn:.1f} choices a request as plain integers, "
              f"no strategy code: {drawn / flat_cpu:.0f} per CPU second; one byte-string choice a request: "
              f"{drawn / blob_cpu:.0f}")
        profiler = cProfile.Profile() if args.cprofile and n == args.repeats - 1 else None
        run = timed_run(FakeDictEngine(), profiler=profiler, engine_name="fake", profile=args.profile)
        outcome, wall, cpu = run.outcome, run.wall_s, run.cpu_s
        requests = sum(len(b.requests) for b in outcome.history.batches())
        rate = requests / cpu
        print(f"repeat {n}: {outcome.verdict.upper()}, {outcome.examples} examples, {requests} requests; "
              f"wall {wall:.2f} s, CPU {cpu:.2f} s: {rate:.0f} requests per CPU second "
              f"(goal >= {GOAL:,}: {'met' if rate >= GOAL else 'not met'}); "
              f"engine {run.engine_s / wall:.1%} of the wall time")
    if profiler:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        print(by_package(stats))
        print(by_phase(stats))
        stats.sort_stats(args.sort).print_stats(args.cprofile)
    return 0


def drawing_alone(caps, profile: str) -> tuple[int, int, int, float]:
    """The profile's stream drawn and nothing else (Hypothesis and kvparity's strategies; no engine,
    recording, checks or coverage): (requests drawn, Hypothesis choices made, examples, CPU seconds). Its
    own derandomised stream, not the run's (Hypothesis derives that from the test function), of the same
    strategies and size. No harness that draws its streams this way checks requests faster than this,
    whatever else it costs."""
    from hypothesis import given, settings
    from hypothesis.control import current_build_context

    from conformance import seeded
    from conformance.run_config import PROFILES, profile_settings
    from conformance.scenario import Batch
    from conformance.strategies import scenarios

    drawn = [0, 0, 0]  # requests, choices, examples

    @settings(profile_settings(profile), database=None)
    @given(scenarios(caps, max_steps=PROFILES[profile]))
    def draw_only(scenario: tuple) -> None:
        drawn[0] += sum(len(step.items) for step in scenario if isinstance(step, Batch))
        drawn[1] += len(current_build_context().data.nodes)  # Hypothesis' own record of this example's choices
        drawn[2] += 1

    with seeded.seed_only():
        cpu0 = time.process_time()
        draw_only()
        return drawn[0], drawn[1], drawn[2], time.process_time() - cpu0


def hypothesis_floor(examples: int, choices: int, requests: int) -> tuple[float, float]:
    """CPU seconds Hypothesis alone takes to make `examples` examples of `choices` plain integer choices
    each (what kvparity's streams draw, without its strategies), and of one byte-string choice per request
    instead (`requests` in all): the first bounds any harness that draws a request field by field through
    Hypothesis; the second is what drawing each request whole, as one choice decoded by the harness, would
    leave (Hypothesis then shrinks and mutates bytes, not fields)."""
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st

    def cpu(strategy: st.SearchStrategy) -> float:
        @settings(max_examples=examples, database=None, derandomize=True, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def draw_only(_: object) -> None:
            pass

        cpu0 = time.process_time()
        draw_only()
        return time.process_time() - cpu0

    per_example = max(1, round(requests / examples))
    return (cpu(st.lists(st.integers(0, 255), min_size=choices, max_size=choices)),
            cpu(st.lists(st.binary(min_size=16, max_size=16), min_size=per_example, max_size=per_example)))


def by_package(stats: pstats.Stats) -> str:
    """Self time grouped by where the code lives: what a faster harness could win at most is the share
    outside Hypothesis (its choice-by-choice drawing, shrinking bookkeeping and database are its own)."""
    shares: dict[str, float] = {}
    for (path, _, _), (_, _, self_s, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = next((name for name in ("hypothesis", "conformance", "reference_engine", "tests", "adapters")
                      if f"/{name}/" in path), "stdlib and builtins (called by both)")
        shares[where] = shares.get(where, 0.0) + self_s
    total = sum(shares.values()) or 1.0
    return "self time by package: " + ", ".join(f"{k} {v / total:.0%}" for k, v in
                                                 sorted(shares.items(), key=lambda kv: -kv[1]))


# Where the harness's time goes, by what it is doing (cumulative time of the function that does it; the
# phases do not nest in one another, and Hypothesis' own choosing, shrinking and database are the rest).
PHASES = {
    "drawing the streams": ("conformance/strategies.py", "scenarios"),
    "running and recording them": ("conformance/scenario_runner.py", "run"),
    "the checks": ("conformance/analysis.py", "example_verdicts"),
    "coverage completion": ("conformance/completion.py", "complete"),
    "the run's analysis and report": ("conformance/runner.py", "_run_suite"),
}


def by_phase(stats: pstats.Stats) -> str:
    """Cumulative time per phase of the run (`PHASES`), as shares of the whole profiled run; the engine's
    calls (the fake's, instant) are inside "running". The last phase is the whole run less the others."""
    rows = stats.stats.items()  # type: ignore[attr-defined]
    spent = {phase: sum(cum for (path, _, name), (_, _, _, cum, _) in rows if path.endswith(where) and name == fn)
             for phase, (where, fn) in PHASES.items()}
    whole = spent.pop("the run's analysis and report") or 1.0
    spent["Hypothesis between examples, the run's analysis and report"] = whole - sum(spent.values())
    return "time by phase: " + ", ".join(f"{k} {v / whole:.0%}" for k, v in spent.items())


if __name__ == "__main__":
    raise SystemExit(main())
