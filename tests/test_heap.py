"""A run freezes the heap it found (conformance.heap): full collections skip what was alive before it,
waiting garbage is collected first, and the process's collector is as it was afterwards — or left alone
where someone else froze it or turned it off."""

from __future__ import annotations

import gc
import weakref

import pytest

from conformance import heap
from conformance.run_config import RunConfig
from conformance.runner import run_suite
from fake_engine import FakeDictEngine
from kvparity.cli import main


@pytest.fixture(autouse=True)
def unfrozen():
    assert gc.get_freeze_count() == 0 and gc.isenabled(), "another test left the heap frozen or the collector off"
    yield
    assert gc.get_freeze_count() == 0 and gc.isenabled()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _tracked(obj: object) -> bool:
    """Whether the collector's generations hold `obj` (the permanent one, where frozen objects go, is
    not among them)."""
    return any(o is obj for o in gc.get_objects())


def test_the_heap_is_frozen_inside_and_collected_as_usual_after():
    alive_before = _Cycle()
    with heap.frozen():
        assert gc.get_freeze_count() > 0 and not _tracked(alive_before)  # frozen: collections skip it
        assert _tracked(_Cycle())  # what the run makes is collected as before
    assert gc.get_freeze_count() == 0 and _tracked(alive_before)  # unfrozen: collected as usual again


def _old_garbage(full: bool) -> weakref.ref:
    """A cycle that lived long enough to reach the oldest generation (moved there by a young collection,
    or by a full one if `full`), then dropped: garbage only a full collection finds."""
    cycle = _Cycle()
    gc.collect() if full else gc.collect(1)
    gone = weakref.ref(cycle)
    del cycle
    return gone


def test_the_last_runs_leftovers_are_collected_before_the_next_run_not_carried_into_it():
    with heap.frozen():
        pass
    leftover = _old_garbage(full=False)  # after one run, before the next, no full collection between
    with heap.frozen():
        assert leftover() is None


def test_garbage_a_full_collection_would_have_reached_anyway_waits_for_after_the_run():
    """No collection to start with where none is owed: a test worker's heap took 0.35 s to collect."""
    with heap.frozen():
        pass
    waiting = _old_garbage(full=True)  # a full collection since the last run: its leftovers are gone
    with heap.frozen():
        assert waiting() is not None  # frozen with the rest for the run's length...
    gc.collect()
    assert waiting() is None  # ... and collected after it


def test_a_heap_someone_else_froze_is_left_as_it_is():
    theirs = _Cycle()
    gc.freeze()
    try:
        made_since = _Cycle()
        with heap.frozen():
            assert _tracked(made_since)  # not frozen by the run
        assert not _tracked(theirs)  # theirs is not unfrozen (counts would not do: frozen objects can die)
    finally:
        gc.unfreeze()


def test_a_disabled_collector_is_left_off_and_unfrozen():
    gc.disable()
    try:
        with heap.frozen():
            assert gc.get_freeze_count() == 0 and not gc.isenabled()
    finally:
        gc.enable()


class SeesTheHeap(FakeDictEngine):
    """The FAKE engine, noting how many objects were frozen at each of its runs."""

    frozen_at_run: list[int] = []

    def run(self, requests):
        SeesTheHeap.frozen_at_run.append(gc.get_freeze_count())
        return super().run(requests)


def test_kvparity_run_freezes_the_heap_it_finds_and_unfreezes_it_after(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Hypothesis' example database out of the repository
    SeesTheHeap.frozen_at_run.clear()
    code = main(["run", "--engine", "test_heap:SeesTheHeap", "--report-dir", str(tmp_path), "--seed", "1",
                 "--max-examples", "2", "--quiet"])
    assert code == 0 and SeesTheHeap.frozen_at_run
    assert min(SeesTheHeap.frozen_at_run) > 0  # the engine and the imports: skipped by every collection
    assert gc.get_freeze_count() == 0


def test_run_suite_itself_leaves_the_heap_alone(tmp_path):
    """A process of many short runs (a test session) pays for a freeze more than it gains."""
    SeesTheHeap.frozen_at_run.clear()
    outcome = run_suite(SeesTheHeap(), RunConfig(engine_name="fake", profile="dev", max_examples=2, seed=1,
                                                 report_dir=tmp_path, database_dir=tmp_path / "db"))
    assert outcome.verdict == "pass" and set(SeesTheHeap.frozen_at_run) == {0}
