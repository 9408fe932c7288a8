"""One `run_suite` run, timed as the benchmarks that measure the harness time it: shared by
instant_engine.py, harness_overhead.py and collector_time.py (benchmarks/ is on their path)."""

from __future__ import annotations

import contextlib
import tempfile
import time
from typing import Any

from attrs import frozen


@frozen
class TimedRun:
    outcome: Any
    wall_s: float
    cpu_s: float  # the process's CPU (every thread)
    thread_cpu_s: float  # the calling thread's: the harness's own, the engine's calls run on another thread
    engine_s: float  # inside engine calls (conformance.calls.EngineCalls.busy_s)


def timed_run(engine: Any, freeze: bool = True, profiler: Any = None, **config: Any) -> TimedRun:
    """Run `engine` through `run_suite` with `RunConfig(**config)`, its report and example database in a
    temporary folder, the heap frozen as `kvparity run` freezes it (`freeze`), `profiler` (cProfile)
    enabled around the run alone."""
    from conformance import heap
    from conformance.calls import EngineCalls
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite

    calls = EngineCalls(600.0)
    with tempfile.TemporaryDirectory() as out, heap.frozen() if freeze else contextlib.nullcontext():
        wall, cpu, thread_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        if profiler:
            profiler.enable()
        outcome = run_suite(engine, RunConfig(report_dir=out, database_dir=out, **config), calls=calls)
        if profiler:
            profiler.disable()
        return TimedRun(outcome, time.perf_counter() - wall, time.process_time() - cpu,
                        time.thread_time() - thread_cpu, calls.busy_s)
