"""The pytest plugin's state-machine test, in a process of its own: `python -m conformance.machine_run OPTIONS`.

The state machine drives an engine, and an engine can end the process it runs in (`os._exit(0)`) or
leave a thread stuck inside it. In pytest's own process the first reads as a green session and the
second left the session to Hypothesis' handling of a failure that does not come back. So the plugin
runs the machine here, as `kvparity run` runs the stream in its child, and supervises it
(`conformance.plugin_runs`): this process tells its exit code through the status file
(`conformance.status`) as its very last act, and a child that ends without telling it died.

OPTIONS is one JSON object: engine name, args, profile, checks, timeout_s, max_examples. Exit codes as
everywhere: 0 the machine passed, 1 a check failed (the falsifying program is printed), 3 an engine
error (crash, hang past the timeout, malformed answer) or a usage problem, 130 interrupted. The process
ends with `os._exit` once it has told its code: a hung call's thread may still be inside the engine.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Sequence

from conformance.exit_codes import ExitCode


def machine_examples(max_examples: int) -> int:
    """State-machine runs for a stream of `max_examples`: a quarter of them, at least 5 — but never
    more than asked for, so `--kvparity-max-examples 1` stays a quick run."""
    return min(max_examples, max(5, max_examples // 4))


def run_machine(o: dict[str, Any]) -> int:
    """Build the engine, run the machine, close the engine; the exit code, with why printed."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from conformance import seeded
    from conformance.engine_lifecycle import build_engine, close_engine
    from conformance.contract import EngineError, UsageError
    from conformance.run_config import profile_settings
    from conformance.stateful import EngineBroken, session_machine

    timeout_s = float(o["timeout_s"])
    try:
        base = profile_settings(o["profile"])
        engine = build_engine(o["name"], o["args"], timeout_s)
    except (UsageError, EngineError) as exc:
        print(f"kvparity: error: {exc}", flush=True)
        return ExitCode.ERROR
    calls = None
    try:
        machine = session_machine(engine, o["checks"], timeout_s=timeout_s)
        calls = machine.calls  # type: ignore[attr-defined]
        examples = machine_examples(o["max_examples"] or base.max_examples)
        with seeded.seed_only():
            run_state_machine_as_test(machine, settings=settings(base, max_examples=examples, stateful_step_count=8,
                                                                 database=None))
        code = ExitCode.PASS
    except (EngineBroken, EngineError) as exc:
        print(f"engine error: {exc}", flush=True)
        code = ExitCode.ERROR
    except UsageError as exc:  # e.g. an unknown check: the user's input, not the engine
        print(f"kvparity: error: {exc}", flush=True)
        code = ExitCode.ERROR
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a failed check (with Hypothesis' program), or the suite's bug
        code = ExitCode.FAIL if _only_conformance(exc) else ExitCode.ERROR
        # A failed check: its message and Hypothesis' falsifying program (the exception's notes) are
        # what a reader needs; anything else is the suite's own bug, shown with its traceback.
        alone = code == ExitCode.FAIL and not hasattr(exc, "exceptions")  # a group's parts are in its traceback
        lines = traceback.format_exception_only(exc) if alone else traceback.format_exception(exc)
        print("".join(lines), flush=True)
    if calls is not None and calls.abandoned:  # a hung engine is not asked to close
        return code
    closed = close_engine(engine, timeout_s)
    if closed is not None:
        print(f"ERROR: {closed}", flush=True)
        return max(code, ExitCode.ERROR)
    return code


def _only_conformance(exc: BaseException) -> bool:
    from conformance.runner import ConformanceFailure

    inner = getattr(exc, "exceptions", None)
    if inner:
        return all(_only_conformance(e) for e in inner)
    return isinstance(exc, ConformanceFailure)


def main(argv: Sequence[str]) -> None:
    from conformance import lifeline, status, stopping

    if lifeline.attach():  # supervised (the pytest plugin): beat for the supervisor, die with it
        stopping.install()  # SIGTERM and SIGHUP end the machine as Ctrl-C does

    try:
        options = json.loads(argv[0])
    except (IndexError, ValueError) as exc:
        print(f"usage: python -m conformance.machine_run OPTIONS_JSON ({exc})", file=sys.stderr)
        code = ExitCode.ERROR
    else:
        code = run_machine(options)
    status.tell(exit=code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
