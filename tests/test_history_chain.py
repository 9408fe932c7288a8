"""A stored history is evidence: `kvparity report` refuses one that was edited instead of re-judging it.

The probes of 2026-12-03 (shared/probes/reliability-2026-12-03/tamper.py, flipall.py) turned a FAIL into
a PASS by editing two `cached_tokens` values or deleting the two lines holding a failing answer, and had
a history with an unanswered submit mid-run, examples out of order and a `run_end` claiming 999 examples
accepted. Each is reproduced here on a real failing run of the FAKE engine (tests/fake_engine.py) and
must now end in one line on stderr and exit 3, with the run's own verdict files untouched. Histories
written before the chain (committed under reports/) stay readable, said to be unverified.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvparity.cli import main

FAKE = "fake_engine:FakeDictEngine"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory) -> Path:
    """One real failing run (isolation: a salt leak), copied by each test that edits it."""
    root = tmp_path_factory.mktemp("chain")
    code = main(["run", "--engine", FAKE, "--engine-arg", "bug=salt_leak", "--checks", "isolation,parity",
                 "--report-dir", str(root / "reports"), "--seed", "3", "--max-examples", "40", "--no-shrink", "-q"])
    assert code == 1
    (run_dir,) = [p for p in (root / "reports").glob("*/*") if p.is_dir()]
    return run_dir


@pytest.fixture
def run(failing_run, tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "run"
    shutil.copytree(failing_run, copy)
    return copy


def lines_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def write_lines(run_dir: Path, events: list[dict]) -> None:
    (run_dir / "history.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


def unchained(events: list[dict]) -> list[dict]:
    """The same history as one written before the chain existed (a legacy history)."""
    return [{k: v for k, v in e.items() if k not in ("chain", "events", "sealed")} for e in events]


def failing_answers(run_dir: Path) -> set[tuple[int, str]]:
    results = json.loads((run_dir / "results.json").read_text())
    return {(f["witness"]["example"], f["witness"]["request"]["id"])
            for c in results["checks"].values() for f in c["failures"]}


def answer_lines(events: list[dict], run_dir: Path) -> tuple[int, int]:
    """(submit, batch) line indices of the first failing answer."""
    wanted = failing_answers(run_dir)
    example = None
    for i, e in enumerate(events):
        if e["event"] == "example":
            example = e["index"]
        if e["event"] == "batch" and any((example, r["request_id"]) in wanted for r in e["results"]):
            assert events[i - 1]["event"] == "submit"
            return i - 1, i
    raise AssertionError("no failing answer found")


def refused(run_dir: Path, capsys, *args: str) -> str:
    """`kvparity report` refuses: exit 3, one line on stderr, the run's verdict files untouched."""
    before = {n: (run_dir / n).read_bytes() for n in ("results.json", "report.md", "junit.xml")}
    assert main(["report", str(run_dir), *args]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "integrity" in err, err
    assert {n: (run_dir / n).read_bytes() for n in before} == before
    assert not (run_dir / "reanalysis" / "results.json").exists()
    return err


def test_editing_cached_tokens_of_the_failing_answers_is_refused(run, capsys):
    events = lines_of(run)
    wanted = failing_answers(run)
    example, edited = None, 0
    for e in events:  # flipall.py: the failing requests report no reuse at all
        example = e.get("index", example) if e["event"] == "example" else example
        if e["event"] == "batch":
            for r in e["results"]:
                if (example, r["request_id"]) in wanted and r["cached_tokens"]:
                    r["cached_tokens"], edited = 0, edited + 1
    assert edited
    write_lines(run, events)
    assert "breaks the history's chain" in refused(run, capsys)


def test_deleting_the_two_lines_of_a_failing_answer_is_refused(run, capsys):
    events = lines_of(run)
    submit, batch = answer_lines(events, run)
    write_lines(run, events[:submit] + events[batch + 1:])
    refused(run, capsys)


@pytest.mark.parametrize("legacy", [False, True], ids=["chained", "legacy"])
def test_a_submit_without_its_answer_mid_history_is_refused(run, capsys, legacy):
    events = lines_of(run)
    _, batch = answer_lines(events, run)
    events = events[:batch] + events[batch + 1:]
    write_lines(run, unchained(events) if legacy else events)
    err = refused(run, capsys)
    assert not legacy or "submitted and never answered" in err


@pytest.mark.parametrize("legacy", [False, True], ids=["chained", "legacy"])
def test_examples_out_of_order_are_refused(run, capsys, legacy):
    events = lines_of(run)
    starts = [i for i, e in enumerate(events) if e["event"] == "example"]
    block = lambda k: events[starts[k]:starts[k + 1]]  # noqa: E731
    events = events[:starts[3]] + block(4) + block(3) + events[starts[5]:]  # tamper.py's reorder
    write_lines(run, unchained(events) if legacy else events)
    err = refused(run, capsys)
    assert not legacy or "out of order" in err


@pytest.mark.parametrize("legacy", [False, True], ids=["chained", "legacy"])
def test_a_run_end_claiming_more_examples_than_recorded_is_refused(run, capsys, legacy):
    events = lines_of(run)
    events[-1]["examples"] = 999
    write_lines(run, unchained(events) if legacy else events)
    err = refused(run, capsys)
    assert not legacy or "claims 999 examples" in err


def test_a_truncated_history_with_a_run_end_appended_is_refused(run, capsys):
    events = lines_of(run)
    starts = [i for i, e in enumerate(events) if e["event"] == "example"]
    forged = {"event": "run_end", "examples": 4, "duration_s": 1.0}  # tamper.py's truncated_end
    write_lines(run, events[:starts[4]] + [forged])
    assert "integrity" in refused(run, capsys)
    # ... and a copy of the real seal does not fit the cut history either
    write_lines(run, events[:starts[4]] + [events[-1]])
    assert "integrity" in refused(run, capsys)


def test_a_duplicated_line_is_refused(run, capsys):
    events = lines_of(run)
    _, batch = answer_lines(events, run)
    write_lines(run, events[:batch + 1] + [events[batch]] + events[batch + 1:])
    assert "integrity" in refused(run, capsys)


def test_a_cut_history_without_run_end_reads_as_an_unfinished_run(run, capsys):
    """A killed run leaves no seal: still readable, and an error (or the failure it had already recorded,
    which outranks it), never a pass, not refused as edited."""
    events = lines_of(run)
    write_lines(run, events[: len(events) // 2])
    (run / "results.json").unlink()  # as if the process was killed before writing any report
    code = main(["report", str(run)])
    out = capsys.readouterr().out
    assert "run did not finish" in out
    verdict = json.loads((run / "results.json").read_text())["verdict"]
    assert (verdict, code) in {("error", 3), ("fail", 1)}


def test_an_intact_history_verifies_and_legacy_ones_are_said_to_be_unverified(run, capsys):
    assert main(["report", str(run)]) == 1
    out = capsys.readouterr().out
    assert "unverified" not in out and "reanalysis" in out
    assert json.loads((run / "reanalysis" / "results.json").read_text())["reanalysis"]["integrity"] == "verified"
    write_lines(run, unchained(lines_of(run)))
    results = json.loads((run / "results.json").read_text())
    del results["history_digest"]  # as written before the chain existed
    (run / "results.json").write_text(json.dumps(results))
    assert main(["report", str(run)]) == 1
    assert "legacy history" in capsys.readouterr().out
    assert json.loads((run / "reanalysis" / "results.json").read_text())["reanalysis"]["integrity"] == "legacy"


def test_a_chain_stripped_to_pass_as_legacy_is_refused(run, capsys):
    """The run's results.json records the digest its verdict was written from."""
    events = lines_of(run)
    _, batch = answer_lines(events, run)
    for r in events[batch]["results"]:
        r["cached_tokens"] = 0
    write_lines(run, unchained(events))
    assert "not the history the run was judged on" in refused(run, capsys)


def test_a_history_mixing_chained_and_unchained_lines_is_refused(run, capsys):
    events = lines_of(run)
    _, batch = answer_lines(events, run)
    events[batch] = unchained([events[batch]])[0]
    write_lines(run, events)
    assert "no chain value" in refused(run, capsys)


def test_every_committed_history_reads_as_legacy_without_problems():
    from conformance.history import read_events
    from conformance.history_chain import LEGACY, verify

    histories = sorted((REPO / "reports").rglob("history.jsonl*"))
    assert histories
    for path in histories:
        integrity = verify(read_events(path)[0])
        if integrity.status != LEGACY:  # a run of this version's writer: chained and sealed
            assert (integrity.status, integrity.problems) == ("verified", ()), path
        else:
            assert integrity.problems == (), path


def test_the_writer_chains_every_line_and_seals_run_end(tmp_path):
    from conformance.history import HistoryWriter, read_events
    from conformance.history_chain import VERIFIED, verify

    w = HistoryWriter(tmp_path / "history.jsonl")
    w.append("run_start", engine="e")
    w.append("example", index=0)
    w.append("run_end", examples=1, duration_s=0.1)
    w.close()
    events, problems = read_events(tmp_path / "history.jsonl")
    assert problems == [] and events == w.events
    assert all(len(e["chain"]) == 64 for e in events)
    assert events[-1]["events"] == 2 and events[-1]["sealed"] == events[1]["chain"]
    assert verify(events).status == VERIFIED and verify(events).sound


def test_a_writer_with_a_sink_hands_each_event_over_once_and_still_seals_them_all(tmp_path):
    """A run's writer feeds its History through a sink; a second copy of every event in `events` (parsed
    JSON) was a fifth of a long run's memory. The seal counts every event written either way."""
    from conformance.history import HistoryWriter, read_events
    from conformance.history_chain import VERIFIED, verify

    taken: list[dict] = []
    w = HistoryWriter(tmp_path / "history.jsonl", sink=taken.append)
    w.append("run_start", engine="e")
    w.append("example", index=0)
    w.append("run_end", examples=1, duration_s=0.1)
    w.close()
    events, _ = read_events(tmp_path / "history.jsonl")
    assert taken == events and w.events == []
    assert events[-1]["events"] == 2 and verify(events).status == VERIFIED
