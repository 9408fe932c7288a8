"""Run the fault zoo: the reference engine with each fault of reference_engine/faults.py switched on,
through the CI profile, and measure how fast and how clearly the suite catches each one.

    python -m adapters.fault_zoo [--faults a,b] [--out reports/fault-zoo.md] [--max-examples N]
                                 [--report-dir DIR] [--no-control] [--shrink-seconds S | --no-shrink]
                                 [--notes FILE]

For every fault: the check(s) that failed first, how many examples it took to the first failure
(Hypothesis stops generating there and shrinks), the size of the shrunk witness (longest prompt in
tokens and in blocks, number of requests) and the wall time. The unfaulted engine is run first as the
control: it must pass. Writes a Markdown table (default reports/fault-zoo.md) and prints it.
Exit code 0 when every fault was caught and the control passed, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from attrs import define

from conformance.analysis import example_failures, select_checks
from conformance.history import load
from conformance.minimise import minimise
from conformance.runner import run_suite
from conformance.strategies import Batch, Configure, step_from_json, step_to_json
from reference_engine.faults import FAULTS


@define
class ZooRow:
    fault: str
    bug_class: str
    caught: bool
    checks_first: list[str]
    checks_witness: list[str]
    examples_to_first_failure: int | None
    examples_run: int
    witness_prompt_tokens: int | None
    witness_blocks: float | None
    witness_requests: int | None
    seconds: float
    verdict: str
    expected_ok: bool
    witness: dict | None = None  # a `kvparity replay` file: engine, arguments, check, minimised steps


@contextlib.contextmanager
def shrink_budget(seconds: float | None):
    """Cap Hypothesis' shrinking time (its default is 300 s per failure)."""
    from hypothesis.internal.conjecture import engine as conjecture

    saved = conjecture.MAX_SHRINKING_SECONDS
    if seconds is not None:
        conjecture.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        conjecture.MAX_SHRINKING_SECONDS = saved


def measure(fault: str | None, *, profile: str = "ci", max_examples: int | None = None,
            report_dir: str | Path | None = None, shrink: bool = True, shrink_seconds: float | None = 30) -> ZooRow:
    """Run the suite once against the reference engine with `fault` on (None: the control)."""
    from adapters.reference import ReferenceAdapter

    started = time.monotonic()

    def new_engine() -> ReferenceAdapter:
        return ReferenceAdapter(**({"fault": fault} if fault else {}))

    engine = new_engine()
    with tempfile.TemporaryDirectory() as db, shrink_budget(shrink_seconds):  # a fresh example database: no replay of old failures
        out = run_suite(engine, engine_name=f"reference-{fault or 'control'}",
                        engine_args={"fault": fault or "none"}, profile=profile,
                        report_dir=report_dir or Path(db) / "reports", max_examples=max_examples,
                        database_dir=db, shrink=shrink)
        history = load(out.run_dir / "history.jsonl")
    names = select_checks(None)
    failing = []
    for ex in history.examples:
        fails = example_failures(history.only(ex), names)
        if fails:
            failing.append((ex, sorted({f.check for f in fails})))
    first = failing[0] if failing else None
    witness = failing[-1] if failing else None  # Hypothesis replays the shrunk example last
    prompt = requests = blocks = witness_file = None
    expected = FAULTS[fault].expected if fault else ()
    if witness is not None:
        steps = [step_from_json(s) for s in witness[0].steps()]
        check = next((c for c in witness[1] if c in expected), witness[1][0])
        if shrink:  # then minimise the resolved steps, where Hypothesis' shrinker cannot reach
            steps = minimise(new_engine, history.capabilities, check, steps)
        prompt, blocks, requests = witness_size(steps, history.capabilities.block_size)
        witness_file = {"kvparity_witness": 1, "engine": "reference", "engine_args": {"fault": fault or "none"},
                        "check": check,
                        "steps": [step_to_json(s) for s in steps]}
    return ZooRow(fault or "(none: control)", FAULTS[fault].bug_class if fault else "-", bool(failing),
                  first[1] if first else [], witness[1] if witness else [],
                  (first[0].index + 1) if first else None, out.examples, prompt, blocks, requests,
                  time.monotonic() - started, out.verdict,
                  not fault or bool(first and set(first[1] + witness[1]) & set(expected)), witness_file)


def witness_size(steps, default_block_size: int) -> tuple[int, float, int]:
    """(longest prompt in tokens, in blocks of the block size its batch ran with, requests)."""
    block_size, sized = default_block_size, []
    for step in steps:
        if isinstance(step, Configure):
            block_size = int(step.config.get("block_size", default_block_size))
        elif isinstance(step, Batch):
            sized += [(len(q.prompt), len(q.prompt) / block_size) for q in step.items]
    return max((t for t, _ in sized), default=0), max((k for _, k in sized), default=0.0), len(sized)


def run_facts(profile: str, shrink: str) -> list[str]:
    """What was run: code commit, versions, checkpoints, profile, seed, shrink budget."""
    import hashlib
    import platform
    import subprocess
    from importlib import metadata

    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return "?"

    commit = sh("git", "rev-parse", "--short", "HEAD") or "?"
    dirty = " (with uncommitted changes)" if sh("git", "status", "--porcelain", "--untracked-files=no") else ""
    ckpt = Path(__file__).resolve().parent.parent / "reference_engine" / "checkpoints"
    digests = []
    for d in sorted(ckpt.glob("*/")):
        f = next((d / n for n in ("model.safetensors", "adapter_model.safetensors") if (d / n).is_file()), None)
        if f is not None:
            digests.append(f"{d.name} {hashlib.sha256(f.read_bytes()).hexdigest()[:12]}")
    vers = {}
    for dist in ("hypothesis", "torch"):
        try:
            vers[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            vers[dist] = "?"
    seed = "derandomised (fixed seed per test function)" if profile == "ci" else "random"
    return [f"- run: kvparity commit `{commit}`{dirty}, reference engine 0.1.0 (float64, tolerance 0), "
            f"python {platform.python_version()}, hypothesis {vers['hypothesis']}, torch {vers['torch']}",
            f"- profile `{profile}` (100 examples max, 6 steps per scenario), seed: {seed}; shrinking: {shrink}",
            f"- checkpoints (sha256 of the weights): {', '.join(digests) or '?'}"]


def witness_path(report: str | Path, fault: str) -> Path:
    """reports/fault-zoo.md -> reports/fault-zoo/witnesses/NAME.json"""
    return Path(report).with_suffix("") / "witnesses" / f"{fault}.json"


def describe_steps(steps: list[dict]) -> str:
    """A witness in one line: each configuration, reset and batch, each request by its sizes."""
    parts = []
    for s in steps:
        if s["step"] == "configure":
            parts.append("config " + ", ".join(f"{k}={v}" for k, v in sorted(s["config"].items())))
        elif s["step"] == "reset":
            parts.append("reset")
        else:
            reqs = []
            for q in s["requests"]:
                ident = {k: v for k, v in (q.get("identity") or {}).items() if v is not None and (k, v) != ("revision", "a")}
                reqs.append(f"{len(q.get('prompt', ()))}-token prompt, max_tokens {q['max_tokens']}"
                            + (f", stop {list(q['stop_ids'])}" if q.get("stop_ids") else "")
                            + (f", {', '.join(f'{k} {v}' for k, v in ident.items())}" if ident else ""))
            parts.append("batch [" + "; ".join(reqs) + "]")
    return " → ".join(parts)


MAX_MEDIAN_EXAMPLES, MAX_WITNESS_BLOCKS = 30, 2  # the bars


def bars(rows: list[ZooRow], control: ZooRow | None) -> list[str]:
    """The zoo's three bars, each met or not, with the faults that miss it named."""
    def verdict(missed: list[str]) -> str:
        return "**met**" if not missed else f"**not met** for {', '.join(f'`{m}`' for m in missed)}"

    caught = [r for r in rows if r.caught]
    firsts = [r.examples_to_first_failure for r in caught if r.examples_to_first_failure]
    median = statistics.median(firsts) if firsts else None
    big = [r.fault for r in rows if r.witness_blocks is None or r.witness_blocks > MAX_WITNESS_BLOCKS]
    control_ok = control is None or control.verdict == "pass"
    return [f"- caught by the `ci` profile, 100%: {verdict([r.fault for r in rows if not r.caught])} "
            f"({len(caught)}/{len(rows)}; control {'passes' if control_ok else '**' + control.verdict + '**'})",
            f"- median examples to first failure <= {MAX_MEDIAN_EXAMPLES}: "
            f"{'**met**' if median is not None and median <= MAX_MEDIAN_EXAMPLES else '**not met**'} ({'-' if median is None else f'{median:g}'})",
            f"- witnesses <= {MAX_WITNESS_BLOCKS} blocks of prompt tokens: {verdict(big)} "
            f"({len(rows) - len(big)}/{len(rows)}; largest "
            f"{max((r.witness_blocks or 0 for r in rows), default=0):.2g} blocks)"]


def render(rows: list[ZooRow], control: ZooRow | None, profile: str, facts: list[str] | None = None,
           notes: str = "", out_path: str | Path = "reports/fault-zoo.md") -> str:
    faults = rows
    caught = [r for r in faults if r.caught]
    firsts = [r.examples_to_first_failure for r in caught if r.examples_to_first_failure]
    lines = ["# Fault zoo", "",
             f"The reference engine with one real-world fault switched on at a time (reference_engine/faults.py), "
             f"run through the `{profile}` profile of the suite. Generated by `python -m adapters.fault_zoo`.", "",
             f"- caught: **{len(caught)}/{len(faults)}**"
             + (f"; median examples to first failure: **{statistics.median(firsts):g}**" if firsts else ""),
             "- witness size: longest prompt of the shrunk witness, in tokens and in blocks of the witness's "
             "block size; requests in the witness", *(facts or [])]
    if control is not None:
        lines.append(f"- control (no fault): **{control.verdict}** in {control.examples_run} examples, "
                     f"{control.seconds:.1f}s")
    lines += ["", "| fault | class | caught by (first failure) | witness checks | examples to first failure | "
              "witness prompt tokens (blocks) | witness requests | time (s) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in faults:
        size = f"{r.witness_prompt_tokens} ({r.witness_blocks:.2g})" if r.witness_prompt_tokens is not None else "-"
        lines.append(f"| `{r.fault}` | {r.bug_class} | {', '.join(r.checks_first) or '**not caught**'} | "
                     f"{', '.join(r.checks_witness) or '-'} | {r.examples_to_first_failure or '-'} | {size} | "
                     f"{r.witness_requests if r.witness_requests is not None else '-'} | {r.seconds:.1f} |")
    lines += ["", "## Bars", "", *bars(faults, control)]
    lines += ["", "## Witnesses", "",
              "The minimised witness of each fault, replayable with one command. It prints FAILED while the "
              "fault is on; with `--engine-arg fault=none` it prints FIXED, or INCONCLUSIVE where only the "
              "fault made the witness exercise its check (`hit_uncapped`: a 16-token prompt gets a hit only "
              "when the hit may cover the last token):", ""]
    for r in faults:
        if r.witness is not None:
            lines.append(f"- `{r.fault}` [{r.witness['check']}]: {describe_steps(r.witness['steps'])}. "
                         f"`kvparity replay {witness_path(out_path, r.fault)}`")
    lines += ["", "## The faults", ""]
    for r in faults:
        f = FAULTS.get(r.fault)
        if f is not None:
            lines.append(f"- `{f.name}` ({f.bug_class}, replaces `{f.target}.{f.method}`): {f.summary}. "
                         f"Mechanism: {f.mechanism}.")
    return "\n".join(lines) + "\n" + (f"\n{notes.strip()}\n" if notes.strip() else "")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvparity fault-zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", default="", help="comma-separated fault names (default: all)")
    p.add_argument("--out", default="reports/fault-zoo.md")
    p.add_argument("--profile", default="ci")
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--report-dir", default=None, help="keep each run's report here (default: discarded)")
    p.add_argument("--shrink-seconds", type=float, default=60,
                   help="shrinking budget per fault (bounded; Hypothesis' own default is 300 s)")
    p.add_argument("--no-shrink", action="store_true",
                   help="stop at the first failure (its example is the witness): catch and check only")
    p.add_argument("--no-control", action="store_true", help="skip the unfaulted control run")
    p.add_argument("--notes", default=None, help="Markdown appended to the report (what it took, caveats)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.faults.split(",") if n.strip()] or list(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        print(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 3
    control = None if args.no_control else measure(None, profile=args.profile, max_examples=args.max_examples,
                                                    report_dir=args.report_dir, shrink=False)
    rows = []
    for name in names:
        row = measure(name, profile=args.profile, max_examples=args.max_examples, report_dir=args.report_dir,
                      shrink=not args.no_shrink, shrink_seconds=args.shrink_seconds)
        rows.append(row)
        print(f"{name}: {'caught by ' + ', '.join(row.checks_first) if row.caught else 'NOT CAUGHT'} "
              f"after {row.examples_to_first_failure} examples ({row.seconds:.1f}s)", file=sys.stderr, flush=True)
    budget = "off (--no-shrink)" if args.no_shrink else f"Hypothesis' shrinker, capped at {args.shrink_seconds:g} s per fault"
    notes = Path(args.notes).read_text() if args.notes else ""
    text = render(rows, control, args.profile, run_facts(args.profile, budget), notes, args.out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    for r in rows:
        if r.witness is not None:
            path = witness_path(args.out, r.fault)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(r.witness, indent=1) + "\n")
    print(text)
    ok = all(r.caught for r in rows) and (control is None or control.verdict == "pass")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
