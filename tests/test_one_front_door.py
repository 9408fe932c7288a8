"""One front door (issue 27, items 1 and 2): every command a peer under kvparity/commands/ behind one
dispatcher, each `--help` a real description, one definition of each exit code, third-party commands
through the `kvparity.commands` entry points; and the run as one object: a validated, frozen RunConfig,
handlers of one event stream, one report writer called once, the outcome carrying the History."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from conformance.contract import UsageError
from kvparity import cli

REPO = Path(__file__).resolve().parent.parent
FAKE = "fake_engine:FakeDictEngine"


def _first_paragraph(target: str) -> str:
    module = target.partition(":")[0]
    path = REPO / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return " ".join((doc or "").split("\n\n")[0].split())


@pytest.mark.parametrize("name", sorted(cli.BUILTIN))
def test_every_subcommand_help_prints_its_description(name, capsys, monkeypatch):
    """`kvparity NAME --help` exits 0 and shows the first paragraph of the command's docstring, never
    a placeholder such as "plugin command (module:main)"."""
    monkeypatch.setenv("COLUMNS", "10000")  # the description on one line
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    description = _first_paragraph(cli.BUILTIN[name])
    assert len(description) > 30 and "plugin command" not in out
    assert description in " ".join(out.split()), (name, out[:400])


_EXIT_LITERAL = re.compile(r"(sys\.exit|os\._exit|SystemExit)\((1|2|3|130|143|129)\)|returncode=(1|2|3|130)\b|"
                           r"^\s*return (2|3|130)$|^\s*[A-Z_]*(EXIT|USAGE|ERROR|INTERRUPTED)[A-Z_]* = (2|3|130)\b|"
                           r"class \w+\((enum\.)?IntEnum\)", re.M)
# Scripts that run where kvparity cannot be imported (a stdlib-only leash under `python -I`; the checker
# embedded verbatim into each standalone reproducer), and the one definition itself.
_STANDALONE = {"conformance/exit_codes.py", "adapters/openai_http/leash.py", "kvparity/commands/export/runtime.py"}


def test_no_second_exit_code_definition_in_the_source_tree():
    """Exit codes come from conformance.exit_codes.ExitCode only: no other enum of them, no literal
    3 / 130 exits or returns."""
    found = []
    for folder in ("kvparity", "conformance", "adapters", "reference_engine"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel in _STANDALONE:
                continue
            for m in _EXIT_LITERAL.finditer(path.read_text(encoding="utf-8")):
                found.append(f"{rel}: {m.group(0).strip()}")
    assert not found, found


def test_python_dash_m_conformance_is_gone_and_kvparity_is_the_door():
    assert not (REPO / "conformance" / "__main__.py").exists() and not (REPO / "conformance" / "cli.py").exists()
    assert not (REPO / "adapters" / "commands").exists()
    out = subprocess.run([sys.executable, "-m", "kvparity", "--version"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("kvparity "), out.stderr


def test_a_third_party_command_joins_through_the_entry_point_group(tmp_path, monkeypatch, capsys):
    """A FAKE third-party distribution on sys.path registers `hello` in group kvparity.commands."""
    (tmp_path / "hello_cmd.py").write_text('"""Say hello to the given names and exit 2 (a test plugin)."""\n'
                                           "def main(argv):\n    print('hello', *argv)\n    return 2\n")
    info = tmp_path / "hello_cmd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-cmd\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kvparity.commands]\nhello = hello_cmd:main\nrun = hello_cmd:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.commands()["hello"] == "hello_cmd:main"
    assert cli.commands()["run"] == cli.BUILTIN["run"]  # a plugin does not replace a built-in command
    assert cli.main(["hello", "a", "b"]) == 2
    assert capsys.readouterr().out == "hello a b\n"
    assert cli.main(["--help"]) == 0
    assert "say hello to the given names" in capsys.readouterr().out.lower()


# --------------------------------------------------------------------------- the run as one object


def test_run_config_is_validated_once_at_construction_and_frozen():
    from conformance.run_config import RunConfig

    config = RunConfig(engine_name=FAKE, checks=["parity"], profile="ci")
    assert config.checks == ("parity",) and config.max_steps == 5 and config.example_budget == 100
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.profile = "dev"  # type: ignore[misc]
    with pytest.raises(UsageError, match="unknown check 'parityy'.*did you mean 'parity'"):
        RunConfig(engine_name=FAKE, checks=["parityy"])
    with pytest.raises(UsageError, match="unknown profile"):
        RunConfig(engine_name=FAKE, profile="weekly")
    with pytest.raises(UsageError, match="--strict-known needs --known"):
        RunConfig(engine_name=FAKE, strict_known=True)


def test_profiles_are_registered_by_the_run_not_at_import():
    code = ("from hypothesis import settings; from hypothesis.errors import InvalidArgument\n"
            "import conformance.runner, conformance.run_config as rc\n"
            "try:\n    settings.get_profile('kvparity-ci'); print('registered at import')\n"
            "except InvalidArgument:\n    print('not yet', rc.profile_settings('ci').derandomize)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "not yet True", out.stdout + out.stderr


def test_kvparity_run_writes_the_report_once_and_never_rereads_its_history(tmp_path, monkeypatch, capsys):
    """One report writer, called once, with numerics.json and the minimised witnesses in it; the
    History comes with the outcome, so reading history.jsonl back from disk would be a bug."""
    import conformance.history
    import conformance.report

    calls = []
    write_report = conformance.report.write_report
    monkeypatch.setattr(conformance.report, "write_report", lambda *a, **k: calls.append(k) or write_report(*a, **k))

    def no_reread(*args, **kwargs):
        raise AssertionError("history.jsonl re-read from disk")

    monkeypatch.setattr(conformance.history, "load", no_reread)
    code = cli.main(["run", "--engine", FAKE, "--engine-arg", "bug=salt_leak", "--report-dir", str(tmp_path),
                     "--max-examples", "100", "--seed", "3", "--checks", "isolation", "-q", "--no-shrink",
                     "--minimise", "--timeout", "30"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert len(calls) == 1 and "minimised" in calls[0], calls
    (run_dir,) = (p for p in tmp_path.rglob("history.jsonl"))
    assert (run_dir.parent / "numerics.json").is_file()
    assert "minimised [isolation]" in out and "Minimised witnesses" in (run_dir.parent / "report.md").read_text()


def test_run_suite_takes_the_config_and_its_outcome_carries_the_history(tmp_path):
    from conformance.run_config import RunConfig
    from conformance.run_handlers import RunHandler
    from conformance.runner import run_suite
    from fake_engine import FakeDictEngine

    class Counting:
        def __init__(self) -> None:
            self.events, self.ended = [], []

        def on_event(self, event):
            self.events.append(event["event"])

        def on_end(self, outcome):
            self.ended.append(outcome)

    seen = Counting()
    assert isinstance(seen, RunHandler)
    config = RunConfig(engine_name="fake", report_dir=tmp_path, database_dir=tmp_path / "db", seed=1,
                       max_examples=3, shrink=False, checks=["parity"])
    outcome = run_suite(FakeDictEngine(), config, [seen])
    assert seen.ended == [outcome] and seen.events[0] == "run_start" and seen.events[-1] == "run_end"
    assert outcome.history is not None and len(outcome.history.examples) == outcome.examples
    assert (outcome.run_dir / "report.md").is_file() and (outcome.run_dir / "numerics.json").is_file()


def test_the_modules_stay_small():
    for rel in ("conformance/runner.py", "conformance/run_config.py", "conformance/run_handlers.py",
                "conformance/run_outcome.py", "conformance/scenario_runner.py", "conformance/witness_replay.py",
                "conformance/engine_lifecycle.py", "kvparity/cli.py", "kvparity/commands/run.py"):
        assert len((REPO / rel).read_text().splitlines()) <= 400, rel
