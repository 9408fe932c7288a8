"""Subcommands that drive engines (bench, fault-zoo, export-gguf) reach the CLI through the entry-point
group `kvparity.commands`, so `conformance` never imports an engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance.cli import plugin_commands


def test_engine_driving_commands_are_registered_plugins():
    assert {"bench", "fault-zoo", "export-gguf"} <= set(plugin_commands())


@pytest.mark.parametrize("command, word", [("bench", "economics"), ("fault-zoo", "fault"), ("export-gguf", "GGUF")])
def test_plugin_command_help_is_reached_through_kvparity(command, word):
    out = subprocess.run([sys.executable, "-m", "conformance.cli", command, "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert word.lower() in out.stdout.lower()


def test_conformance_does_not_import_engines():
    code = ("import sys, conformance.cli, conformance.runner, conformance.checks, conformance.economics;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'reference_engine', 'adapters',"
            " 'transformers', 'vllm', 'llama_cpp')]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
