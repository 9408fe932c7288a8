"""Reading a witness file (what it names is checked before anything runs: a witness cannot choose code
to import) and replaying it on a fresh engine: FIXED / FAILED / INCONCLUSIVE / ERROR. `kvparity replay`,
`kvparity export` and the fault zoo's tests share it, so it is library code, not a command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from conformance.arguments import DEFAULT_TIMEOUT_S
from conformance.contract import EngineError, UsageError
from conformance.exit_codes import ExitCode
from conformance.engine_lifecycle import Session, build_engine, close_engine

WITNESS_VERSION = 1


def read_witness(path: str | Path, engine: str | None) -> tuple[str, dict[str, Any], str, list[Any]]:
    """(engine name, engine args, check, steps) of a witness file. Nothing in the file chooses code to
    run: it may name a *registered* engine only; an unregistered `module:Class` is used only when the
    user names it with --engine."""
    from conformance.engines import known_engines
    from conformance.scenario import step_from_json
    from conformance.untrusted import check_example_size, read_json

    try:
        data = read_json(path, "witness")
        version = data.get("kvparity_witness")
        named, check, raw_steps = data["engine"], data["check"], data["steps"]
        args = data.get("engine_args") or {}
    except UsageError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"not a kvparity witness file: {path} ({exc})") from exc
    if version != WITNESS_VERSION:
        raise UsageError(f"{path}: witness format version {version!r}; this kvparity reads version {WITNESS_VERSION}")
    if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
        raise UsageError(f"{path}: engine_args must map names to strings")
    if engine is None:
        if not isinstance(named, str) or named not in known_engines():
            raise UsageError(f"{path} names engine {named!r}, which is not a registered engine (`kvparity engines`); "
                             f"a witness cannot choose code to import. To replay on that adapter, name it yourself: "
                             f"kvparity replay {path} --engine {named}")
        engine = named
    if not isinstance(check, str):
        raise UsageError(f"not a kvparity witness file: {path} (its check is {type(check).__name__}, not a name)")
    try:  # OverflowError: int(Infinity), which Python's JSON reads; AttributeError: a request that is no object
        steps = [step_from_json(s) for s in raw_steps]
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise UsageError(f"not a kvparity witness file: {path} (bad steps: {exc})") from exc
    _refuse_odd_fields(steps, path)
    check_example_size(len(steps), sum(len(getattr(s, "items", ())) for s in steps), f"witness {path}")
    return engine, args, check, steps


def _refuse_odd_fields(steps: list[Any], path: str | Path) -> None:
    """The fields the step reader passes on unconverted must have the types a run writes: a request id
    and a parent are names, a restop position an integer (a list or a string there was a traceback)."""
    from conformance.scenario import Batch, Continuation
    from conformance.validation import is_int

    for step in steps:
        for item in step.items if isinstance(step, Batch) else ():
            odd = ("id" if not isinstance(item.id, str) else
                   "parent" if isinstance(item, Continuation) and not isinstance(item.parent, str) else
                   "restop" if isinstance(item, Continuation) and item.restop is not None and not is_int(item.restop)
                   else None)
            if odd:
                raise UsageError(f"not a kvparity witness file: {path} (bad steps: request "
                                 f"{str(item.id)[:40]!r} has a {type(getattr(item, odd)).__name__} {odd})")


def witness_epsilon(path: str | Path) -> float | None:
    """The logprob epsilon a witness was found under (`logprob_epsilon`, written with a logprob_parity
    witness), or None. A value that is not a finite number >= 0 is a UsageError."""
    import math

    from conformance.untrusted import read_json

    eps = read_json(path, "witness").get("logprob_epsilon")
    if eps is None:
        return None
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise UsageError(f"{path}: logprob_epsilon {eps!r} is not a finite number >= 0")
    return float(eps)


def replay_case(path: str | Path, engine_args: dict[str, str] | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S, engine: str | None = None,
                session: Session | None = None) -> tuple[str, int, str]:
    """Re-run a witness's steps against a fresh engine and re-check its check.

    Returns (word, exit code, one-line detail): FIXED 0, FAILED 1, INCONCLUSIVE 2, ERROR 3. A witness of
    an engine error (check "error") is FAILED while the engine still fails on it and FIXED once it runs.
    """
    from conformance import validation
    from conformance.calls import EngineCalls
    from conformance.scenario_runner import replay
    from conformance.scenario import Configure
    from conformance.untrusted import check_configs, refuse_remote_hosts

    name, witness_args, check, steps = read_witness(path, engine)
    refuse_remote_hosts(witness_args, engine_args or {}, str(path))  # before anything connects
    args = {**witness_args, **(engine_args or {})}
    instance = build_engine(name, args, timeout_s)
    calls = EngineCalls(timeout_s)
    try:
        caps = validation.capabilities(calls(instance.capabilities, "capabilities"))
        eps = witness_epsilon(path)
        if eps is not None:  # a logprob_parity witness is judged by the epsilon it was found under
            caps = attrs.evolve(caps, logprob_epsilon=eps)
        check_configs([s.config for s in steps if isinstance(s, Configure)], caps.config_space, str(path))
        result, crashed = replay(instance, caps, steps, "parity" if check == "error" else check, calls=calls)
    except EngineError as exc:  # capabilities() itself failed
        return "ERROR", ExitCode.ERROR, str(exc)
    finally:
        if session is not None:
            session.hard_exit = calls.abandoned
        if not calls.abandoned:
            calls.close()
            close_engine(instance, timeout_s)
    if check == "error":
        if crashed:
            return "FAILED", ExitCode.FAIL, f"the engine still fails: {crashed}"
        return "FIXED", ExitCode.PASS, "the engine runs this case"
    if crashed is not None and result.status != "fail":  # a crash fails the check only where it says so
        return "ERROR", ExitCode.ERROR, crashed
    if result.status == "fail":
        return "FAILED", ExitCode.FAIL, result.failures[0].explanation
    if result.status == "pass":
        return "FIXED", ExitCode.PASS, f"{check} passes on this case"
    if result.status == "error":
        return "ERROR", ExitCode.ERROR, "; ".join(result.notes)
    return "INCONCLUSIVE", ExitCode.INCONCLUSIVE, "; ".join(result.notes) or "the case no longer exercises the check"
