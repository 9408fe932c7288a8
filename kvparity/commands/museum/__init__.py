"""`kvparity museum`: rediscover real bugs in released engine versions, and check the fixed release passes.

    kvparity museum --list
    kvparity museum [--exhibit ID ...] [--family NAME] [--runs DIR] [--out FILE] [--rebuild] [--render-only]

For each exhibit of the catalogue (`exhibits/*.toml`: a public bug, its buggy and fixed release, the
`kvparity run` arguments), the museum builds one cached venv per release (`venvs`), runs the suite in
it with the exhibit's seed into `<runs>/<id>/<version>/`, and reads the run folder back (`outcome`).
A version run (`versions-<family>-<title>`) runs a family's CI profile across the releases it lists.
`--exhibit` picks exhibits and version runs by id (none: all of them). The page (`render`) is
made from every run folder under `--runs`, so runs made at different times, or by different people,
add up to one page; `--render-only` remakes it without running anything.

A release that cannot be installed here is a row saying so; a run that crashes, hangs past
`--run-timeout` or leaves no readable run folder is `error`, never a pass. Exit 0 when every exhibit that
was run was caught on its buggy release and passed on its fixed one, 1 when not, 3 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

from kvparity.parsing import UsageParser, output_dir, output_file, run_command, summary
from kvparity.commands.museum import exhibits as catalogue
from kvparity.commands.museum import outcome, render, venvs
from kvparity.commands.museum.exhibits import Exhibit, Package, VersionRun
from conformance.arguments import positive_seconds
from conformance.contract import UsageError

DEFAULT_RUNS = Path(".kvparity") / "museum"  # untracked; `make reports-museum` writes reports/museum/
DEFAULT_OUT = Path(".kvparity") / "museum.md"
DEFAULT_RUN_TIMEOUT = 3600.0
RECORD = "museum.json"  # beside the run folders of one release: how the museum ran it


def run_release(package: Package, version: str, args: Sequence[str], seed: int, folder: Path, *,
                timeout: float, rebuild: bool = False) -> dict:
    """Install `package==version` (cached) and run `kvparity run args` there; record how it went in
    `folder/museum.json`, beside the run folder it writes."""
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    venv = venvs.ensure(package, version, rebuild=rebuild)
    record = {"package": package.name, "version": version, "venv": str(venv.path), "installed": venv.ready,
              "install_error": venv.reason, "args": list(args), "seed": seed, "exit_code": None,
              "timed_out": False, "seconds": None}
    if venv.ready:
        argv = [str(venv.kvparity), "run", *args, "--seed", str(seed), "--report-dir", str(folder), "-q"]
        record["command"] = argv
        before = set(folder.glob("*/*/"))
        with open(folder / "museum.log", "w") as log:
            proc = subprocess.Popen(argv, env={**os.environ, **package.env}, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                record["exit_code"] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                record["timed_out"] = True
            except BaseException:  # ^C: its own session would outlive us, engine workers and all
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        new = sorted(set(folder.glob("*/*/")) - before)  # this run's folder: never an older run's
        record["run_dir"] = str(new[-1].relative_to(folder)) if new else None  # relative: the folder may move
    record["seconds"] = round(time.monotonic() - started, 1)
    (folder / RECORD).write_text(json.dumps(record, indent=1))
    return record


def release_outcome(folder: Path, check: str | None) -> tuple[dict | None, outcome.Outcome]:
    """How a release's run went, from its folder: (the museum's record or None, the outcome)."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None, outcome.Outcome("error", None, None, note="not run")
    if not record.get("installed"):
        return record, outcome.Outcome("error", None, None, note=f"cannot install here: {record.get('install_error')}")
    if record.get("timed_out"):
        return record, outcome.Outcome("error", None, None, note="the run was killed at the museum's timeout")
    run_dir = record.get("run_dir")  # relative to `folder`; may lead out of it to a run committed elsewhere
    return record, outcome.read(Path(os.path.normpath(folder / run_dir)) if run_dir else None, check,
                                record.get("exit_code"),
                                "" if run_dir else f"the run (exit {record.get('exit_code')}) wrote no run folder")


def build_parser() -> UsageParser:
    p = UsageParser(prog="kvparity museum", description=summary(__doc__))
    p.add_argument("--list", action="store_true", help="list the exhibits and version runs, and which venvs are built")
    p.add_argument("--exhibit", action="append", default=[], metavar="ID",
                   help="run this exhibit or version run (repeatable; ids: --list); none given: all of them")
    p.add_argument("--family", default=None, help="only this family's exhibits and version runs (e.g. vllm)")
    p.add_argument("--runs", default=str(DEFAULT_RUNS), help="where run folders go (reports/museum for the committed page)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the page to write")
    p.add_argument("--run-timeout", type=positive_seconds, default=DEFAULT_RUN_TIMEOUT,
                   help="seconds one release's run may take before it is killed and counted as error")
    p.add_argument("--rebuild", action="store_true", help="rebuild the venvs even when they are ready")
    p.add_argument("--render-only", action="store_true", help="remake the page from the run folders; run nothing")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    args.catalogue = catalogue.load()
    known = {e.id for e in args.catalogue[0]} | {render.slug(r) for r in args.catalogue[1]}
    unknown = [i for i in args.exhibit if i not in known]
    if unknown:
        raise UsageError(f"unknown exhibit {', '.join(unknown)}; known: {', '.join(sorted(known)) or '(none)'}")
    families = {e.family for e in args.catalogue[0]} | {r.family for r in args.catalogue[1]}
    if args.family is not None and args.family not in families:
        raise UsageError(f"unknown family {args.family!r}; known: {', '.join(sorted(families))}")
    args.runs, args.out = output_dir(args.runs), output_file(args.out)
    return args


def selected(args: argparse.Namespace) -> tuple[list[Exhibit], list[VersionRun]]:
    exhibits, runs = args.catalogue
    if args.family:
        exhibits = [e for e in exhibits if e.family == args.family]
        runs = [r for r in runs if r.family == args.family]
    if args.exhibit:
        exhibits = [e for e in exhibits if e.id in args.exhibit]
        runs = [r for r in runs if render.slug(r) in args.exhibit]
    return exhibits, runs


def list_catalogue(args: argparse.Namespace) -> int:
    exhibits, runs = args.catalogue
    for e in exhibits:
        built = [v for v in (e.buggy, e.fixed) if v and (venvs.venv_path(e.package, v) / venvs.MARKER).exists()]
        print(f"{e.id}  [{e.family}] {e.title} ({e.source}); buggy {e.buggy}, fixed {e.fixed or '(none)'}; "
              f"built: {', '.join(built) or 'none'}")
    for r in runs:
        print(f"{render.slug(r)}  [{r.family}] {r.title}: {', '.join(r.versions)}")
    return 0


def work(args: argparse.Namespace) -> int:
    if args.list:
        return list_catalogue(args)
    exhibits, runs = selected(args)
    if not args.render_only:
        for e in exhibits:
            for version in (e.buggy, e.fixed):
                if version:
                    print(f"museum: {e.id} on {e.package.name} {version}", flush=True)
                    run_release(e.package, version, e.args, e.seed, Path(args.runs) / e.id / version,
                                timeout=args.run_timeout, rebuild=args.rebuild)
        for r in runs:
            for version in r.versions:
                print(f"museum: {r.title} on {r.package.name} {version}", flush=True)
                run_release(r.package, version, r.args, r.seed, Path(args.runs) / render.slug(r) / version,
                            timeout=args.run_timeout, rebuild=args.rebuild)
    page, judged = render.page(*args.catalogue, Path(args.runs), release_outcome)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(page)
    print(f"museum: wrote {args.out}")
    ok = all(judged[e.id].good for e in exhibits if e.id in judged)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("kvparity museum", parse_args, work, argv)
