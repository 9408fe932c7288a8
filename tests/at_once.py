"""Two processes doing the same thing at the same moments: how a campaign's shards meet on a shared cache.

`twice_at_once(body, folder, rounds, spacing_s)` runs `body` (Python source using `out`, a folder, and `r`,
the round) in two processes, `rounds` times each, round r of both starting together: the processes wait for
each other on a file barrier in `folder` once both are imported (no fixed delay, whatever the load), then
start each round at the same wall-clock offset. Returns the processes' exit codes and standard errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_HARNESS = """
import sys, time
from pathlib import Path
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"ready-{{sys.argv[2]}}").touch()
while len(list(out.glob("ready-*"))) < 2:
    time.sleep(0.01)
start = max(p.stat().st_mtime for p in out.glob("ready-*")) + 0.2
for r in range({rounds}):
    while time.time() < start + r * {spacing_s}:
        pass
{body}
"""


def twice_at_once(body: str, folder: Path, rounds: int, spacing_s: float) -> tuple[list[int], list[str]]:
    script = _HARNESS.format(rounds=rounds, spacing_s=spacing_s,
                             body="\n".join("    " + line for line in body.strip().splitlines()))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(folder), str(k)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for k in range(2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    return [p.returncode for p in procs], errors
