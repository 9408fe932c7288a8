"""Subcommands that drive engines (bench, fault-zoo, export-gguf) are peers under kvparity/commands/,
reached through the one dispatcher (kvparity.cli), so `conformance` never imports an engine."""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity import cli
from kvparity.cli import commands as plugin_commands


def test_engine_driving_commands_are_registered_plugins():
    assert {"bench", "fault-zoo", "export-gguf"} <= set(plugin_commands())


@pytest.mark.parametrize("command, word", [("bench", "economics"), ("fault-zoo", "fault"), ("export-gguf", "GGUF")])
def test_plugin_command_help_is_reached_through_kvparity(command, word):
    out = subprocess.run([sys.executable, "-m", "kvparity", command, "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert word.lower() in out.stdout.lower()


def test_conformance_does_not_import_engines():
    code = ("import sys, conformance.witness_replay, conformance.runner, conformance.checks, conformance.economics;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'reference_engine', 'adapters',"
            " 'transformers', 'vllm', 'llama_cpp')]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


# -- fail closed: defaults shown, usage errors one line with exit 3, defaults out of the committed tree ------
REPO = Path(__file__).resolve().parent.parent


def _parser(command: str) -> argparse.ArgumentParser:
    module = importlib.import_module(plugin_commands()[command].split(":")[0])
    return module.build_parser()


@pytest.mark.parametrize("command", ["bench", "fault-zoo", "export-gguf"])
def test_plugin_help_shows_every_default(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside a default
    assert cli.main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for action in _parser(command)._actions:
        if action.default is None:  # nothing printable: the help says in words what happens without it
            assert "(default:" in (action.help or ""), action.dest
        elif action.default is not False and action.default is not argparse.SUPPRESS:  # flags are off
            assert f"(default: {action.default})" in out, action.dest


@pytest.mark.parametrize("command", ["bench", "fault-zoo", "export-gguf"])
def test_plugin_usage_error_is_one_line_and_exit_3(command, capsys):
    assert cli.main([command, "--no-such-option"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"kvparity {command}: error: unrecognized arguments: --no-such-option")


def test_export_gguf_checks_every_name_before_writing_anything(capsys, tmp_path):
    out_dir = tmp_path / "gguf"
    assert cli.main(["export-gguf", "--out-dir", str(out_dir), "tiny-target-a", "no-such-checkpoint"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-checkpoint" in err and "Traceback" not in err
    assert not out_dir.exists()
    (tmp_path / "file").write_text("")
    assert cli.main(["export-gguf", "--out-dir", str(tmp_path / "file")]) == 3
    assert "is not a directory" in capsys.readouterr().err


def test_export_gguf_default_is_a_cache_outside_the_tree(monkeypatch):
    from kvparity.commands.export_gguf import default_out_dir

    monkeypatch.delenv("KVPARITY_GGUF_DIR", raising=False)
    out = Path(_parser("export-gguf").parse_args([]).out_dir).resolve()
    assert out == default_out_dir().resolve() and REPO not in (out, *out.parents)


def test_default_outputs_are_git_ignored():
    """User runs write to .kvparity/, never into the committed reports/ tree."""
    from kvparity.commands.bench import DEFAULT_OUT as BENCH_OUT
    from kvparity.commands.fault_zoo import DEFAULT_OUT as ZOO_OUT, witness_dir

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [BENCH_OUT / "report.md", ZOO_OUT, witness_dir(ZOO_OUT) / "salt_ignored.json"]
    for path in paths:
        assert path.parts[0] == ".kvparity", path
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, timeout=30)
        assert ignored.returncode == 0, f"{path} is not git-ignored"
