"""The adapter starts on every transformers release it claims (benchmarks/transformers_sweep.py runs one per
minor line; reports/transformers/compat.md). What a release changes is found by probing what it imported,
so each fix here is tested on a FAKE of the library that behaves like the release in question.

transformers 4.38 to 4.44 pin a `tokenizers` (0.15 to 0.19) that rejects the shipped tokenizer.json,
whose BPE merges are spelled as pairs: the adapter's landmarks (same-text pairs) must still load."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import tokenizers

from adapters import landmarks
from adapters import transformers_versions as tv
from reference_engine import checkpoints

REAL_TOKENIZER = tokenizers.Tokenizer  # the FAKE below parses with it, even while it stands in for it
SHIPPED = pathlib.Path(checkpoints.revision_dir("a")) / "tokenizer.json"


class FakeOldTokenizer:
    """A FAKE `tokenizers.Tokenizer` as tokenizers 0.19 behaves: a file whose merges are pairs fails to
    parse (the Rust error is a bare Exception); legacy "a b" merges are read (by the real library here)."""

    @staticmethod
    def _parse(text: str) -> Any:
        if any(isinstance(m, list) for m in json.loads(text)["model"]["merges"]):
            raise Exception("data did not match any variant of untagged enum ModelWrapper at line 4150 column 3")
        return REAL_TOKENIZER.from_str(text)

    @classmethod
    def from_file(cls, path: str) -> Any:
        return cls._parse(pathlib.Path(path).read_text())

    @classmethod
    def from_str(cls, text: str) -> Any:
        return cls._parse(text)


def test_the_shipped_tokenizer_spells_merges_as_pairs():
    """The premise: without pair-spelled merges the old tokenizers would read the file and nothing here
    would be needed."""
    merges = json.loads(SHIPPED.read_text())["model"]["merges"]
    assert merges and all(isinstance(m, list) and len(m) == 2 for m in merges)


def test_an_old_tokenizers_reads_the_file_with_legacy_merges():
    tok = landmarks.load_tokenizer(SHIPPED, FakeOldTokenizer)
    assert tok.get_vocab_size() == tokenizers.Tokenizer.from_file(str(SHIPPED)).get_vocab_size()


def test_the_legacy_spelling_says_the_same_as_the_pairs():
    """Lossless: every id decodes, and a text encodes, the same under both spellings (real tokenizers)."""
    new = tokenizers.Tokenizer.from_file(str(SHIPPED))
    old = landmarks.load_tokenizer(SHIPPED, FakeOldTokenizer)
    assert [old.decode([i]) for i in range(new.get_vocab_size())] == \
        [new.decode([i]) for i in range(new.get_vocab_size())]
    text = "the cache must not change the output, ever: 12345 ..."
    assert old.encode(text).ids == new.encode(text).ids


def test_a_tokenizers_that_reads_the_file_is_not_rewritten():
    class FakeReader:  # a FAKE whose from_file succeeds; from_str must not be reached
        @staticmethod
        def from_file(path: str) -> str:
            return "read"

        @staticmethod
        def from_str(text: str) -> str:
            raise AssertionError("rewrote a file the library could read")

    assert landmarks.load_tokenizer(SHIPPED, FakeReader) == "read"


def test_another_parse_failure_is_raised_not_hidden(tmp_path):
    """A file the legacy spelling does not change (already legacy merges) fails as the library said."""
    data = json.loads(SHIPPED.read_text())
    data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
    file = tmp_path / "tokenizer.json"
    file.write_text(json.dumps(data))

    class FakeBroken:  # a FAKE that can parse nothing
        @staticmethod
        def from_file(path: str) -> Any:
            raise Exception("unknown variant")

        from_str = from_file

    with pytest.raises(Exception, match="unknown variant"):
        landmarks.load_tokenizer(file, FakeBroken)


def test_the_landmarks_load_under_an_old_tokenizers(monkeypatch):
    """What failed on 4.38.2 to 4.44.2 (seen on 4.40.2): the adapter's landmarks, built when it is
    constructed, under the old library."""
    expected = landmarks.shipped_landmarks.__wrapped__()
    monkeypatch.setattr(tokenizers, "Tokenizer", FakeOldTokenizer)
    got = landmarks.shipped_landmarks.__wrapped__()
    assert got.same_text == expected.same_text and got.same_text


# -- benchmarks/transformers_sweep.py: which releases it runs and how it reports them -------------------

def _sweep():
    import importlib.util

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "transformers_sweep.py"
    spec = importlib.util.spec_from_file_location("transformers_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_takes_each_claimed_lines_latest_patch_and_names_the_gaps():
    sweep = _sweep()
    index = ["4.37.2", "4.38.0", "4.38.2", "4.38.10", "4.39.1", "4.41.0", "5.0.0", "5.2.1", "5.2.0",
             "5.9.0", "5.10.4", "5.24.0", "5.25.0"]
    lines, missing = sweep.claimed_lines(index)
    assert lines == ["4.38.10", "4.39.1", "4.41.0", "5.0.0", "5.2.1", "5.9.0", "5.10.4", "5.24.0"]
    assert missing[:2] == ["4.40", "5.1"] and "5.3" in missing and "5.23" in missing
    assert "4.42" not in missing and "5.25" not in missing  # past 4.x's last line; past the claim


def test_the_table_tells_a_waived_known_finding_from_a_clean_pass():
    sweep = _sweep()
    met = {"signature": "9750049f26b9", "check": "accounting", "known": True, "headline": "h",
           "config": "k=5 mode=adversarial", "explanation": "Request alone: 0 of 1 tokens"}
    data = {"lines": ["4.38.2", "4.39.3", "5.0.0"], "missing_lines": [], "command": "python -m kvparity run",
            "releases": {
                "4.38.2": {"version": "4.38.2", "verdict": "pass", "exit_code": 0, "findings": [met]},
                "4.39.3": {"version": "4.39.3", "verdict": "fail", "exit_code": 1, "findings": [],
                           "cause": "differs | at 5"},
            }}
    page = sweep.render(data)
    assert "pass, known met 1, fail 1 of 2 releases run" in page and "not run yet: 5.0.0" in page
    row = next(line for line in page.splitlines() if line.startswith("| 4.38.2"))
    assert "9750049f26b9 (k=5 mode=adversarial: Request alone: 0 of 1 tokens)" in row
    assert "differs / at 5" in page  # a cell's pipe would split the row


# -- transformers 5.4 to 5.8: a persistent manager's later generate_batch calls come back empty ---------

class FakeManagerReturningNothing:  # a FAKE of 5.4-5.8's ContinuousBatchingManager: ids made, not returned
    def add_requests(self, inputs, max_new_tokens=None, record_timestamps=False) -> None:
        raise AssertionError("a probe never calls it")


class FakeManagerUnannotated:  # a FAKE with no return annotation: read as the later releases' shape
    def add_requests(self, inputs, max_new_tokens=None, record_timestamps=False):
        raise AssertionError("a probe never calls it")


def _batch_probe(manager: Any) -> Any:
    from test_transformers_versions import (FakeBatchingMixin, FakeNewConfig, FakeNewGenerationConfig,
                                            fake_importer, fake_transformers)

    return tv.probe(fake_transformers(FakeNewConfig, FakeNewGenerationConfig, FakeBatchingMixin),
                    fake_importer(manager=manager))


def test_no_batch_mode_where_generate_batch_loses_a_persistent_managers_later_results():
    """5.5.4 measured: the second generate_batch call of a persistent manager logged `Request req_0 not
    found in results` and returned {} (the manager had named it req_1), so every run ended in an engine
    error at the second batch call. Such a release runs every other mode."""
    f = _batch_probe(FakeManagerReturningNothing)
    assert not f.continuous_batching and f.page_field == ""
    assert f.modes == ("generate", "assisted", "adversarial", "prompt_lookup")


def test_batch_mode_where_add_requests_returns_the_ids():
    from test_transformers_versions import FakeContinuousBatchingManager

    for manager in (FakeContinuousBatchingManager, FakeManagerUnannotated):
        f = _batch_probe(manager)
        assert f.continuous_batching and "batch" in f.modes, manager.__name__


def test_a_string_annotation_of_none_counts_as_none():
    """A module with `from __future__ import annotations` and no evaluation keeps the annotation as text."""
    class FakeManagerStringAnnotation:
        def add_requests(self, inputs):
            pass
    FakeManagerStringAnnotation.add_requests.__annotations__ = {"return": "None"}
    assert not _batch_probe(FakeManagerStringAnnotation).continuous_batching
