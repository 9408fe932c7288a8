"""A logprob_parity finding's evidence in the report: what lies below the argmax, position by position.

The tokens of such a finding are often all equal to plain decoding's, so the token diff says nothing;
what differs is the distribution. The table puts, under each output position, the largest |logprob
difference| over the top-k tokens both lists hold, and marks the positions above the calibrated epsilon.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from conformance.report.doc import Block, Cell, Para, Table

WINDOW = 16  # output positions shown


def deviation_blocks(d: Mapping[str, Any]) -> list[Block]:
    """logprob_parity's evidence beside the tokens: per output position, the largest |logprob(engine) -
    logprob(plain decoding)| over the top-k tokens both hold, the positions above epsilon marked."""
    devs, eps = list(d["deviations"]), float(d.get("epsilon") or 0.0)
    exp, got = d["expected"], d["got"]
    cols = list(range(min(len(devs), WINDOW)))

    def at(seq: Sequence[int], i: int) -> str:
        return str(seq[i]) if i < len(seq) else "<end>"

    rows = [["plain decoding", *[at(exp, i) for i in cols]],
            ["got", *[Cell(at(got, i), "diff" if at(got, i) != at(exp, i) else "") for i in cols]],
            ["abs. logprob difference", *[Cell(f"{devs[i]:.3g}", "diff" if devs[i] > eps else "") for i in cols]]]
    return [Para(f"**Below the argmax**: the log-probabilities of the tokens both top-k lists hold, against plain "
                 f"decoding's, per output position (epsilon {eps:.3g}, measured by `kvparity calibrate`; marked: "
                 f"above it). The largest is at position {d.get('deviation_position')}."),
            Table(["position", *[str(i) for i in cols]], rows, cls="align")]
