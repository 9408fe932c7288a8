"""Shards and the shared example database (issue 32 items 1-2): `kvparity run --shard i/n` draws a stream
of its own, its seed derived and recorded, the derandomised ci profile reproducible per shard; a bad
`--shard` or a non-loopback `--database` is one line and exit 3; and with `--database redis://...` (a
real redis-server on 127.0.0.1, started here) a failure found by shard 1 is replayed first by shard 2."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conformance.contract import UsageError
from conformance.shards import DERANDOMISED, Shard, parse_shard
from kvparity import cli

FAKE = "fake_engine:FakeDictEngine"


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3", "-1/2", ""])
def test_a_bad_shard_is_one_line_and_exit_3(text, tmp_path, capsys):
    with pytest.raises(UsageError):
        parse_shard(text)
    code = cli.main(["run", "--engine", FAKE, "--shard", text, "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "--shard" in err, err
    assert not list(tmp_path.rglob("history.jsonl"))  # refused before any run


def test_shards_parse_counted_from_one():
    assert parse_shard(" 2/4 ") == Shard(2, 4) and str(parse_shard("1/1")) == "1/1"


@pytest.mark.parametrize("url", ["redis://10.0.0.1:6379/0", "redis://example.com/0", "redis://user:pw@127.0.0.1/0",
                                 "redis://127.0.0.1:6379/x", "redis://127.0.0.1:99999/0",
                                 # another scheme is not a folder of that name (each shard keeping its own)
                                 "rediss://127.0.0.1:6379/0", "http://127.0.0.1:6379/0"])
def test_a_database_elsewhere_than_this_machine_is_refused(url, tmp_path, capsys):
    code = cli.main(["run", "--engine", FAKE, "--database", url, "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "--database" in err, err


def _run_shard(tmp_path: Path, name: str, shard: str | None, profile: str = "ci", seed: int | None = None):
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite
    from fake_engine import FakeDictEngine

    config = RunConfig(engine_name="fake", profile=profile, run_dir=tmp_path / name, database_dir=tmp_path / f"db-{name}",
                       max_examples=8, shrink=False, checks=["parity"], seed=seed,
                       shard=parse_shard(shard) if shard else None)
    (tmp_path / name).mkdir()
    outcome = run_suite(FakeDictEngine(), config)
    start = json.loads((tmp_path / name / "history.jsonl").read_text().splitlines()[0])
    results = json.loads((tmp_path / name / "results.json").read_text())
    return outcome, start, results, [json.dumps(ex.steps(), sort_keys=True) for ex in outcome.history.examples]


def test_ci_shards_draw_streams_of_their_own_reproducibly_and_record_their_seeds(tmp_path):
    _, plain, _, plain_steps = _run_shard(tmp_path, "plain", None)
    _, one, one_results, one_steps = _run_shard(tmp_path, "one", "1/2")
    _, again, _, again_steps = _run_shard(tmp_path, "again", "1/2")
    _, two, _, two_steps = _run_shard(tmp_path, "two", "2/2")
    assert plain["seed"] == "derandomised" and "shard" not in plain  # an unsharded ci run is as before
    assert one["shard"] == {"index": 1, "count": 2, "campaign_seed": DERANDOMISED}
    assert one_results["run"]["shard"] == one["shard"] and one_results["run"]["seed"] == one["seed"]
    assert one["seed"] == Shard(1, 2).seed(DERANDOMISED) != two["seed"] == Shard(2, 2).seed(DERANDOMISED)
    assert again["seed"] == one["seed"] and again_steps == one_steps  # reproducible per shard
    # Hypothesis tries its simplest examples first in every stream; past those, the shards differ.
    shared = set(one_steps) & set(two_steps)
    assert len(shared) <= 3 and len(set(one_steps) | set(two_steps)) >= len(one_steps) + len(two_steps) - 6
    assert set(one_steps) != set(plain_steps)


def test_a_drawing_profile_derives_each_shard_seed_from_the_campaign_seed(tmp_path):
    _, one, _, _ = _run_shard(tmp_path, "one", "1/3", profile="dev", seed=42)
    _, three, _, _ = _run_shard(tmp_path, "three", "3/3", profile="dev", seed=42)
    assert one["shard"]["campaign_seed"] == three["shard"]["campaign_seed"] == 42
    assert one["seed"] == Shard(1, 3).seed(42) and three["seed"] == Shard(3, 3).seed(42) != one["seed"]


# --------------------------------------------------------------------------- a real redis-server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of its own on 127.0.0.1 (no persistence), stopped after the test."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    pytest.importorskip("redis", reason="the redis client is not installed (pip install 'kvparity[campaign]')")
    import redis

    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not start")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _first_example_fails(tmp_path: Path, name: str, shard: str, database: str) -> tuple[int, bool]:
    from conformance.analysis import example_failures
    from conformance.history import load

    report = tmp_path / name
    code = cli.main(["run", "--engine", "reference", "--engine-arg", "fault=salt_ignored", "--profile", "ci",
                     "--max-examples", "4", "--no-shrink", "--checks", "isolation,parity", "--shard", shard,
                     "--database", database, "--report-dir", str(report), "-q"])
    (path,) = report.rglob("history.jsonl")
    history = load(path)
    return code, bool(example_failures(history.only(history.examples[0]), ["isolation", "parity"]))


def test_a_failure_found_by_shard_1_is_replayed_first_by_shard_2(redis_url, tmp_path, capsys):
    code, _ = _first_example_fails(tmp_path, "shard1", "1/2", f"{redis_url}/0")
    assert code == 1, capsys.readouterr().out  # shard 1 finds the fault (and saves the failing example)
    code, first_fails = _first_example_fails(tmp_path, "shard2", "2/2", f"{redis_url}/0")
    assert code == 1 and first_fails  # shard 2 replays it before drawing anything
    # The control: shard 2 alone, with an empty store (another database number), starts with a passing example.
    code, first_fails = _first_example_fails(tmp_path, "alone", "2/2", f"{redis_url}/1")
    assert not first_fails


def test_an_unreachable_database_is_refused_before_the_engine_is_built(tmp_path, capsys):
    pytest.importorskip("redis")
    code = cli.main(["run", "--engine", FAKE, "--database", f"redis://127.0.0.1:{_free_port()}/0",
                     "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3 and "cannot reach the store" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.rglob("history.jsonl"))


def _seeded_run_fails_first(tmp_path: Path, name: str, seed: int, *database: str) -> tuple[int, bool]:
    """A seeded dev run of the fake that mixes tenants' KV: (exit code, whether its first example failed)."""
    from conformance.analysis import example_failures
    from conformance.history import load

    report = tmp_path / name
    code = cli.main(["run", "--engine", FAKE, "--engine-arg", "bug=salt_leak", "--max-examples", "12", "--no-shrink",
                     "--checks", "isolation", "--seed", str(seed), *database, "--report-dir", str(report), "-q"])
    (path,) = report.rglob("history.jsonl")
    history = load(path)
    return code, bool(example_failures(history.only(history.examples[0]), ["isolation"]))


def test_a_database_folder_given_to_a_seeded_run_is_used(tmp_path, monkeypatch, capsys):
    """`--database DIR` with a seed (dev and nightly draw one; `--seed` gives one) and no shard: Hypothesis
    turns the store off under a seed, so the failure was saved nowhere and the next run, given the same
    folder, did not replay it. Now it is saved there and replayed first; with no `--database`, a seed alone
    still names the stream (nothing replayed, from the default folder either)."""
    monkeypatch.chdir(tmp_path)  # the default folder, .hypothesis/ here, stays this test's own
    store = str(tmp_path / "store")
    seed = next(s for s in range(20) if not _seeded_run_fails_first(tmp_path, f"probe{s}", s)[1])  # starts passing
    code, _ = _seeded_run_fails_first(tmp_path, "finder", seed + 100, "--database", store)
    assert code == 1, capsys.readouterr().out
    assert [p for p in Path(store).rglob("*") if p.is_file()], "the failure was not saved in the folder given"
    code, first_fails = _seeded_run_fails_first(tmp_path, "next", seed, "--database", store)
    assert code == 1 and first_fails  # replayed before anything is drawn
    code, first_fails = _seeded_run_fails_first(tmp_path, "seed-alone", seed)
    assert not first_fails  # the seed's own stream, as the probe drew it
