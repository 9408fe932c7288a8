"""Several bugs per run survive the shrink cap: when `--max-shrink-seconds` cuts the shrinking of the first
bug found, the run keeps its witness and goes on looking (a further round of the hunt, with its own
shrink budget), instead of ending there — on a real engine every run used to stop soon after its first
finding. Real engine: the reference engine with two zoo faults planted."""

from __future__ import annotations

import json

import pytest

from kvparity.cli import main

TWO = "salt_ignored+eos_bonus_unchecked"  # an isolation bug found first, an eos bug examples later


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the Hypothesis example database stays out of the repository


def test_a_capped_shrink_keeps_its_witness_and_the_hunt_goes_on(tmp_path):
    out = tmp_path / "runs"
    code = main(["run", "--engine", "reference", "--engine-arg", f"fault={TWO}", "--report-dir", str(out),
                 "--seed", "0", "--max-examples", "30", "--max-shrink-seconds", "0.001", "-q"])
    (run_dir,) = out.glob("*/*")
    results = json.loads((run_dir / "results.json").read_text())
    assert code == 1
    checks = {fd["check"] for fd in results["findings"]}
    assert "isolation" in checks and checks & {"accounting", "spec_independence"}, checks  # both bugs
    assert len({fd["signature"]["signature"] for fd in results["findings"]}) >= 2  # (before the fix: 1)
