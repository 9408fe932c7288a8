"""The front door: one definition of each exit code, a description for every subcommand, `--version`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conformance.exit_codes import ExitCode
from kvparity.cli import build_parser, commands, main

REPO = Path(__file__).resolve().parent.parent
SOURCES = [p for folder in ("kvparity", "conformance", "adapters", "reference_engine")
           for p in (REPO / folder).rglob("*.py")]


def test_each_exit_code_is_defined_once():
    """Only conformance/exit_codes.py binds a name to an exit code; the leash (a stdlib-only script run
    with `python -I`, which cannot import kvparity) is the one named exception."""
    binding = re.compile(r"^\s*EXIT_[A-Z_]+(\s*,\s*EXIT_[A-Z_]+)*\s*=\s*\d", re.M)
    found = {str(p.relative_to(REPO)) for p in SOURCES if binding.search(p.read_text(encoding="utf-8"))}
    assert found <= {"adapters/openai_http/leash.py"}, found
    assert [c.value for c in ExitCode] == [0, 1, 2, 3, 129, 130, 143]  # USAGE is ERROR's alias
    assert ExitCode.USAGE is ExitCode.ERROR


def test_every_subcommand_has_a_description():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(commands()) <= set(helps)
    for name, text in helps.items():
        assert text and "plugin command" not in text and len(text) > 20, (name, text)


def test_version_is_printed_and_exits_0(capsys):
    assert main(["--version"]) == 0
    assert re.fullmatch(r"kvparity \S+\n", capsys.readouterr().out)


def test_the_console_help_runs_no_plugin_code():
    """`kvparity --help` reads each command's docstring without importing it (an engine library stays
    unimported)."""
    code = ("import sys; from kvparity.cli import main; main(['--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('kvparity.commands.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60).stdout
    assert out.strip().endswith("[]"), out[-300:]


def test_an_engine_version_the_adapter_did_not_declare_is_said_so():
    """A custom adapter with an empty `Capabilities.version` is recorded as not declaring one, never as
    `"engine": ""`; a declared version is recorded as it is."""
    from conformance.contract import Capabilities
    from conformance.runner import NO_VERSION, versions

    caps = Capabilities(name="mine", vocab_size=512, max_context=64, block_size=16)
    assert versions(caps)["engine"] == NO_VERSION
    assert versions(Capabilities(name="mine", vocab_size=512, max_context=64, block_size=16,
                                 version="1.2.3"))["engine"] == "1.2.3"
