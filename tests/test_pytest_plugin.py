"""The pytest plugin end to end, as a CI job runs it: `pytest --pyargs conformance --kvparity-engine ...`
in a subprocess, on the FAKE engine (tests/fake_engine.py; fast, and only here for the suite's own logic).

What is pinned: the plugin fails closed (an inconclusive check fails the session unless
`--kvparity-allow-inconclusive`; bad option values are usage errors before anything runs; a buggy engine
fails), and under pytest-xdist the Hypothesis stream runs once per session while the state machine
runs on another worker. Example counts are capped tiny: these runs test the plugin, not the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAKE = "fake_engine:FakeDictEngine"
NEVER_CHUNKS = "fake_engine_never_chunks:NeverChunksFake"  # claims chunked prefill, never chunks


def plugin_run(tmp_path: Path, *args: str, engine: str = FAKE, timeout: float = 300) -> subprocess.CompletedProcess:
    """The plugin in a fresh process, in `tmp_path` (its own Hypothesis database, report dir, no cache)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--kvparity-engine", engine,
           "--kvparity-report-dir", str(tmp_path / "runs"), "-p", "no:cacheprovider", "-p", "no:randomly",
           "--rootdir", str(tmp_path), "-rA", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "runs").glob("*/*") if p.is_dir())


def test_inconclusive_check_fails_the_session_by_default(tmp_path):
    """An engine that claims chunked prefill and never chunks: whatever coverage completion adds after the
    stream, `exercised` is inconclusive, which `kvparity run` answers with exit 2 — the plugin must not
    answer it with a green session."""
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-max-examples", "1", "--kvparity-profile", "ci",
                     engine=NEVER_CHUNKS)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED" in out.stdout and "test_check[exercised]" in out.stdout
    assert "inconclusive:" in out.stdout and "--kvparity-allow-inconclusive" in out.stdout


def test_allow_inconclusive_reports_it_as_skipped(tmp_path):
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-max-examples", "1", "--kvparity-profile", "ci",
                     "--kvparity-allow-inconclusive", engine=NEVER_CHUNKS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SKIPPED" in out.stdout and "inconclusive:" in out.stdout
    [run] = run_dirs(tmp_path)
    assert json.loads((run / "results.json").read_text())["checks"]["exercised"]["status"] == "inconclusive"


@pytest.mark.parametrize("option, value", [
    ("--kvparity-timeout", "0"), ("--kvparity-timeout", "-5"), ("--kvparity-timeout", "inf"),
    ("--kvparity-timeout", "nan"), ("--kvparity-timeout", "soon"),
    ("--kvparity-max-examples", "0"), ("--kvparity-max-examples", "many"),
])
def test_bad_option_value_is_a_usage_error_naming_the_option(tmp_path, option, value):
    out = plugin_run(tmp_path, "-n", "0", option, value)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert f"{option} must be" in out.stderr and repr(value) in out.stderr
    assert not run_dirs(tmp_path)  # refused before anything ran


def test_a_buggy_engine_fails_its_check(tmp_path):
    """The fake that drops the salt from its cache key serves one tenant's KV to another."""
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-engine-arg", "bug=salt_leak", "--kvparity-checks",
                     "isolation", "--kvparity-max-examples", "40", "--kvparity-seed", "7", "-k", "test_check")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED" in out.stdout and "test_check[isolation]" in out.stdout
    assert "replay: kvparity replay" in out.stdout


def test_under_xdist_the_stream_runs_once_and_the_state_machine_on_another_worker(tmp_path):
    out = plugin_run(tmp_path, "-n", "2", "-v", "--kvparity-max-examples", "3", "--kvparity-allow-inconclusive")
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(run_dirs(tmp_path)) == 1, run_dirs(tmp_path)  # not one stream per worker
    lines = out.stdout.splitlines()
    machine = {l.split()[0] for l in lines if "test_engine_session_state_machine" in l and l.startswith("[gw")}
    checks = {l.split()[0] for l in lines if "test_check[" in l and l.startswith("[gw")}
    assert len(machine) == 1 and checks - machine, lines  # the per-check tests also ran elsewhere


@pytest.mark.parametrize("option, value", [
    ("--kvparity-shard", "3/2"), ("--kvparity-shard", "0/2"), ("--kvparity-shard", "two"),
    ("--kvparity-database", ""), ("--kvparity-database", "redis://10.1.2.3:6379/0"),
    ("--kvparity-database", "rediss://127.0.0.1:6379/0"),
])
def test_a_bad_shard_or_database_is_a_usage_error_naming_the_option(tmp_path, option, value):
    """Refused before anything runs: `3/2` would otherwise surface as every per-check test failing on a
    child that exited 3, and an empty database (an unset CI variable) as a shard keeping its failures to itself."""
    out = plugin_run(tmp_path, "-n", "0", option, value)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert f"{option} must be" in out.stderr and repr(value) in out.stderr
    assert not run_dirs(tmp_path)


def submitted(run_dir: Path) -> list:
    """Every request the run sent, in order."""
    events = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return [e["requests"] for e in events if e["event"] == "submit"]


def test_plugin_shards_merge_into_one_campaign_and_a_missing_one_is_an_error(tmp_path):
    """A CI matrix of pytest jobs, one shard each: the run folders are the campaign's shards, and the merge
    of both is its verdict (PASS), of one alone `error` (shard 2/2 missing)."""
    said = []
    for i in (1, 2):
        out = plugin_run(tmp_path, "-n", "0", "-k", "test_check", "--kvparity-profile", "ci",
                         "--kvparity-max-examples", "3", "--kvparity-allow-inconclusive", "--kvparity-shard", f"{i}/2")
        assert out.returncode == 0, out.stdout + out.stderr
        said.append(out.stdout)
    runs = run_dirs(tmp_path)
    starts = [json.loads((r / "history.jsonl").read_text().splitlines()[0]) for r in runs]
    assert sorted((s["shard"]["index"], s["shard"]["count"]) for s in starts) == [(1, 2), (2, 2)]
    assert starts[0]["seed"] != starts[1]["seed"]  # each shard its own stream
    # The rerun the session's last line names gives the shard's stream: its seed, and no shard to derive it again.
    seed = starts[0]["seed"]
    hint = f"--kvparity-seed {seed} without --kvparity-shard reruns the stream"
    assert hint in said[0] if starts[0]["shard"]["index"] == 1 else hint in said[1]
    (tmp_path / "rerun").mkdir()
    rerun = plugin_run(tmp_path / "rerun", "-n", "0", "-k", "test_check", "--kvparity-profile", "ci",
                       "--kvparity-max-examples", "3", "--kvparity-allow-inconclusive", "--kvparity-seed", str(seed))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert submitted(run_dirs(tmp_path / "rerun")[0]) == submitted(runs[0])

    def merge(*dirs: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvparity", "merge", *map(str, dirs), "--out",
                               str(tmp_path / f"merged{len(dirs)}")], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])})

    both, alone = merge(*runs), merge(runs[0])
    assert both.returncode == 0, both.stdout + both.stderr
    assert alone.returncode == 3 and "missing" in alone.stdout + alone.stderr, alone.stdout + alone.stderr


def test_the_stream_uses_the_database_given(tmp_path):
    """A failing stream saves its failure in the database the option names (where the next shard, or the
    next night's run, replays it first), not in the default folder of the job's working directory."""
    store = tmp_path / "shared-db"
    out = plugin_run(tmp_path, "-n", "0", "--kvparity-engine-arg", "bug=salt_leak", "--kvparity-checks",
                     "isolation", "--kvparity-max-examples", "40", "--kvparity-seed", "7", "-k", "test_check",
                     "--kvparity-database", str(store))
    assert out.returncode == 1, out.stdout + out.stderr
    assert [p for p in store.rglob("*") if p.is_file()], "nothing saved in the database given"
    assert not (tmp_path / ".hypothesis" / "kvparity").exists()
