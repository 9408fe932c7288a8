"""One transformers release per minor line, probed and smoke-run: does the adapter follow every release it
claims (docs/real-engines.md: 4.38 to 5.24)?

The museum builds a full venv (torch included, ~1 GB) per release, too big for 45 releases; a release
is pure Python, so here each is installed with `pip install --target DIR` and put first on PYTHONPATH
of the interpreter running this script (its torch and kvparity's own deps serve every release). One
release at a time, sequentially (the machine is shared): install, probe
(`adapters.transformers_versions.probe`), a short `kvparity run`, record. Records accumulate in a JSON
file keyed by version (a rerun of one release replaces its row), and the markdown table is rendered
from all of them.

    python benchmarks/transformers_sweep.py                  # every claimed minor line's latest patch
    python benchmarks/transformers_sweep.py 4.40.2 5.5.4     # just these (rows of others are kept)
    python benchmarks/transformers_sweep.py --render         # re-render the table from the records

A file named PAUSE in the work folder holds the sweep before its next release (to free the core)."""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLAIMED = ((4, 38), (5, 24))  # the range docs/real-engines.md claims, first and last minor line
RECORDS = ROOT / "reports" / "transformers" / "compat.json.gz"  # gzip: reports/ has a 10 MiB cap
TABLE = ROOT / "reports" / "transformers" / "compat.md"
RUN_ARGS = ["--engine", "transformers", "--profile", "dev", "--no-shrink", "--seed", "0", "-q",
            "--known", "reports/transformers/known.json"]
PROBE = """
import json, transformers
from adapters import transformers_versions as tv
f = tv.probe(transformers)
print(json.dumps({"version": f.version, "modes": list(f.modes), "dtype_kwarg": f.dtype_kwarg,
                  "page_field": f.page_field, "assistant_fields": list(f.assistant_fields),
                  "tokenizers": __import__("tokenizers").__version__}))
"""


def released_versions(python: str) -> list[str]:
    """Every final release of transformers the configured package index has (`pip index versions`)."""
    out = subprocess.run([python, "-m", "pip", "index", "versions", "transformers"], capture_output=True,
                         text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("Available versions:"))
    return [v.strip() for v in line.split(":", 1)[1].split(",") if re.fullmatch(r"\d+\.\d+\.\d+", v.strip())]


def key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def claimed_lines(versions: list[str]) -> tuple[list[str], list[str]]:
    """The latest patch of each minor line in the claimed range, and the lines of that range with no
    release on the index (a gap in a major's minors between the range's ends)."""
    (first_major, first_minor), last = CLAIMED
    latest: dict[tuple[int, int], str] = {}
    for v in versions:
        line = key(v)[:2]
        if (first_major, first_minor) <= line <= last and key(v) > key(latest.get(line, "0.0.0")):
            latest[line] = v
    missing = []
    for major in range(first_major, last[0] + 1):
        minors = [m for (a, m) in latest if a == major]
        low = first_minor if major == first_major else 0
        high = last[1] if major == last[0] else max(minors, default=low)
        missing += [f"{major}.{m}" for m in range(low, high + 1) if (major, m) not in latest]
    return [latest[line] for line in sorted(latest)], missing


def install(python: str, version: str, target: Path) -> tuple[str, float]:
    """`pip install --target` the release and its own deps ("" when done, else the cause) and seconds."""
    start = time.monotonic()
    if (target / f"transformers-{version}.dist-info").is_dir():
        return "", 0.0
    shutil.rmtree(target, ignore_errors=True)
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                           str(target), f"transformers=={version}", "huggingface-hub<2"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()
        return (errors[-1] if errors else f"pip exited {proc.returncode}"), time.monotonic() - start
    return "", time.monotonic() - start


def environment(target: Path) -> dict[str, str]:
    """The release first on PYTHONPATH after this checkout; one thread (the shared-machine rule); offline."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{target}", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    return env


def probe(python: str, target: Path) -> dict[str, Any]:
    proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=environment(target),
                          cwd=ROOT, timeout=300)
    if proc.returncode != 0:
        return {"error": last_line(proc.stderr)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def smoke(python: str, target: Path, report_dir: Path, max_examples: int, timeout: int) -> dict[str, Any]:
    """One short `kvparity run` of every mode the release has; its verdict, examples and findings."""
    cmd = [python, "-m", "kvparity", "run", *RUN_ARGS, "--max-examples", str(max_examples),
           "--report-dir", str(report_dir)]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=environment(target), cwd=ROOT,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"verdict": "error", "exit_code": None, "wall_s": round(time.monotonic() - start, 1),
                "cause": f"no verdict within {timeout} s"}
    record: dict[str, Any] = {"exit_code": proc.returncode, "wall_s": round(time.monotonic() - start, 1)}
    match = re.search(r"report (\S+)\s*$", proc.stdout.strip())
    run_dir = Path(match.group(1)) if match else None
    record.update(read_results(run_dir) if run_dir else {"verdict": "error"})
    if record["verdict"] == "error" or proc.returncode == 3:
        record["cause"] = record.get("cause") or last_line(proc.stderr) or last_line(proc.stdout)
    return record


def read_results(run_dir: Path) -> dict[str, Any]:
    """Verdict, examples, the findings (signature, check, known or not, headline) and, for a run that is
    not a pass, its one-line cause: the first new finding, else the inconclusive checks' reasons."""
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError) as exc:
        return {"verdict": "error", "cause": f"unreadable run folder {run_dir}: {exc}"}
    findings = [{"signature": f["signature"]["signature"], "check": f["check"], "known": bool(f.get("known")),
                 "headline": short(f.get("headline", f.get("title", ""))), "config": finding_config(f),
                 "explanation": short(str(f.get("explanation", "")).split(". ")[0])}
                for f in results.get("findings", [])]
    record = {"verdict": results["verdict"], "examples": results["examples"], "run_dir": str(run_dir),
              "findings": findings}
    new = [f for f in findings if not f["known"]]
    if new:
        record["cause"] = f"{new[0]['headline']} [{new[0]['check']} {new[0]['signature']}]"
    elif results["verdict"] == "inconclusive":
        record["cause"] = "; ".join(f"{name}: {'; '.join(c.get('notes') or [])}"
                                    for name, c in results["checks"].items() if c.get("status") == "inconclusive")
    elif results.get("errors"):
        record["cause"] = "; ".join(map(str, results["errors"]))[:300]
    return record


def finding_config(finding: dict[str, Any]) -> str:
    """The configuration (mode, k) of the batch a finding's story focuses on, as `k=5 mode=assisted`."""
    story = finding.get("story") or {}
    focus = (story.get("focus") or {}).get("batch")
    config = next((t.get("config") for t in story.get("timeline", ())
                   if t.get("kind") == "batch" and t.get("batch") == focus), None) or {}
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def sweep_one(args: argparse.Namespace, version: str) -> dict[str, Any]:
    target = args.workdir / version
    while (args.workdir / "PAUSE").exists():
        time.sleep(5)
    record: dict[str, Any] = {"version": version, "when": now()}
    cause, seconds = install(args.python, version, target)
    record["install_s"] = round(seconds, 1)
    if cause:
        record.update(verdict="not installable", cause=cause)
        return record
    record["probe"] = probe(args.python, target)
    if "error" in record["probe"]:
        record.update(verdict="error", cause=f"probe: {record['probe']['error']}")
    else:
        record.update(smoke(args.python, target, args.report_dir, args.max_examples, args.timeout))
    if not args.keep:
        shutil.rmtree(target, ignore_errors=True)
    return record


def setup() -> str:
    """What every release ran on: this checkout's commit, the interpreter, its torch."""
    from importlib import metadata

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    return (f"kvparity {commit.strip() or '?'}, Python {sys.version.split()[0]}, torch {metadata.version('torch')}, "
            f"{os.cpu_count()} CPUs (shared), one thread per run")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def load_records(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes())) if path.is_file() else {"releases": {}}


def save(data: dict[str, Any], records: Path, table: Path) -> None:
    records.write_bytes(gzip.compress((json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), mtime=0))
    table.write_text(render(data))


OUTCOMES = ("pass", "pass, known met", "fail", "inconclusive", "error", "not installable")


def outcome(record: dict[str, Any]) -> str:
    """The row's class for the summary: a pass that met (and waived) known findings is told apart."""
    verdict = record.get("verdict", "error")
    if verdict == "pass" and any(f["known"] for f in record.get("findings", ())):
        return "pass, known met"
    return verdict if verdict in OUTCOMES else "error"


def probe_cell(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    if "error" in p:
        return f"probe error: {p['error']}"
    page = f", page `{p['page_field']}`" if p["page_field"] else ""
    threshold = ", threshold" if "assistant_confidence_threshold" in p["assistant_fields"] else ""
    return f"{' '.join(p['modes'])}; `{p['dtype_kwarg']}=`{page}{threshold}; tokenizers {p['tokenizers']}"


def findings_cell(record: dict[str, Any]) -> str:
    """The cause, then each waived known finding with the configuration and what it saw (a signature is
    coarse: the same one can stand for another bug on another release)."""
    known = {f["signature"]: f for f in record.get("findings", ()) if f["known"]}
    waived = [f"{sig} ({f.get('config') or '?'}: {short(f.get('explanation') or f['headline'])})"
              for sig, f in sorted(known.items())]
    cause = record.get("cause", "")
    return "; ".join(filter(None, [cause, f"known met: {', '.join(waived)}" if waived else ""])).replace("|", "/")


def short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render(data: dict[str, Any]) -> str:
    """The markdown page: what was run, the summary by outcome, one row per release."""
    releases = sorted(data["releases"].values(), key=lambda r: key(r["version"]))
    counts = {o: sum(outcome(r) == o for r in releases) for o in OUTCOMES}
    not_run = [v for v in data.get("lines", []) if v not in data["releases"]]
    out = ["# transformers: one release per minor line", "",
           "Generated by `python benchmarks/transformers_sweep.py` (records: `compat.json.gz`); do not edit by hand.",
           "Each release is installed with `pip install --target DIR transformers==X 'huggingface-hub<2'` and put",
           "on PYTHONPATH before the kvparity venv (its torch serves every release); one thread, seed 0. Per release:",
           "what `adapters.transformers_versions.probe` finds (the modes the adapter runs, the `from_pretrained`",
           "dtype keyword, the continuous-batching page field, whether the assistant has a confidence threshold,",
           "and the `tokenizers` the release pins), then a smoke run of every mode it has:", "",
           f"    {data.get('command', '')} --report-dir /tmp/compat-runs", "",
           f"Setup (last sweep): {data.get('setup', '?')}.", "",
           "A smoke run is 4 examples: a pass says the adapter runs the release, not that the release is",
           "conforming (the CI profile is 100); a fail is a finding of that release (its one-line cause and",
           "signature), a known finding of reports/transformers/known.json is waived and listed.", "",
           "**Summary**: " + ", ".join(f"{o} {n}" for o, n in counts.items() if n) + f" of {len(releases)} releases run"
           + (f"; lines with no release on the index: {', '.join(data['missing_lines'])}"
              if data.get("missing_lines") else "; every claimed minor line has a release on the index")
           + (f"; not run yet: {', '.join(not_run)}" if not_run else "") + ".", "",
           "| release | run (UTC) | probe: modes; dtype keyword; page field; tokenizers | verdict (exit) | examples "
           "| wall s | cause / known findings met |",
           "|---|---|---|---|---:|---:|---|"]
    for r in releases:
        exit_code = "" if r.get("exit_code") is None else f" ({r['exit_code']})"
        out.append(f"| {r['version']} | {r.get('when', '')} | {probe_cell(r.get('probe'))} | "
                   f"**{outcome(r)}**{exit_code} | {r.get('examples', '')} | {r.get('wall_s', '')} | "
                   f"{findings_cell(r)} |")
    notes = data.get("notes") or {}
    if notes:
        out += ["", "## Notes (`--note RELEASE=TEXT`: what a row does not say)", ""]
        out += [f"- **{v}**: {text}" for v, text in sorted(notes.items(), key=lambda n: key(n[0].split()[0]))]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="releases to run (none: each claimed minor line's latest)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch and kvparity's deps")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfsweep"), help="one --target folder per release")
    parser.add_argument("--report-dir", type=Path, default=Path("/tmp/compat-runs"))
    parser.add_argument("--max-examples", type=int, default=4)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per smoke run")
    parser.add_argument("--keep", action="store_true", help="keep each release's --target folder")
    parser.add_argument("--records", type=Path, default=RECORDS)
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--render", action="store_true", help="only re-render the table from the records")
    parser.add_argument("--note", action="append", default=[], metavar="RELEASE=TEXT",
                        help="a note under the table about RELEASE (a range's first release keys it); "
                             "empty TEXT drops it")
    args = parser.parse_args(argv)
    data = load_records(args.records)
    for note in args.note:
        release, _, text = note.partition("=")
        if not re.fullmatch(r"\d+\.\d+\.\d+", release.split()[0] if release.split() else ""):
            print(f"transformers_sweep: --note {note!r}: expected RELEASE=TEXT", file=sys.stderr)
            return 3
        data.setdefault("notes", {}).pop(release, None)
        if text:
            data["notes"][release] = text
    if args.render:  # the run folders, where still there, are read again (a newer reading of them)
        for record in data["releases"].values():
            if record.get("run_dir") and Path(record["run_dir"], "results.json").is_file():
                record.update(read_results(Path(record["run_dir"])))
    else:
        available = released_versions(args.python)
        lines, missing = claimed_lines(available)
        command = " ".join(["python -m kvparity run", *RUN_ARGS, "--max-examples", str(args.max_examples)])
        data.update(lines=lines, missing_lines=missing, setup=setup(), command=command)
        args.workdir.mkdir(parents=True, exist_ok=True)
        for version in args.versions or lines:
            if version not in available:
                print(f"transformers_sweep: {version} is not on the package index", file=sys.stderr)
                return 3
            record = sweep_one(args, version)
            data["releases"][version] = record
            print(f"{version}: {record['verdict']} ({record.get('exit_code')}) {record.get('cause', '')}", flush=True)
            save(data, args.records, args.table)
    save(data, args.records, args.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
