"""The fault zoo with and without logprob_parity, side by side (issue 29's bar).

    python benchmarks/zoo_logprob_effect.py [--seeds 0,1,2,3,4] [--calibration reports/calibration/reference.json]

Runs `kvparity fault-zoo --no-shrink` twice over the same seeds: once with every check and the reference
engine's calibration (so logprob_parity runs, with the measured epsilon), once with every check but
logprob_parity and no calibration (the token checks alone). Prints, per fault, in how many seeds each run
caught it and the median examples to the first failure, then the median of those medians: the check must
not slow the zoo down (the bar: with it, the median is at most the figure without it). The control
(no fault) runs with the calibration only, where a false logprob failure would show.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROW = re.compile(r"^\| `(?P<fault>[a-z0-9_]+)` \| [A-E] \| (?P<caught>\d+)/(?P<seeds>\d+) \| [^|]* \| (?P<median>[^|]+?) \|",
                 re.M)
CONTROL = re.compile(r"^- control \(no fault\): (?P<line>.*)$", re.M)


def zoo(args: list[str], out: Path) -> str:
    cmd = [sys.executable, "-m", "kvparity", "fault-zoo", "--no-shrink", *args, "--out", str(out)]
    subprocess.run(cmd, capture_output=True, text=True)  # exit 1 when a fault escapes: the table says which
    return out.read_text() if out.exists() else ""


def rows(report: str) -> dict[str, tuple[str, str]]:
    """fault -> ("caught/seeds", median examples to the first failure) from the zoo's Markdown table."""
    return {m["fault"]: (f"{m['caught']}/{m['seeds']}", m["median"].split(" [")[0].strip()) for m in ROW.finditer(report)}


def overall(table: dict[str, tuple[str, str]]) -> str:
    medians = [float(m) for _, m in table.values() if m.replace(".", "", 1).isdigit()]
    return f"{statistics.median(medians):g}" if medians else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--calibration", default="reports/calibration/reference.json")
    a = p.parse_args(argv)
    from conformance.checks import CHECKS

    tokens_only = ",".join(c for c in CHECKS if c != "logprob_parity")
    with tempfile.TemporaryDirectory(prefix="kvparity-zoo-logprob-") as tmp:
        with_lp = zoo(["--seeds", a.seeds, "--calibration", a.calibration], Path(tmp) / "with.md")
        without = zoo(["--seeds", a.seeds, "--checks", tokens_only, "--no-control"], Path(tmp) / "without.md")
    on, off = rows(with_lp), rows(without)
    control = CONTROL.search(with_lp)
    print(f"| fault | caught, with logprob_parity | median examples, with | caught, token checks alone | "
          f"median examples, alone |\n|---|---|---|---|---|")
    for fault in sorted(set(on) | set(off)):
        print(f"| `{fault}` | {on.get(fault, ('-', '-'))[0]} | {on.get(fault, ('-', '-'))[1]} | "
              f"{off.get(fault, ('-', '-'))[0]} | {off.get(fault, ('-', '-'))[1]} |")
    print(f"| **median of the medians** | | **{overall(on)}** | | **{overall(off)}** |")
    print(f"\nseeds {a.seeds}, `--no-shrink`; with: `--calibration {a.calibration}`; alone: `--checks` every check "
          f"but logprob_parity, no calibration. Control with the calibration: "
          f"{control['line'] if control else 'not found'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
