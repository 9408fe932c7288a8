"""One verdict, written once: the exit code, results.json, report.md/html, junit.xml and `kvparity report`
always agree, and a run that ends badly is `error` in every one of them.

Measured on 1621583 (the issue "Fail closed, round two"): with `close()` raising or hanging past
`--timeout` the exit code was 3 while results.json said `pass`, report.md PASS, junit.xml had no
failure and no error, and `kvparity report` said PASS; `kvparity report RUN --checks parity` overwrote a
failed run's verdict with a PASS on one check; and `kvparity report` wrote through a `results.json` or
`witnesses/` planted as a symlink, to files outside the run folder. The engines are the test FAKES
tests/chaos_engine.py and tests/fake_engine.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity.cli import main

TESTS = Path(__file__).parent
CHAOS = "chaos_engine:ChaosEngine"
FAKE = "fake_engine:FakeDictEngine"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Keep the Hypothesis example database (.hypothesis/) out of the repository."""
    monkeypatch.chdir(tmp_path)


def the_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.glob("*/*") if p.is_dir()]
    return run_dir


def verdicts_in_files(run_dir: Path) -> dict[str, str]:
    """What each report file of a run folder says the verdict is."""
    results = json.loads((run_dir / "results.json").read_text())
    junit = (run_dir / "junit.xml").read_text()
    failures = int(junit.split('failures="')[1].split('"')[0])
    errors = int(junit.split('errors="')[1].split('"')[0])
    return {"results.json": f"{results['verdict']} {results['exit_code']}",
            "report.md": "error 3" if "verdict **ERROR** (exit 3)" in (run_dir / "report.md").read_text() else "?",
            "report.html": "error 3" if "<b>ERROR</b> (exit 3)" in (run_dir / "report.html").read_text()
            else "?",
            "junit.xml": "error 3" if errors and not failures else f"failures {failures} errors {errors}"}


@pytest.mark.parametrize("chaos", ["raise@close", "hang@close", "exit0@close"])
def test_a_failing_close_is_error_in_the_exit_code_every_file_and_kvparity_report(tmp_path, capsys, chaos):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "kvparity", "run", "--engine", CHAOS, "--engine-arg",
                           f"chaos={chaos}", "--report-dir", str(tmp_path / "runs"), "--max-examples", "8",
                           "--no-shrink", "--seed", "1", "--timeout", "1", "--checks", "parity", "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run_dir = the_run_dir(tmp_path / "runs")
    assert set(verdicts_in_files(run_dir).values()) == {"error 3"}, verdicts_in_files(run_dir)
    assert main(["report", str(run_dir)]) == 3
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("ERROR:")
    assert set(verdicts_in_files(run_dir / "reanalysis").values()) == {"error 3"}


def test_a_run_process_that_dies_after_its_verdict_gets_error_files(tmp_path, capsys):
    """The supervisor's dead-child path: a child that told PASS and then died leaves error files."""
    from conformance.supervisor import _answer_for_dead_child

    assert main(["run", "--engine", FAKE, "--report-dir", str(tmp_path / "runs"), "--seed", "3",
                 "--max-examples", "5", "--no-shrink", "--checks", "parity", "-q"]) == 0
    run_dir = the_run_dir(tmp_path / "runs")
    assert json.loads((run_dir / "results.json").read_text())["verdict"] == "pass"
    assert _answer_for_dead_child("run", -9, {"run_dir": str(run_dir), "verdict": 0}) == 3
    assert "was killed by SIGKILL after its verdict" in capsys.readouterr().out
    assert set(verdicts_in_files(run_dir).values()) == {"error 3"}
    # ...and so does `kvparity report` of it: its history is complete and sealed, and judged alone said PASS
    assert main(["report", str(run_dir)]) == 3
    assert "killed by SIGKILL after its verdict" in capsys.readouterr().out
    assert set(verdicts_in_files(run_dir / "reanalysis").values()) == {"error 3"}


@pytest.fixture
def failed_run(tmp_path) -> Path:
    """A real failed run: isolation fails (a salt leak), parity passes."""
    assert main(["run", "--engine", FAKE, "--engine-arg", "bug=salt_leak", "--checks", "isolation,parity",
                 "--report-dir", str(tmp_path / "runs"), "--seed", "3", "--max-examples", "40", "--no-shrink",
                 "-q"]) == 1
    return the_run_dir(tmp_path / "runs")


def test_report_with_fewer_checks_never_overwrites_the_runs_verdict_and_says_so(failed_run, capsys):
    capsys.readouterr()
    own = {n: (failed_run / n).read_bytes() for n in ("results.json", "report.md", "report.html", "junit.xml")}
    assert main(["report", str(failed_run), "--checks", "parity"]) == 0
    out = capsys.readouterr().out
    assert "check set narrowed to parity; the run also chose isolation" in out
    assert {n: (failed_run / n).read_bytes() for n in own} == own  # still the run's FAIL
    again = json.loads((failed_run / "reanalysis" / "results.json").read_text())
    assert again["verdict"] == "pass" and again["reanalysis"]["narrowed"] == ["isolation"]
    assert "check set NARROWED" in (failed_run / "reanalysis" / "report.md").read_text()


def test_report_never_writes_through_a_symlinked_results_json(failed_run, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not kvparity's to write")
    (failed_run / "results.json").unlink()
    (failed_run / "results.json").symlink_to(outside)
    main(["report", str(failed_run)])
    assert outside.read_text() == "not kvparity's to write"


@pytest.mark.parametrize("planted", ["witnesses", "reanalysis"])
def test_a_symlinked_folder_in_the_run_folder_is_refused_in_one_line(failed_run, tmp_path, capsys, planted):
    outside = tmp_path / "outside"
    outside.mkdir()
    if planted == "witnesses":  # a run folder without its verdict yet: `kvparity report` writes it there
        (failed_run / "results.json").unlink()
    for p in sorted((failed_run / planted).rglob("*"), reverse=True) if (failed_run / planted).exists() else []:
        p.rmdir() if p.is_dir() else p.unlink()
    if (failed_run / planted).exists():
        (failed_run / planted).rmdir()
    (failed_run / planted).symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    assert main(["report", str(failed_run)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a symlink" in err, err
    assert list(outside.iterdir()) == []


def test_a_run_whose_report_cannot_be_written_safely_is_an_error(tmp_path):
    """run_suite into a folder with a planted results.json symlink: nothing written through it."""
    sys.path.insert(0, str(TESTS))
    from fake_engine import FakeDictEngine

    from conformance.runner import run_suite

    from conformance.run_config import RunConfig

    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").symlink_to(outside)
    outcome = run_suite(FakeDictEngine(), RunConfig(engine_name=FAKE, run_dir=run_dir, max_examples=3, shrink=False,
                                                    database_dir=tmp_path / "db", checks=["parity"]))
    assert outcome.report_error and "is a symlink" in outcome.report_error
    assert outside.read_text() == "{}"


def test_two_runs_starting_in_one_second_each_get_a_run_folder_of_their_own(tmp_path, monkeypatch):
    """The folder is made, not looked for and then made: two runs starting in one second (a CI script's
    `kvparity run ... &` twice) could both find a name free, and the second crashed on it. The race is
    forced here: every name looks free."""
    from conformance import run_folder

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(Path, "exists", lambda self: False)
    made = [run_folder.new_run_dir(tmp_path, "reference") for _ in range(3)]
    assert len(set(made)) == 3 and all(p.is_dir() for p in made)


def test_a_file_where_the_engine_s_folder_should_be_is_an_error_not_a_search(tmp_path):
    from conformance import run_folder

    (tmp_path / "reference").write_text("")
    with pytest.raises(OSError):
        run_folder.new_run_dir(tmp_path, "reference")
