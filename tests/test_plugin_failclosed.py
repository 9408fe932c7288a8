"""The pytest plugin is as closed as `kvparity run`: an engine that hangs, ends its process or fails to
close never leaves a green session, and a child whose exit code disagrees with its results fails it.

Each run is the plugin end to end (`pytest --pyargs conformance ...` in a subprocess, as a CI job runs
it) on the test-only `ChaosEngine` (tests/chaos_engine.py, a FAKE that misbehaves on purpose). With
`after=2` the fault fires on the engine's second call of its kind: the state machine and the stream each
build an engine of their own (as `kvparity run` builds a fresh one), so both meet it. Before the plugin
supervised its work, the stream ran on the engine the state machine had used (past its fault) and
passed, the machine's timeout surfaced only as Hypothesis' "flaky" error, and `os._exit(0)` ended
pytest with exit 0 and no output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_pytest_plugin import plugin_run as _plugin_run  # the one way to start the plugin afresh
from conformance.checks import CHECKS

CHAOS = "chaos_engine:ChaosEngine"
MACHINE = "test_engine_session_state_machine"


def plugin_run(tmp_path: Path, *args: str, engine: str = CHAOS, timeout: float = 240) -> subprocess.CompletedProcess:
    """The plugin in a fresh process in `tmp_path`, as tests/test_pytest_plugin.py starts it, on the chaos fake."""
    return _plugin_run(tmp_path, *args, engine=engine, timeout=timeout)


def chaos(tmp_path: Path, fault: str, *args: str) -> subprocess.CompletedProcess:
    return plugin_run(tmp_path, "--kvparity-engine-arg", f"chaos={fault}", "--kvparity-engine-arg", "after=2",
                      "--kvparity-engine-arg", "hang_s=600", "--kvparity-max-examples", "8",
                      "--kvparity-timeout", "2", *args)


def outcomes(stdout: str) -> dict[str, str]:
    """test name -> PASSED / FAILED / ERROR / SKIPPED, from `-rA`'s short summary."""
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) \S*::(\S+)", stdout, re.M)
    return {name: word for word, name in found}


def run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "runs").glob("*/*") if p.is_dir())


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_hanging_engine_call_fails_the_session_every_time(tmp_path, attempt):
    out = chaos(tmp_path, "hang@run", "-n", "0")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    results = outcomes(out.stdout)
    assert results[MACHINE] == "FAILED" and "run timed out after 2s" in text, text
    checks = {k: v for k, v in results.items() if k.startswith("test_check[")}
    assert len(checks) == len(CHECKS) and set(checks.values()) == {"FAILED"}, results  # the stream met the hang too
    assert "engine error: run timed out after 2s" in out.stdout
    (run,) = run_dirs(tmp_path)
    assert json.loads((run / "results.json").read_text())["verdict"] == "error"


def test_an_engine_that_calls_os_exit_0_fails_the_session_and_its_report_says_so(tmp_path):
    out = chaos(tmp_path, "exit0@run", "-n", "0")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    results = outcomes(out.stdout)
    assert results[MACHINE] == "FAILED", results
    assert "the state-machine process exited with code 0 before it finished" in out.stdout
    assert {v for k, v in results.items() if k.startswith("test_check[")} == {"ERROR"}, results
    assert "the kvparity run process exited with code 0 before it finished" in out.stdout
    (run,) = run_dirs(tmp_path)
    results_json = json.loads((run / "results.json").read_text())
    assert results_json["verdict"] == "error" and "exited with code 0" in results_json["process"]
    assert f"kvparity report: {run.resolve() / 'report.md'}" in out.stdout


def test_the_state_machine_alone_survives_os_exit(tmp_path):
    """Only the state machine selected: before, pytest itself died with exit 0 and printed nothing."""
    out = chaos(tmp_path, "exit0@run", "-n", "0", "-k", MACHINE)
    assert out.returncode == 1, out.stdout + out.stderr
    assert outcomes(out.stdout) == {MACHINE: "FAILED"}
    assert not run_dirs(tmp_path)  # no stream was asked for


@pytest.mark.parametrize("fault, says", [
    ("exit0@close", "the kvparity run process exited with code 0 while closing the engine"),
    ("raise@close", None),
])
def test_a_run_whose_close_fails_fails_the_session(tmp_path, fault, says):
    """The run's checks pass, then closing the engine ends the process (exit 0 without a word) or raises:
    either way the session must not go green, and the run's own files say error (the engine is closed
    before the report is written, so the close is part of the verdict)."""
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-engine-arg", f"chaos={fault}", "--kvparity-checks", "parity",
                     "--kvparity-max-examples", "4", "--kvparity-timeout", "5")
    assert out.returncode == 1, out.stdout + out.stderr
    assert says is None or says in out.stdout, out.stdout
    assert outcomes(out.stdout)[MACHINE] == "FAILED"
    assert "passed" not in out.stdout.splitlines()[-1] or "failed" in out.stdout.splitlines()[-1]
    (run,) = run_dirs(tmp_path)
    assert json.loads((run / "results.json").read_text())["verdict"] == "error"


def test_under_xdist_a_dead_stream_fails_every_worker_and_runs_once(tmp_path):
    out = chaos(tmp_path, "exit0@run", "-n", "2")
    assert out.returncode == 1, out.stdout + out.stderr
    results = outcomes(out.stdout)
    assert len(results) == len(CHECKS) + 1 and "PASSED" not in results.values(), results
    assert len(run_dirs(tmp_path)) == 1
    assert out.stdout.count("kvparity report: ") == 1  # the controller names the one run, once


def test_a_green_session_names_its_report_and_an_unrelated_session_is_untouched(tmp_path):
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-max-examples", "3", "--kvparity-allow-inconclusive",
                     engine="fake_engine:FakeDictEngine")
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = run_dirs(tmp_path)
    assert f"kvparity report: {run.resolve() / 'report.md'}" in out.stdout and (run / "report.md").is_file()
    (tmp_path / "test_other.py").write_text("def test_nothing():\n    pass\n")
    other = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                            str(tmp_path), str(tmp_path / "test_other.py")], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert other.returncode == 0 and "kvparity" not in other.stdout, other.stdout


def test_the_reference_engine_is_still_green(tmp_path):
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-max-examples", "4", "--kvparity-allow-inconclusive",
                     engine="reference")
    assert out.returncode == 0, out.stdout + out.stderr
    results = outcomes(out.stdout)
    assert results[MACHINE] == "PASSED" and "FAILED" not in results.values(), results


def test_an_engine_holding_the_gil_fails_the_session_within_its_deadline(tmp_path):
    """A call that holds the GIL for 120 s under `--kvparity-timeout 2`: the children stop beating and are
    killed after the timeout plus the supervisor's margin (before, the session waited the 120 s out)."""
    started = time.monotonic()
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-engine-arg", "at=3", "--kvparity-engine-arg", "secs=120",
                     "--kvparity-max-examples", "4", "--kvparity-timeout", "2", engine="gil_engine:GilHoldingEngine",
                     timeout=110)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "stopped answering" in out.stdout and time.monotonic() - started < 100
    assert "passed" not in out.stdout.splitlines()[-1], out.stdout.splitlines()[-1]
