"""A run stopped from outside: SIGTERM and SIGHUP (a CI cancel, `docker stop`, a closed terminal), a child
that stops answering (an engine call holding the GIL, SIGSTOP), a supervisor killed outright. Each ends
with a report that never says pass, the exit code that says how it was stopped, and no process of the
run left behind — the run's child, and the `kvparity serve` the HTTP adapter started on 127.0.0.1.

Runs go through the real console entry (`python -m kvparity`, supervised) in a subprocess. Engines:
the test-only FAKES `ChaosEngine` (tests/chaos_engine.py) and `GilHoldingEngine` (tests/gil_engine.py),
and the real HTTP adapter against a real `kvparity serve`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from kvparity.cli import main
from conformance.history import load

TESTS = Path(__file__).parent
EXAMPLE = '"event":"example"'


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    kids = [int(x) for x in out]
    return kids + [d for k in kids for d in descendants(k)]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def wait_gone(pids: list[int], limit_s: float) -> list[int]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _stop_signals_default() -> None:
    """In the run's process, before it starts: SIGINT and SIGHUP at their defaults. The run leaves a
    signal its parent ignores ignored (as `nohup` asks), and this test's own process may ignore them (a
    background job ignores SIGINT; pytest under nohup, SIGHUP): the signals tested must reach the run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Run:
    """One supervised `python -m kvparity run` in its own session, and every process it started
    (recorded as they appear, SIGKILLed at the end of the test whatever happened)."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.root = tmp_path / "runs"
        self.proc = subprocess.Popen([sys.executable, "-m", "kvparity", "run", "--report-dir", str(self.root),
                                      "--no-shrink", "--seed", "1", "-q", *args], cwd=tmp_path, env=env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True,
                                     preexec_fn=_stop_signals_default)
        self.seen: set[int] = set()

    def tree(self) -> list[int]:
        pids = descendants(self.proc.pid)
        self.seen.update(pids)
        return pids

    def wait_for(self, examples: int, server: bool = False, limit_s: float = 90) -> Path:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the run ended before it could be stopped"
            pids = self.tree()
            served = not server or any("kvparity.commands.serve" in cmdline(p) for p in pids)
            for history in self.root.glob("*/*/history.jsonl"):
                if served and history.read_text().count(EXAMPLE) >= examples:
                    return history.parent
            time.sleep(0.1)
        raise AssertionError("the run never got going")

    def child(self) -> int:
        return descendants(self.proc.pid)[0]

    def finish(self, limit_s: float) -> tuple[int, str, float]:
        started = time.monotonic()
        out, err = self.proc.communicate(timeout=limit_s)
        return self.proc.returncode, out + err, time.monotonic() - started

    def clean_up(self) -> None:
        for pid in [self.proc.pid, *self.seen]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.proc.poll() is None:
            self.proc.wait()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for r in started:
        r.clean_up()


def start(runs: list[Run], tmp_path: Path, *args: str) -> Run:
    run = Run(tmp_path, *args)
    runs.append(run)
    return run


SLOW = ("--engine", "chaos_engine:ChaosEngine", "--engine-arg", "chaos=slow@run", "--engine-arg", "slow_s=0.05",
        "--max-examples", "300")


def assert_interrupted_report(run_dir: Path, by: str) -> None:
    """History kept and ended by an `interrupted` event naming the signal; the files never say pass."""
    history = load(run_dir / "history.jsonl")
    assert history.interrupted and history.interrupted.startswith(by), history.interrupted
    assert json.loads((run_dir / "results.json").read_text())["verdict"] == "error"
    assert "INTERRUPTED: this run did not finish" in (run_dir / "report.md").read_text()
    assert main(["report", str(run_dir)]) == 3


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("to", ["supervisor", "group"])
def test_a_stop_signal_ends_the_run_like_ctrl_c(runs, tmp_path, signum, code, to):
    run = start(runs, tmp_path, *SLOW)
    run_dir = run.wait_for(4)
    child = run.child()
    (os.kill if to == "supervisor" else os.killpg)(run.proc.pid, signum)
    returncode, out, took = run.finish(90)  # the interrupted report is written first; a loaded CI machine is slow
    assert returncode == code, out
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1].startswith("INTERRUPTED:"), out
    assert_interrupted_report(run_dir, signal.Signals(signum).name)
    assert not wait_gone([child], 10), "the run's child outlived its supervisor"


def test_sigterm_to_the_supervisor_leaves_no_process_of_the_run_and_no_server(runs, tmp_path):
    run = start(runs, tmp_path, "--engine", "openai_http", "--engine-arg", "serve=kvparity", "--max-examples", "300")
    run_dir = run.wait_for(2, server=True)
    pids = run.tree()
    assert any("kvparity.commands.serve" in cmdline(p) for p in pids)
    os.kill(run.proc.pid, signal.SIGTERM)
    sent = time.monotonic()
    assert not wait_gone([run.proc.pid, *pids], 10), [cmdline(p) for p in pids if alive(p)]
    assert time.monotonic() - sent < 10
    returncode, out, _ = run.finish(5)
    assert returncode == 143, out
    assert "Traceback" not in out and "Exception ignored" not in out, out
    assert_interrupted_report(run_dir, "SIGTERM")


@pytest.mark.parametrize("victim", ["supervisor", "child"])
def test_a_server_dies_with_the_run_even_when_the_run_is_killed_outright(runs, tmp_path, victim):
    """SIGKILL runs no handler and no `close()`: the child dies with its supervisor (PR_SET_PDEATHSIG),
    the server with the process that started it (its leash)."""
    run = start(runs, tmp_path, "--engine", "openai_http", "--engine-arg", "serve=kvparity", "--max-examples", "300")
    run.wait_for(2, server=True)
    pids = run.tree()
    server = [p for p in pids if "kvparity.commands.serve" in cmdline(p)]
    os.kill(run.proc.pid if victim == "supervisor" else run.child(), signal.SIGKILL)
    survivors = wait_gone(pids, 10)
    assert not survivors, [cmdline(p) for p in survivors]
    assert server and not alive(server[0])
    returncode, out, _ = run.finish(30)
    if victim == "child":  # the supervisor answers for it
        assert returncode == 3 and "killed by SIGKILL before it finished" in out, out


def test_an_engine_call_holding_the_gil_is_killed_within_the_timeout_and_reported_as_error(runs, tmp_path):
    run = start(runs, tmp_path, "--engine", "gil_engine:GilHoldingEngine", "--engine-arg", "at=3",
                "--engine-arg", "secs=120", "--max-examples", "20", "--timeout", "2")
    run.wait_for(2)
    child = run.child()
    returncode, out, took = run.finish(60)
    assert returncode == 3, out
    assert "stopped answering" in out and "holding the GIL" in out, out
    assert took < 2 + 5 + 8, f"{took:.1f}s under --timeout 2"
    (run_dir,) = [p.parent for p in run.root.glob("*/*/history.jsonl")]
    assert json.loads((run_dir / "results.json").read_text())["verdict"] == "error"
    assert "stopped answering" in (run_dir / "report.md").read_text()
    assert main(["report", str(run_dir)]) == 3
    assert not alive(child)


def test_a_stopped_child_is_killed_and_reported_as_error(runs, tmp_path):
    run = start(runs, tmp_path, *SLOW, "--timeout", "2")
    run_dir = run.wait_for(3)
    child = run.child()
    os.kill(child, signal.SIGSTOP)
    returncode, out, took = run.finish(60)
    assert returncode == 3, out
    assert "stopped answering" in out, out
    assert took < 2 + 5 + 8
    assert json.loads((run_dir / "results.json").read_text())["verdict"] == "error"
    assert main(["report", str(run_dir)]) == 3
    assert not alive(child)


def test_the_heartbeat_limit_is_the_runs_timeout_plus_a_margin():
    from conformance import supervisor

    assert supervisor.heartbeat_limit(["run", "--engine", "x", "--timeout", "2"]) == 2 + supervisor.HEARTBEAT_MARGIN_S
    assert supervisor.heartbeat_limit(["replay", "w.json", "--timeout=7.5"]) == 7.5 + supervisor.HEARTBEAT_MARGIN_S
    assert supervisor.heartbeat_limit(["run", "--timeout", "soon"]) == 300 + supervisor.HEARTBEAT_MARGIN_S


def test_the_leash_passes_the_servers_exit_code_on():
    from adapters.openai_http import leash

    cmd = leash.command(os.getpid(), [sys.executable, "-c", "raise SystemExit(7)"])
    assert subprocess.run(cmd, timeout=30).returncode == 7
    killed = leash.command(os.getpid(), [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert subprocess.run(killed, timeout=30).returncode == -signal.SIGTERM


def test_the_leash_ends_its_server_when_the_process_holding_it_is_gone(tmp_path):
    """The leash alone: its holder dies by SIGKILL (no `close()`, no handler); the server goes within seconds."""
    from adapters.openai_http import leash

    pid_file = tmp_path / "server.pid"
    server = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                    "time.sleep(120)"]
    hold = ("import os, subprocess, sys, time; "
            "subprocess.Popen([str(os.getpid()) if a == 'HOLDER' else a for a in sys.argv[1:]], "
            "start_new_session=True); time.sleep(120)")
    leashed = [a if a != "0" else "HOLDER" for a in leash.command(0, server)[:5]] + leash.command(0, server)[5:]
    holder = subprocess.Popen([sys.executable, "-c", hold, *leashed], start_new_session=True)
    server_pid = 0
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        assert alive(server_pid)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert not wait_gone([server_pid], 10), "the server outlived the process that started it"
    finally:
        for pid in (holder.pid, server_pid):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
