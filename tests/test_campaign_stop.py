"""A campaign that is stopped leaves nothing running and loses nothing its shards recorded.

A CI job that is cancelled, or a scheduler ending a job, signals the campaign's process — often it alone.
Its shards are processes of their own: left to themselves they would drive their engines on, orphaned.
Both ways, with real processes and real signals (the FAKE engine, for speed: what is tested is the
campaign's handling), each locally and on a local Ray runtime: SIGTERM to the campaign is passed on to
every shard, each ends with an INTERRUPTED history, the merge says error, the exit is 143 (a Ray driver's
own handler had exited 1: FAIL); SIGKILL (no handler can run) still takes the shards with it, each ending
its history the same way (Ray had SIGKILLed them with their worker, cutting their histories). The
campaign that is not stopped is tests/test_merge.py's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the shards' parent-death signal is Linux's")


@pytest.fixture
def out(tmp_path):
    """The campaign's folder; whatever still runs in its name when the test ends (a test that failed: the
    orphans it found) is killed, so a red test does not leave engines running in CI."""
    folder = tmp_path / "c"
    yield folder
    for line in _left_running(folder, pids=True):
        try:
            os.kill(int(line), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _started(out: Path, executor: tuple[str, ...]) -> subprocess.Popen:
    """A campaign of two shards, once both are examining (`--ray`: skipped without ray)."""
    if executor:
        pytest.importorskip("ray", reason="ray is not installed (pip install 'kvparity[ray]')")
    proc = subprocess.Popen([sys.executable, "-m", "kvparity", "campaign", *executor, "--shards", "2",
                             "--out", str(out), "--engine", "tests.fake_engine:FakeDictEngine", "--profile", "nightly",
                             "--max-examples", "100000", "--no-shrink", "--database", str(out.parent / "db")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_until_both_shards_are_examining(out, proc)
    return proc


def _histories(out: Path) -> list[Path]:
    return sorted(out.glob("shards/*/*/*/history.jsonl"))


def _wait_until_both_shards_are_examining(out: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        paths = _histories(out)
        if len(paths) == 2 and all('"event":"example"' in p.read_text() for p in paths):
            return
        time.sleep(0.2)
    pytest.fail(f"the shards did not start examining (campaign exit {proc.poll()})")


def _left_running(out: Path, pids: bool = False) -> list[str]:
    """Processes whose command line names this campaign's folder (its shards' supervisors and runs): their
    command lines, or (`pids`) their process ids."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(out) in text:
            found.append(cmdline.parent.name if pids else text)
    return found


def _wait_for_none_left(out: Path, within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := _left_running(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _causes(out: Path) -> list[str]:
    return [next((json.loads(line)["cause"] for line in p.read_text().splitlines() if '"event":"interrupted"' in line),
                 "not interrupted") for p in _histories(out)]


@pytest.mark.parametrize("executor", [(), ("--ray",)], ids=["local", "ray"])
def test_sigterm_to_the_campaign_stops_every_shard_with_a_report(out, executor):
    proc = _started(out, executor)
    proc.send_signal(signal.SIGTERM)
    printed, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, printed
    assert not _left_running(out)
    assert all(c.startswith("SIGTERM") for c in _causes(out)) and len(_causes(out)) == 2, _causes(out)
    assert json.loads((out / "results.json").read_text())["verdict"] == "error"
    assert "INTERRUPTED: the campaign was stopped by SIGTERM" in printed


@pytest.mark.parametrize("executor", [(), ("--ray",)], ids=["local", "ray"])
def test_a_campaign_killed_outright_takes_its_shards_with_it(out, executor):
    proc = _started(out, executor)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    left = _wait_for_none_left(out, 60)
    assert not left, left
    assert all(c.startswith("SIGTERM") for c in _causes(out)) and len(_causes(out)) == 2, _causes(out)


def test_the_campaign_echoes_its_shards_progress_lines_and_not_an_engines_progress_bar(tmp_path, capsys):
    """A shard's console: kvparity's progress lines among an engine's own output, including a progress bar
    that redraws one line with carriage returns for as long as the shard runs. Its progress lines are echoed,
    named by shard, and the bar is neither echoed nor kept: 2 MB of it leave at most one line's tail held,
    and what is read at one poll is the newest output, however much came since the last."""
    from conformance.shard_process import CONSOLE, ProgressEcho

    folders = [tmp_path / "1", tmp_path / "2"]
    for folder in folders:
        folder.mkdir()
    console = folders[1] / CONSOLE
    bar = "".join(f"\rProcessed prompts: {k}%|" for k in range(100)).encode()
    console.write_bytes(b"INFO engine up\nkvparity: 10/100 examples, no failure\n" + bar
                        + b"\nkvparity: 20/100 examples, no failure\n")
    echo = ProgressEcho(folders)
    echo()
    assert capsys.readouterr().err.splitlines() == ["shard 2/2: 10/100 examples, no failure",
                                                    "shard 2/2: 20/100 examples, no failure"]
    with open(console, "ab") as out:
        out.write(bar * 2000)  # ~2 MB, no newline
    echo()
    assert len(echo.partial[1]) <= ProgressEcho.LINE_CHARS and echo.offsets[1] == console.stat().st_size
    with open(console, "ab") as out:
        out.write(b"\rkvparity: 30/100 examples, no failure\r" + bar[:40])
    echo()
    assert capsys.readouterr().err.splitlines() == ["shard 2/2: 30/100 examples, no failure"]
    echo.feed(0, bar * 2000)
    assert len(echo.partial[0]) <= ProgressEcho.LINE_CHARS
