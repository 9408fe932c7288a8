"""The `kvparity` command line: exit codes 0/1/2/3, unknown engines and arguments, replay, report.

The FAKE engine is named by import path (`fake_engine:FakeDictEngine`), the same `module:Class` form a
third-party adapter can use without registering an entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity.cli import main
from conformance.minimise import size
from conformance.scenario import step_from_json
from conformance.engines import load_engine, parse_engine_args
from conformance.contract import UsageError

FAKE = "fake_engine:FakeDictEngine"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Keep the Hypothesis example database (.hypothesis/) out of the repository."""
    monkeypatch.chdir(tmp_path)


def cli(tmp_path, *args: str) -> int:
    return main(["run", "--engine", FAKE, "--report-dir", str(tmp_path / "reports"), "--seed", "3",
                 "--max-examples", "30", *args])


def only_run_dir(tmp_path) -> Path:
    (run_dir,) = [p for p in (tmp_path / "reports").glob("*/*") if p.is_dir()]
    return run_dir


def test_run_clean_engine_exits_0(tmp_path, capsys):
    assert cli(tmp_path) == 0
    assert "PASS" in capsys.readouterr().out


def test_run_buggy_engine_exits_1_and_replay_reproduces_then_fixed(tmp_path, capsys):
    assert cli(tmp_path, "--engine-arg", "bug=salt_leak", "--checks", "isolation", "--no-shrink", "--max-examples", "100") == 1
    run_dir = only_run_dir(tmp_path)
    (witness,) = (run_dir / "witnesses").glob("isolation-*.json")
    assert f"kvparity replay {witness} --engine {FAKE}" in capsys.readouterr().out
    assert main(["replay", str(witness), "--engine", FAKE]) == 1
    assert capsys.readouterr().out.startswith("FAILED")
    assert main(["replay", str(witness), "--engine", FAKE, "--engine-arg", "bug=none"]) == 0  # the "fixed" engine
    assert capsys.readouterr().out.startswith("FIXED")
    assert main(["replay", str(witness), "--engine", FAKE, "--engine-arg", "bug=crash"]) == 3
    assert capsys.readouterr().out.startswith("ERROR")


def test_minimise_writes_a_smaller_witness_that_still_fails(tmp_path, capsys):
    assert cli(tmp_path, "--engine-arg", "bug=salt_leak", "--checks", "isolation", "--no-shrink", "--max-examples", "100", "--minimise") == 1
    run_dir = only_run_dir(tmp_path)
    out = capsys.readouterr().out
    (small,) = (run_dir / "witnesses").glob("isolation-*.min.json")
    assert f"minimised [isolation]: kvparity replay {small} --engine {FAKE}" in out
    assert f"kvparity replay {small}" in (run_dir / "report.md").read_text()
    original = run_dir / "witnesses" / json.loads(small.read_text())["minimised_from"]
    as_steps = [[step_from_json(s) for s in json.loads(p.read_text())["steps"]] for p in (small, original)]
    assert size(as_steps[0]) < size(as_steps[1])
    assert main(["replay", str(small), "--engine", FAKE]) == 1
    assert main(["replay", str(small), "--engine", FAKE, "--engine-arg", "bug=none"]) == 0


def test_run_with_unexercised_claims_exits_2(tmp_path):
    # an engine that claims chunked prefill and never chunks: however many examples coverage completion
    # adds after the stream, the vacuity guard makes it inconclusive
    assert cli(tmp_path, "--max-examples", "1", "--checks", "exercised",
               "--engine", "fake_engine_never_chunks:NeverChunksFake") == 2


def test_crashing_engine_exits_3_with_one_line_cause(tmp_path, capsys):
    assert cli(tmp_path, "--engine-arg", "bug=crash") == 3
    out = capsys.readouterr().out
    assert "ERROR: run raised RuntimeError: fake engine crashed" in out
    assert (only_run_dir(tmp_path) / "history.jsonl").stat().st_size > 0


def test_unknown_engine_exits_3_and_lists_known_names_with_did_you_mean(capsys):
    assert main(["run", "--engine", "refrence"]) == 3
    err = capsys.readouterr().err
    assert "unknown engine 'refrence'" in err and "did you mean 'reference'" in err and "known engines:" in err


@pytest.mark.parametrize("argv,message", [
    (["run", "--engine", FAKE, "--engine-arg", "nonsense"], "expected KEY=VALUE"),
    (["run", "--engine", FAKE, "--engine-arg", "colour=red"], "bad engine arguments"),
    (["run", "--engine", FAKE, "--engine-arg", "bug=not-a-bug"], "bad engine arguments"),
    (["run", "--engine", FAKE, "--checks", "parrity"], "did you mean 'parity'"),
    (["run", "--engine", "no_such_module:Engine"], "cannot import adapter module"),
    (["replay", "/nonexistent/witness.json"], "not a kvparity witness file"),
    (["report", "/nonexistent"], "no history.jsonl"),
    (["run", "--engine", FAKE, "--max-examples", "0"], "argument --max-examples: 0 must be at least 1"),
    (["run", "--engine", FAKE, "--max-examples", "-1"], "argument --max-examples: -1 must be at least 1"),
    (["run", "--engine", FAKE, "--timeout", "0"], "must be a finite number of seconds above 0"),
    (["run", "--engine", FAKE, "--timeout", "-5"], "must be a finite number of seconds above 0"),
    (["run", "--engine", FAKE, "--timeout", "nan"], "must be a finite number of seconds above 0"),
    (["run", "--engine", FAKE, "--timeout", "inf"], "must be a finite number of seconds above 0"),
    (["run", "--engine", FAKE, "--profile", "bogus"], "argument --profile: invalid choice: 'bogus'"),
    (["run", "--engine", FAKE, "--engine-arg", "bug=none", "--engine-arg", "bug=salt_leak"],
     "--engine-arg bug given twice ('none' and 'salt_leak')"),
    (["replay", "/nonexistent/witness.json", "--timeout", "0"], "must be a finite number of seconds above 0"),
])
def test_usage_errors_exit_3_with_a_one_line_cause(argv, message, capsys):
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bad_cli_syntax_exits_3():
    assert main(["run"]) == 3  # --engine missing


def test_a_report_dir_that_is_a_file_or_unwritable_is_refused_before_the_engine_starts(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert main(["run", "--engine", FAKE, "--report-dir", str(a_file)]) == 3
    assert capsys.readouterr().err.strip() == f"kvparity: error: --report-dir {a_file} is a file, not a folder"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root may write anywhere: a folder under a file cannot be made by anyone
        locked = a_file / "runs"
    assert main(["run", "--engine", FAKE, "--report-dir", str(locked)]) == 3
    err = capsys.readouterr().err.strip()
    assert "is not writable" in err and len(err.splitlines()) == 1


def test_help_shows_every_default(capsys):
    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: dev)", "(default: .kvparity/runs)", "(default: 300.0)"):
        assert default in out


def test_default_report_dir_is_untracked():
    from conformance.run_config import DEFAULT_REPORT_DIR

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["git", "check-ignore", "-q", DEFAULT_REPORT_DIR + "/x"], cwd=root)
    if proc.returncode == 128:
        pytest.skip("not a git checkout")
    assert proc.returncode == 0, f"{DEFAULT_REPORT_DIR} must be git-ignored"


def _witness(tmp_path, **changes) -> Path:
    data = {"kvparity_witness": 1, "engine": "reference", "engine_args": {}, "check": "parity",
            "steps": [{"step": "batch", "requests": [{"id": "r0", "prompt": [5, 6], "max_tokens": 1}]}], **changes}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    return path


def test_replay_never_imports_an_engine_a_witness_names(tmp_path, capsys):
    marker = tmp_path / "pwned"
    path = _witness(tmp_path, engine="os:system", engine_args={"command": f"touch {marker}"})
    assert main(["replay", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert not marker.exists()
    assert "names engine 'os:system', which is not a registered engine" in err
    assert f"kvparity replay {path} --engine os:system" in err and len(err.splitlines()) == 1


def test_replay_checks_the_witness_format_version(tmp_path, capsys):
    assert main(["replay", str(_witness(tmp_path, kvparity_witness=2))]) == 3
    assert "witness format version 2; this kvparity reads version 1" in capsys.readouterr().err


def test_report_keeps_what_it_cannot_recompute(tmp_path, capsys):
    assert cli(tmp_path, "--engine-arg", "bug=salt_leak", "--checks", "isolation", "--no-shrink", "--max-examples", "100", "--minimise") == 1
    run_dir = only_run_dir(tmp_path)
    before = json.loads((run_dir / "results.json").read_text())
    assert before["duration_s"] > 0 and before["minimised"]
    assert main(["report", str(run_dir)]) == 1
    after = json.loads((run_dir / "reanalysis" / "results.json").read_text())  # beside the run's own
    assert after["duration_s"] == before["duration_s"] and after["minimised"] == before["minimised"]
    assert "## Minimised witnesses" in (run_dir / "reanalysis" / "report.md").read_text()


def test_report_re_analyses_a_stored_history(tmp_path, capsys):
    assert cli(tmp_path, "--engine-arg", "bug=leak_blocks", "--checks", "rollback_hygiene", "--no-shrink") == 1
    run_dir = only_run_dir(tmp_path)
    before = json.loads((run_dir / "results.json").read_text())
    (run_dir / "results.json").unlink()
    assert main(["report", str(run_dir)]) == 1
    after = json.loads((run_dir / "results.json").read_text())
    assert after["checks"]["rollback_hygiene"]["status"] == before["checks"]["rollback_hygiene"]["status"] == "fail"
    assert "FAIL" in capsys.readouterr().out


def test_engines_lists_entry_points_without_importing_them(capsys):
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    for name in ("reference", "transformers", "vllm", "llama_cpp", "openai_http"):
        assert name in out


def test_registry_constructs_adapters_with_string_arguments():
    engine = load_engine(FAKE, parse_engine_args(["bug=none", "tolerance=0.5"]))
    assert engine.capabilities().tolerance == 0.5
    with pytest.raises(UsageError):
        parse_engine_args(["=x"])


def test_console_script_entry_point(tmp_path):
    here = Path(__file__).parent  # the tests' fakes, and this checkout's code (not an installed copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    proc = subprocess.run([sys.executable, "-c", "import sys; from kvparity.cli import main; sys.exit(main())",
                           "run", "--engine", FAKE, "--report-dir", str(tmp_path), "--max-examples", "5",
                           "--checks", "parity"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_bug_that_escapes_every_handler_exits_3_not_1():
    """Python ends an uncaught exception with exit 1, which kvparity's exit codes read as FAIL. The console
    script says it was an internal error (traceback kept) and exits 3. The bug is a FAKE dispatcher that
    raises: what is tested is the console script's own handling."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    boom = ("import sys, kvparity.cli as cli\n"
            "def fake_dispatch(argv, session):\n    raise ZeroDivisionError('a bug')\n"
            "cli.dispatch = fake_dispatch\nsys.argv = ['kvparity', 'engines']\ncli.console_main()\n")
    proc = subprocess.run([sys.executable, "-c", boom], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" in proc.stderr and proc.stderr.strip().splitlines()[-1] == \
        "kvparity: internal error: ZeroDivisionError: a bug"
    # Without the bug, the same script exits 0 (a command that works is not an error).
    ok = subprocess.run([sys.executable, "-c", "import sys, kvparity.cli as cli\nsys.argv = ['kvparity', 'engines']\n"
                         "cli.console_main()\n"], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
