"""What an audit writes: results.json (every TTFT, every look), report.md (the verdict per level, cost)
and ttft.png (hit vs miss TTFT distributions per level, as empirical CDFs on a log axis — the picture
the KS statistic is read from: its value is the largest vertical gap between the two curves)."""

from __future__ import annotations

import json
import pathlib
import statistics
from typing import Any, Sequence

from kvparity.commands.audit_timing.client import Client
from kvparity.commands.audit_timing.procedure import LevelResult, Procedure


def _ms(xs: Sequence[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs) * 1e3:.1f}"


def summary(levels: Sequence[LevelResult]) -> list[dict[str, Any]]:
    rows = []
    for r in levels:
        t = r.final
        rows.append({"level": r.level, "verdict": r.verdict, "pvalue": t.pvalue, "statistic": t.statistic,
                     "alpha_per_look": r.plan.alpha_per_look, "looks": len(r.looks), "probes": r.probes,
                     "hits": len(r.hits), "misses": len(r.misses), "stopped": r.stopped,
                     "hit_median_ms": statistics.median(r.hits) * 1e3 if r.hits else None,
                     "miss_median_ms": statistics.median(r.misses) * 1e3 if r.misses else None})
    return rows


def write(out: pathlib.Path, *, target: str, version: str, levels: Sequence[LevelResult], procedure: Procedure,
          client: Client, seed: int, elapsed_s: float, exit_code: int, conclusion: str,
          plot: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = summary(levels)
    data = {"target": target, "server_version": version, "seed": seed, "elapsed_s": elapsed_s,
            "procedure": {"letters": procedure.letters, "share": procedure.share,
                          "victim_repeats": procedure.victim_repeats},
            "cost": {"requests": client.requests, "prompt_tokens": client.prompt_tokens,
                     "completion_tokens": client.completion_tokens, "requests_without_usage": client.unreported},
            "levels": rows, "exit_code": exit_code, "conclusion": conclusion,
            "ttft_s": {r.level: {"hit": r.hits, "miss": r.misses} for r in levels},
            "looks": {r.level: [{"hits": t.hits, "misses": t.misses, "statistic": t.statistic, "pvalue": t.pvalue}
                                for t in r.looks] for r in levels}}
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [f"# Timing audit of {target}", "",
             f"Server: {version}. Procedure: prompts of {procedure.letters} random letters, victim sends its prompt "
             f"{procedure.victim_repeats}×, attacker prompt shares {procedure.share:.0%} of it, `max_tokens=1`, "
             f"client-side TTFT; one-sided two-sample KS test (hits faster), α = {levels[0].plan.alpha:g}"
             + (f", sequential: up to {levels[0].plan.looks} looks at α/{levels[0].plan.looks} each" if levels[0].plan.sequential else "")
             + f". Seed {seed}.", "",
             "| level | verdict | p-value | KS D | probes (hit + miss) | median TTFT hit / miss (ms) | stopped |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r, row in zip(levels, rows):
        lines.append(f"| {r.level} | **{r.verdict}** | {row['pvalue']:.3g} | {row['statistic']:.3f} | "
                     f"{r.probes} ({len(r.hits)} + {len(r.misses)}) | {_ms(r.hits)} / {_ms(r.misses)} | {r.stopped} |")
    cost = (f"{client.requests} requests, {client.prompt_tokens} prompt + {client.completion_tokens} completion tokens"
            + (f" ({client.unreported} answers gave no usage)" if client.unreported else ""))
    lines += ["", f"Cost: {cost}; {elapsed_s:.1f} s.", "", f"**{conclusion}** (exit {exit_code})", ""]
    if plot:
        _plot(out / "ttft.png", levels, target)
        lines += ["![TTFT distributions](ttft.png)", ""]
    (out / "report.md").write_text("\n".join(lines))


def _plot(path: pathlib.Path, levels: Sequence[LevelResult], target: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.4), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], levels):
        for xs, label, color in ((r.hits, "hit procedure", "tab:red"), (r.misses, "miss procedure", "tab:blue")):
            if xs:
                ms = sorted(x * 1e3 for x in xs)
                ax.step(ms, [(i + 1) / len(ms) for i in range(len(ms))], where="post", label=f"{label} (n={len(ms)})",
                        color=color)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: minor labels overlap
        ax.set_title(f"{r.level}: {r.verdict}\np = {r.final.pvalue:.2g}", fontsize=9)
        ax.set_xlabel("client-side TTFT (ms)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of probes ≤ x")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(target, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replot(folder: pathlib.Path) -> None:
    """Redraw `ttft.png` of an audit folder from its results.json (the same data, e.g. after a plot fix)."""
    from types import SimpleNamespace

    data = json.loads((folder / "results.json").read_text())
    levels = [SimpleNamespace(level=row["level"], verdict=row["verdict"], final=SimpleNamespace(pvalue=row["pvalue"]),
                              hits=data["ttft_s"][row["level"]]["hit"], misses=data["ttft_s"][row["level"]]["miss"])
              for row in data["levels"]]
    _plot(folder / "ttft.png", levels, data["target"])
