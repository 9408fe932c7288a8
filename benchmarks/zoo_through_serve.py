"""Which zoo faults are visible through HTTP, with and without concurrency (reports/openai_http-kvparity/).

Every committed fault-zoo witness (reports/fault-zoo/witnesses/, minimised in-process) is replayed through
the HTTP adapter against `kvparity serve --fault NAME` twice: `arrival=stagger` (a batch's requests sent
10 ms apart, all in flight together, so they overlap inside the server's continuous batch) and
`arrival=serial` (each request after the previous one's answer: never two in the server at once). A
witness's configure step restarts the server with its knobs (chunk size, drafter, pool size). Each replay
also runs with `fault=none`, which must print FIXED (the witness passes on the correct server).

    python benchmarks/zoo_through_serve.py [--out reports/openai_http-kvparity/zoo.md] [--faults a,b]

The rows are kept in zoo.json beside the report; `--faults` re-runs those rows and keeps the others.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def generated_run(fault: str, mode: str) -> tuple[str, str]:
    """A witness that HTTP cannot express (an in-place adapter reload): a fresh generated dev-profile run
    through the server instead (12 examples, seed 0, no shrinking); "SUITE FAIL" when it catches the fault."""
    import tempfile

    from adapters.openai_http import OpenAIHttpAdapter
    from conformance.runner import run_suite
    from conformance.run_config import RunConfig

    adapter = OpenAIHttpAdapter(serve="kvparity", block_size="16", fault="" if fault == "none" else fault,
                                arrival=mode)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = run_suite(adapter, RunConfig(engine_name="openai_http", profile="dev", report_dir=tmp, seed=0,
                                               database_dir=tmp, shrink=False))
    finally:
        adapter.close()
    failing = [name for name, c in out.analysis.checks.items() if getattr(c, "status", "") == "fail"]
    return f"SUITE {out.verdict.upper()}", f"witness not expressible over HTTP; generated run: {out.verdict} {failing}"


def main() -> int:
    from conformance.witness_replay import replay_case
    from reference_engine.faults import FAULTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".kvparity/zoo-through-serve.md")
    ap.add_argument("--faults", default="", help="comma list (default: every fault with a committed witness)")
    a = ap.parse_args()
    witnesses = ROOT / "reports" / "fault-zoo" / "witnesses"
    names = [n for n in (a.faults.split(",") if a.faults else sorted(FAULTS)) if (witnesses / f"{n}.json").exists()]
    out = pathlib.Path(a.out)
    store = out.with_suffix(".json")
    kept = {r["fault"]: r for r in json.loads(store.read_text())["rows"]} if store.exists() and a.faults else {}
    t0 = time.monotonic()
    for name in names:
        row = {"fault": name, "class": FAULTS[name].bug_class}
        for mode in ("stagger", "serial"):
            args = {"serve": "kvparity", "block_size": "16", "arrival": mode}
            word, _, detail = replay_case(witnesses / f"{name}.json", args, timeout_s=300, engine="openai_http")
            if word == "ERROR" and "not expressible over HTTP" in detail:  # the witness itself cannot be sent
                word, detail = generated_run(name, mode)
            row[mode] = (word, detail)
        word, _, detail = replay_case(witnesses / f"{name}.json", {"serve": "kvparity", "block_size": "16",
                                                                  "fault": "none"}, timeout_s=300, engine="openai_http")
        if word == "ERROR" and "not expressible over HTTP" in detail:
            word, detail = generated_run("none", "stagger")
        row["control"] = (word, detail)
        kept[name] = row
        print(name, row["stagger"][0], row["serial"][0], row["control"][0], flush=True)
    rows = [kept[n] for n in sorted(kept)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = ["# The fault zoo through `kvparity serve`, with and without concurrency", "",
             f"`python benchmarks/zoo_through_serve.py` on commit {commit}, "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, {time.monotonic() - t0:.0f} s. Each committed witness "
             "replayed through `--engine openai_http --engine-arg serve=kvparity` against `kvparity serve --fault NAME`: "
             "*stagger* = a batch's requests 10 ms apart, all in flight together; *serial* = one request at a time; "
             "*control* = the same witness against the server without the fault (must be FIXED). A witness HTTP "
             "cannot express (an in-place adapter reload) is replaced by a generated dev-profile run (12 examples, "
             "seed 0): SUITE FAIL / SUITE PASS.", "",
             "| fault | class | stagger (concurrent) | serial | control (no fault) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['fault']}` | {r['class']} | {r['stagger'][0]} | {r['serial'][0]} | {r['control'][0]} |")
    caught = {m: sum(r[m][0] in ("FAILED", "SUITE FAIL") for r in rows) for m in ("stagger", "serial")}
    lines += ["", f"Caught (FAILED): {caught['stagger']}/{len(rows)} concurrent, {caught['serial']}/{len(rows)} serial; "
              f"controls FIXED: {sum(r['control'][0] == 'FIXED' for r in rows)}/{len(rows)}.", "", "Details:", ""]
    for r in rows:
        for m in ("stagger", "serial", "control"):
            lines.append(f"- `{r['fault']}` {m}: {r[m][0]}: {' '.join(str(r[m][1]).split())[:300]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    store.write_text(json.dumps({"commit": commit, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
