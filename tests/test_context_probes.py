"""Does a finding need another identity in its batch? (conformance/alone.py, `context_probes`)

Where a failing request passes sent alone and its batch held another identity's request, the batch is sent
again after a reset, whole and with every request under the failing one's identity. A bug about
identities (a base request decoded with a LoRA in a mixed batch: vLLM finding 1) fails whole and passes
under one identity, and its signature says "another identity in its batch"; a batching bug fails both
ways and signs without it — so a known-findings entry for the first no longer waives the second.

The two bugs are FAKE engine behaviours, for the suite's own logic: the real reference engine behind an
adapter that rewrites what it is sent."""

from __future__ import annotations

import json

import attrs

from adapters.reference import ReferenceAdapter
from conformance.alone import probe_wrong
from conformance.run_config import RunConfig
from conformance.runner import run_suite
from test_conformance_checks import Crafted


class FakeLoraMixing(ReferenceAdapter):
    """FAKE: a batch mixing base-model and adapter requests runs its base requests under the first
    adapter (the shape of vLLM finding 1, reports/vllm/README.md)."""

    def run(self, requests):
        lora = next((q.identity for q in requests if q.identity.adapter is not None), None)
        if lora is not None:
            requests = [attrs.evolve(q, identity=attrs.evolve(q.identity, adapter=lora.adapter,
                                                              adapter_digest=lora.adapter_digest))
                        if q.identity.adapter is None else q for q in requests]
        return super().run(requests)


class FakeSecondInBatchShort(ReferenceAdapter):
    """FAKE: in a batch of two or more, the second request is cut one token short of its max_tokens."""

    def run(self, requests):
        requests = list(requests)
        if len(requests) > 1 and requests[1].max_tokens > 1:
            requests[1] = attrs.evolve(requests[1], max_tokens=requests[1].max_tokens - 1)
        return super().run(requests)


def _findings(engine, tmp_path):
    # The first round's finding carries the probes; looking on for more findings (keep_looking) only
    # tripled the time (68 s against 21 s on these cores). The probes do not wait for shrinking (these
    # tests pass with a 0.0001 s cap), so a short cap keeps them short under any load.
    out = run_suite(engine, RunConfig(engine_name="reference", profile="dev", seed=0, report_dir=tmp_path,
                                      database_dir=tmp_path / "db", max_shrink_seconds=5,
                                      keep_looking=False))
    assert out.verdict == "fail"
    probes = [ex for ex in out.history.examples if ex.kin or ex.rebatch]
    return json.loads((out.run_dir / "results.json").read_text())["findings"], probes, out.history


def test_a_bug_about_identities_signs_with_another_identity_in_its_batch(tmp_path):
    findings, probes, _ = _findings(FakeLoraMixing(), tmp_path)
    assert probes
    for ex in probes:  # re-sent whole its batch holds another identity; under `kin` every request has one
        identities = {q.identity for b in ex.batches for q in b.requests}
        assert len(identities) == 1 if ex.kin else len(identities) > 1
    signed = [fd["signature"]["mechanism"] for fd in findings]
    assert any(m.endswith("another identity in its batch") for m in signed), signed


def test_a_batching_bug_signs_without_it(tmp_path):
    findings, probes, history = _findings(FakeSecondInBatchShort(), tmp_path)
    assert probes  # its batch held another identity's request, and under one identity it failed again
    signed = [fd["signature"]["mechanism"] for fd in findings]
    assert not any("another identity" in m for m in signed), signed
    assert any(probe_wrong(history, ex) for ex in probes if ex.kin)


def test_the_probe_marks_are_read_as_untrusted_data():
    c = Crafted()
    c.w.append("example", index=1, kin=[[0, "r0"], ["0", "r0"]], rebatch="junk")
    ex = c.history().examples[1]
    assert ex.kin == ((0, "r0"),) and ex.rebatch is None
