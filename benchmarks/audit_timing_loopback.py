"""The timing audit's figures on loopback (reports/audit-timing/): `kvparity audit-timing` against
`kvparity serve --cache-scope global` (must detect cross-tenant sharing, p < 1e-8 in <= 500 probes) and
against `--cache-scope tenant` N times (must never detect it; the same-user level is the positive
control), and optionally against vLLM's OpenAI server (`--vllm`: the server from .venv-vllm, audited
without cache_salt and with different salts).

    python benchmarks/audit_timing_loopback.py --out reports/audit-timing [--runs 10] [--letters 800] [--vllm]

Each audit is the real command (`python -m kvparity.commands.audit_timing`) against a real server process
on a free 127.0.0.1 port; each writes its own folder (report.md, results.json, ttft.png) and this script
writes summary.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapters.openai_http.server import ServerProcess, kvparity_command, vllm_command, vllm_env  # noqa: E402
from adapters.openai_http.transport import free_port  # noqa: E402


def start_kvparity(scope: str) -> tuple[ServerProcess, str]:
    port = free_port()
    server = ServerProcess(f"kvparity-{scope}", kvparity_command(port=port, block_size=16, scope=scope, fault=None,
                                                                 knobs={}))
    return server, server.wait_healthy(f"http://127.0.0.1:{port}", "/health", 300)


def start_vllm() -> tuple[ServerProcess, str]:
    from reference_engine import checkpoints

    port = free_port()
    # block 32: vLLM's CPU attention takes multiples of 32 only
    cmd = vllm_command(folder=str(checkpoints.revision_dir("a")), port=port, block_size=32, max_context=1024,
                       loras={}, budget=None, spec="none", k=1, draft_folder="")
    cmd[0] = str(ROOT / ".venv-vllm" / "bin" / "python")
    server = ServerProcess("vllm", cmd, vllm_env())
    return server, server.wait_healthy(f"http://127.0.0.1:{port}", "/health", 900)


def audit(url: str, out: pathlib.Path, *args: str) -> dict:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "kvparity.commands.audit_timing", "--base-url", url, "--out", str(out),
                        *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode == 3 or not (out / "results.json").exists():
        raise SystemExit(f"audit failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    data = json.loads((out / "results.json").read_text())
    print(p.stdout.strip().splitlines()[-1], flush=True)
    return {"folder": out.name, "args": list(args), "exit": p.returncode, "wall_s": round(wall, 1),
            "cost": data["cost"], "levels": {row["level"]: {k: row[k] for k in
                                                            ("verdict", "pvalue", "statistic", "probes", "hit_median_ms",
                                                             "miss_median_ms", "stopped")}
                                              for row in data["levels"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".kvparity/audit-timing-loopback")
    ap.add_argument("--runs", type=int, default=10, help="audits of the tenant-scope server")
    ap.add_argument("--letters", default="400")
    ap.add_argument("--vllm", action="store_true", help="also audit vLLM's OpenAI server (.venv-vllm)")
    ap.add_argument("--skip-kvparity", action="store_true")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip()
    summary["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    seq = ["--sequential", "--letters", a.letters]
    if not a.skip_kvparity:
        server, url = start_kvparity("global")
        try:
            summary["global"] = [audit(url, out / "global", *seq, "--seed", "1"),
                                 audit(url, out / "global-share95-repeats5", *seq, "--share", "0.95",
                                       "--victim-repeats", "5", "--seed", "2"),
                                 audit(url, out / "global-fixed-250+250", "--letters", a.letters,
                                       "--levels", "cross-tenant", "--seed", "3")]
        finally:
            server.stop()
        server, url = start_kvparity("tenant")
        try:
            summary["tenant"] = [audit(url, out / ("tenant" if i == 0 else f"tenant-runs/run-{i + 1:02d}"), *seq,
                                       "--levels", "same-user,same-org,cross-tenant" if i == 0 else "same-user,cross-tenant",
                                       "--seed", str(100 + i))
                                 for i in range(a.runs)]
        finally:
            server.stop()
        tenant = summary["tenant"]
        summary["tenant_false_detections"] = sum(r["levels"]["cross-tenant"]["verdict"] == "sharing detected"
                                                 for r in tenant)
        summary["tenant_control_detected"] = sum(r["levels"]["same-user"]["verdict"] == "sharing detected"
                                                 for r in tenant)
    if a.vllm:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        server, url = start_vllm()
        try:
            summary["vllm"] = [audit(url, out / "vllm-no-salt", *seq, "--no-salt", "--levels", "same-user,same-org",
                                     "--seed", "200"),
                               audit(url, out / "vllm-salted", *seq, "--levels", "same-user,cross-tenant",
                                     "--seed", "201")]
        finally:
            server.stop()
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if "false" in k or "control" in k}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
