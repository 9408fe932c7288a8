"""The economics report's plots (matplotlib, Agg backend, imported lazily): one function per figure, each
saving a PNG into the report folder and returning its file name."""

from __future__ import annotations

from pathlib import Path

from conformance import economics as ec


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_budget(wl: dict, out: Path) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = list(wl)
    for ax, unit, scale in ((axes[0], "s", 1e3), (axes[1], "cost", 1.0)):
        bottom = [0.0] * len(names)
        for part, color in (("queue", "#9e9e9e"), ("prefill", "#1e88e5"), ("decode", "#43a047")):
            vals = [(ec.latency_budget(wl[n]["none"]["results"], unit).medians()[part] or 0.0) * scale for n in names]
            ax.bar(names, vals, bottom=bottom, label=part, color=color)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("ms (median)" if unit == "s" else "cost units (median)")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=8)
    data, labels = [], []
    for n in names:
        res = wl[n]["none"]["results"]
        data += [[r.timings["ttft_s"] * 1e3 for r in res if "ttft_s" in r.timings],
                 [r.timings["tpot_s"] * 1e3 for r in res if "tpot_s" in r.timings]]
        labels += [f"TTFT\n{n.split()[0]}", f"TPOT\n{n.split()[0]}"]
    axes[2].boxplot(data)
    axes[2].set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    axes[2].set_yscale("log")
    axes[2].set_ylabel("ms")
    fig.tight_layout()
    return _save(fig, out, "latency_budget.png")


def plot_acceptance(per_pos: dict, out: Path) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, drafter), alphas in per_pos.items():
        ax.plot(range(1, len(alphas) + 1), [a if a is not None else float("nan") for a in alphas], marker="o",
                label=f"{drafter} · {name}", linestyle="-" if drafter == "draft" else "--")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out, "acceptance_per_position.png")


def plot_speedups(rows: list, out: Path) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    x = range(len(rows))
    w = 0.27
    for i, (lab, col) in enumerate(((("measured", 1), ("predicted: cost model", 2), ("predicted: formula", 3)))):
        axes[0].bar([j + (i - 1) * w for j in x], [r[col] or 0 for r in rows], w, label=lab)
    for i, (lab, col) in enumerate((("measured", 4), ("predicted: formula", 5))):
        axes[1].bar([j + (i - 0.5) * w for j in x], [0 if "oracle" in r[0] else (r[col] or 0) for r in rows], w,
                    label=lab)  # the oracle's wall time includes the baseline it replays: not shown
    for ax, title in ((axes[0], "cost units"), (axes[1], "wall time")):
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(x), [r[0] for r in rows], fontsize=7, rotation=60)
        ax.set_ylabel("speedup vs plain")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "speedup.png")


def plot_demo(bars: list, out: Path) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=["#9e9e9e", "#43a047", "#e53935"][:len(bars)])
    for i, (_, v) in enumerate(bars):
        ax.text(i, v, f"{v:g}", ha="center", va="bottom")
    ax.set_ylabel("cost units for 3 committed tokens")
    fig.tight_layout()
    return _save(fig, out, "worked_12_9_18.png")


def plot_chunks(rows: list, out: Path) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    xs = [r["chunk"] for r in rows]
    axes[0].plot(xs, [r["p50_s"] * 1e3 for r in rows], marker="o", label="gap p50 (ms)")
    axes[0].plot(xs, [r["p99_s"] * 1e3 for r in rows], marker="o", label="gap p99 (ms)")
    ax2 = axes[0].twinx()
    ax2.plot(xs, [r["p99_units"] for r in rows], marker="x", color="grey", linestyle=":", label="gap p99 (units)")
    ax2.set_ylabel("cost units")
    axes[0].set_ylabel("inter-token gap, ms")
    axes[0].legend(fontsize=8, loc="upper left")
    ax2.legend(fontsize=8, loc="lower right")
    axes[1].plot(xs, [r["total_s"] * 1e3 for r in rows], marker="o", label="completion (ms)")
    axes[1].plot(xs, [r["ttft_s"] * 1e3 for r in rows], marker="s", label="long prompt TTFT (ms)")
    ax3 = axes[1].twinx()
    ax3.plot(xs, [r["total_units"] for r in rows], marker="x", color="grey", linestyle=":", label="completion (units)")
    ax3.set_ylabel("cost units")
    axes[1].set_ylabel("ms")
    axes[1].legend(fontsize=8, loc="upper left")
    ax3.legend(fontsize=8, loc="lower right")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("chunk size (tokens; rightmost = whole prompt)")
    fig.tight_layout()
    return _save(fig, out, "chunked_prefill.png")


def _save(fig, out: Path, name: str) -> str:
    fig.savefig(out / name, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name
