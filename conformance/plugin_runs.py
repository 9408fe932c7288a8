"""The pytest plugin's engine-driving work, each in a supervised child process: the Hypothesis stream and
the state machine.

An engine can end the process it runs in (`os._exit(0)`) or hang; in pytest's own process the first
ended the session with exit 0 and no output, and a timed-out call in the state machine could still let
its test pass. So no engine runs in the pytest process. The stream is `python -m kvparity run ...`,
the command `kvparity run` runs in its child; the state machine is `python -m conformance.machine_run`.
This process plays the supervisor (`conformance.supervisor`): each child tells its run folder and exit
code through a status file, and here they are checked against each other and against what the run wrote.

Fail closed: a child that ends without telling its exit code died (for the stream, the report of what
it recorded is written as `kvparity run` writes it, saying how the process ended); a child whose told
exit code is not its real one, or not the one its `results.json` gives, is an error. Each of these is a
`RunProblem`, which fails the tests that needed the run. A child interrupted by Ctrl-C is `Interrupted`.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from attrs import define

from conformance.exit_codes import ExitCode
from conformance.supervisor import answer_for_dead_run, how_it_ended, run_child

OUTPUT_LINES = 60  # the last lines of a child's output a failure message quotes


class RunProblem(Exception):
    """A child's work cannot be trusted as a verdict (it died, or what it said disagrees with itself).
    `run_dir`: the run folder it left, if any (its report says more)."""

    def __init__(self, message: str, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class Interrupted(RunProblem):
    """The child was interrupted (Ctrl-C): the session ends with exit 130."""


@define
class StreamOutcome:
    """A finished stream run, as the per-check tests read it: its folder, the analysis rebuilt from its
    `results.json`, and the exit code the run ended with (which agrees with that analysis)."""

    run_dir: Path
    analysis: Any

    @property
    def verdict(self) -> str:
        return self.analysis.verdict

    @property
    def exit_code(self) -> int:
        return self.analysis.exit_code


def stream_argv(o: dict[str, Any]) -> list[str]:
    """The `kvparity run` command line for the plugin's options (`-q`: no progress line in a log)."""
    argv = ["run", "--engine", o["name"], "--profile", o["profile"], "--report-dir", str(o["report_dir"]),
            "--timeout", repr(float(o["timeout_s"])), "-q"]
    for key, value in o["args"].items():
        argv += ["--engine-arg", f"{key}={value}"]
    if o.get("checks"):
        argv += ["--checks", ",".join(o["checks"])]
    if o.get("seed") is not None:
        argv += ["--seed", str(o["seed"])]
    if o.get("max_examples") is not None:
        argv += ["--max-examples", str(o["max_examples"])]
    for option in ("shard", "database"):
        if o.get(option) is not None:
            argv += [f"--{option}", str(o[option])]
    return argv


def run_stream(o: dict[str, Any]) -> StreamOutcome:
    """Run the stream as `kvparity run` does, in a child; its outcome, or a RunProblem saying why not."""
    returncode, status, output = _child(stream_argv(o), "kvparity", float(o["timeout_s"]))
    run_dir = Path(status["run_dir"]).resolve() if status.get("run_dir") else None
    if "exit" not in status:
        with contextlib.redirect_stdout(io.StringIO()):  # the report says it; the message below too
            answer_for_dead_run(returncode, status)  # writes the report of what was recorded, as kvparity run does
        when = ("after its verdict" if "verdict" in status else "while closing the engine" if status.get("closing")
                else "before it finished")
        raise RunProblem(f"the kvparity run process {status.get('killed') or how_it_ended(returncode)} {when}"
                         + (f"; report {run_dir}" if run_dir else "") + _quote(output), run_dir)
    told = _told(status, returncode, "kvparity run", output, run_dir)
    if told == ExitCode.INTERRUPTED:
        raise Interrupted(f"kvparity run interrupted; report {run_dir}", run_dir)
    if run_dir is None:
        raise RunProblem(f"kvparity run exited {told} before it started a run" + _quote(output))
    return read_outcome(run_dir, told, output)


def read_outcome(run_dir: Path, told: int, output: str = "") -> StreamOutcome:
    """The outcome of a run that exited `told`, from its `results.json`, which must say the same."""
    from conformance.verdicts import EXIT_CODES

    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError) as exc:
        raise RunProblem(f"cannot read the stream run's results in {run_dir}: {exc}" + _quote(output), run_dir) from None
    verdict = results.get("verdict")
    expected = results.get("exit_code", EXIT_CODES.get(verdict))
    if told != expected or (told == 0 and not results.get("finished")):
        raise RunProblem(f"kvparity run exited {told} but its results.json says {verdict} (exit {expected}"
                         f"{'' if results.get('finished') else ', not finished'}); report {run_dir}" + _quote(output),
                         run_dir)
    return StreamOutcome(run_dir, analysis_from_results(results))


def run_machine(o: dict[str, Any]) -> None:
    """Run the state machine in a child; return if it passed, else raise RunProblem with its output."""
    keys = ("name", "args", "profile", "checks", "timeout_s", "max_examples")
    returncode, status, output = _child([json.dumps({k: o.get(k) for k in keys})], "conformance.machine_run",
                                        float(o["timeout_s"]))
    if "exit" not in status:
        raise RunProblem(f"the state-machine process {status.get('killed') or how_it_ended(returncode)} before it "
                         "finished" + _quote(output))
    told = _told(status, returncode, "the state-machine process", output, None)
    if told == ExitCode.INTERRUPTED:
        raise Interrupted("the state machine was interrupted")
    if told != 0:
        what = {1: "a check failed", 3: "error"}.get(told, f"exit {told}")
        raise RunProblem(f"state machine: {what}" + _quote(output))


def _child(argv: list[str], module: str, timeout_s: float) -> tuple[int, dict[str, Any], str]:
    """Run `python -m MODULE ARGV` as a supervised, status-telling child (killed when it stops beating for
    `timeout_s` + a margin); (return code, what it told, its output)."""
    with tempfile.TemporaryFile(mode="w+b") as out:
        returncode, status = run_child(argv, module=module, stdout=out, timeout_s=timeout_s)
        out.seek(0)
        return returncode, status, out.read().decode("utf-8", "replace")


def _told(status: dict[str, Any], returncode: int, who: str, output: str, run_dir: Path | None) -> int:
    """The exit code the child told, which must be the one it ended with."""
    told = int(status["exit"])
    if told != returncode:
        raise RunProblem(f"{who} said exit {told} but {how_it_ended(returncode)}" + _quote(output), run_dir)
    return told


def _quote(output: str) -> str:
    lines = output.strip().splitlines()[-OUTPUT_LINES:]
    return ("\n" + "\n".join(f"  | {line}" for line in lines)) if lines else ""


def analysis_from_results(results: dict[str, Any]) -> Any:
    """An `Analysis` equal (for what the tests read: statuses, failures, notes, errors) to the one the
    run computed, from the `results.json` it wrote."""
    from conformance.analysis import Analysis
    from conformance.verdicts import CheckResult, CheckFailure

    checks = {name: CheckResult(name, c["status"], [CheckFailure.from_json(f) for f in c.get("failures", [])],
                                c.get("notes", []), c.get("stats", {}))
              for name, c in results.get("checks", {}).items()}
    return Analysis(checks=checks, errors=list(results.get("errors", [])))
