"""Render `kvparity bench` data into its report folder (`--out`: by default .kvparity/economics/; the
committed one is reports/economics/): report.md, report.html (links the PNGs beside it) and the plots.
It takes the collectors' plain data (`Result`s, traces, dicts) and imports no collector. All numbers come
from `conformance.economics`; matplotlib (Agg) is imported lazily (`plots`)."""

from __future__ import annotations

import html
import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs

from kvparity.commands.bench.plots import plot_acceptance, plot_budget, plot_chunks, plot_demo, plot_speedups
from conformance import economics as ec

Block = tuple  # ("h2", text) | ("p", text) | ("table", headers, rows) | ("img", file, caption)


def fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.2f}"


# -- machine and versions -------------------------------------------------------------------------------
def environment() -> list[tuple[str, str]]:
    import torch

    rows = [("machine", f"{platform.machine()}, {os.cpu_count()} CPU cores visible (a shared 2-core CPU: other "
                        f"work ran at the same time), {platform.system()} {platform.release()}"),
            ("python", platform.python_version()), ("torch", f"{torch.__version__} (1 thread)")]
    try:
        import transformers

        rows.append(("transformers", transformers.__version__))
    except ImportError:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        rows.append(("kvparity commit", rev or "unknown"))
    except (OSError, subprocess.SubprocessError):
        pass
    rows.append(("generated", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    return rows


# -- sections -------------------------------------------------------------------------------------------
def cost_model_prose(model: ec.CostModel) -> str:
    return (f"**Cost units.** A target forward pass over *n* tokens costs {model.fixed:g} + {model.per_token:g}·*n* "
            f"units: a fixed part paid once per pass (reading the weights, launching the step) and a part that "
            f"grows with the tokens fed. A plain decode step feeds one token and so costs "
            f"{model.target_pass(1):g}. A token proposed by the draft model costs {model.per_draft:g} units "
            f"(c = {model.c:.2f} of a plain step); n-gram prompt lookup runs no model, so its proposals are free. "
            f"A verification of k proposals costs {model.fixed:g} + {model.per_token:g}·(k+1) plus the "
            f"proposals, and commits the accepted prefix plus the target's own token. Where a pass serves "
            f"several sequences its fixed part is split among them. The engine's own cost clock (target "
            f"token-forwards) is this model with a zero fixed part.")


def summary(data: dict) -> list[str]:
    """The headline numbers, computed from the same data as the sections below."""
    model: ec.CostModel = data["cost_model"]
    wl, out = data["workloads"], []
    reuse = ", ".join(f"{n} {ec.reuse_ratio(by['none']['results']).value:.2f}" for n, by in wl.items())
    out.append(f"Reuse ratio Σ Lhit / Σ Lin: {reuse}.")
    for drafter in data["drafters"][1:]:
        m = model if drafter == "draft" else model.with_draft(0.0)
        parts = []
        for n, by in wl.items():
            acc = ec.acceptance(by[drafter]["results"])
            _, units = ec.speedup(ec.cost_per_token(by["none"]["results"], model),
                                  ec.cost_per_token(by[drafter]["results"], m))
            parts.append(f"{n} α {acc.alpha:.2f} → {fmt(units)}×")
        out.append(f"Speculation with {drafter} (k = {data['k']}), speedup in cost units: {'; '.join(parts)}.")
    demo = data.get("demo")
    if demo and demo.get("found"):
        costs = [fmt(ec.decode_cost(r, model if "draft" in name else model.with_draft(0.0)), 0)
                 for name, r in demo["results"].items()]
        out.append(f"The same three committed tokens on the engine: plain {costs[0]}, n-gram k=5 {costs[1]}, draft "
                   f"model k=5 {costs[2]} units, both at α = 0.40.")
    rows = data.get("chunks") or []
    if rows:
        a, b = rows[0], rows[-1]
        out.append(f"Chunked prefill: chunk {a['chunk']} vs whole prompt ({b['chunk']}): decode gap p50 "
                   f"{fmt(a['p50_units'], 0)} vs {fmt(b['p50_units'], 0)} units ({ms(a['p50_s'])} vs {ms(b['p50_s'])} "
                   f"ms), long-prompt TTFT {ms(a['ttft_s'])} vs {ms(b['ttft_s'])} ms, completion "
                   f"{fmt(a['total_units'], 0)} vs {fmt(b['total_units'], 0)} units.")
    return out


def workload_sections(data: dict, out: Path, blocks: list[Block]) -> None:
    model: ec.CostModel = data["cost_model"]
    wl = data["workloads"]
    blocks.append(("h2", "1. Workload mixes and prefix reuse"))
    blocks.append(("p", "Each workload is one request stream, replayed unchanged under each drafter. *shared "
                        "system prompt*: one 64-token system prompt, each user adds a short question, one arrival "
                        "every few steps; *multi-turn chat*: each turn resends the whole conversation (prompt + "
                        "answer) plus a new message when the previous turn finishes; *no sharing*: unrelated "
                        "held-out snippets. Reuse ratio = Σ Lhit / Σ Lin (token-weighted, block size 16, "
                        "a hit is capped at Lin − 1)."))
    rows = []
    for name, by in wl.items():
        res = by["none"]["results"]
        r = ec.reuse_ratio(res)
        rows.append([name, len(res), int(r.den), int(r.num), fmt(r.value, 3)])
    blocks.append(("table", ["workload", "requests", "Σ Lin", "Σ Lhit", "reuse ratio"], rows))

    blocks.append(("h2", "2. Latency budget: queueing + prefill (= TTFT) + decode ((n−1)·TPOT)"))
    blocks.append(("p", "Queueing: arrival → first scheduled (max_batch is small, so later arrivals wait). "
                        "Prefill: first scheduled → first token. Decode: the rest. Plain decoding (no drafter). "
                        "Wall times in milliseconds; cost in the units above."))
    rows = []
    for name, by in wl.items():
        for unit in ("s", "cost"):
            b = ec.latency_budget(by["none"]["results"], unit)
            f = ms if unit == "s" else (lambda v: fmt(v, 1))
            rows.append([name, "ms" if unit == "s" else "units",
                         f"{f(b.queue.p50)} / {f(b.queue.p99)}", f"{f(b.prefill.p50)} / {f(b.prefill.p99)}",
                         f"{f(b.decode.p50)} / {f(b.decode.p99)}", f"{f(b.ttft.p50)} / {f(b.ttft.p90)} / {f(b.ttft.p99)}",
                         f"{f(b.tpot.p50)} / {f(b.tpot.p90)} / {f(b.tpot.p99)}"])
    blocks.append(("table", ["workload", "unit", "queue p50/p99", "prefill p50/p99", "decode p50/p99",
                             "TTFT p50/p90/p99", "TPOT p50/p90/p99"], rows))
    blocks.append(("img", plot_budget(wl, out), "Median latency budget per workload (left: wall ms, right: cost "
                                                "units) and the TTFT / TPOT distributions."))

    blocks.append(("h2", "3. Speculation: acceptance, tokens per verification, cost per committed token"))
    c_wall_note = "" if data.get("c_wall") is None else f" (draft {data['c_wall']:.2f})"
    blocks.append(("p", f"k = {data['k']}. α = Σ accepted / Σ proposed; per position i: accepted at i / proposed "
                        f"at i (a draft at position i counts as accepted only if all before it were). Cost per "
                        f"committed decode token (tokens after the first) with and without speculation. Predicted "
                        f"speedup: the formula (1−α^(k+1))/((1−α)(k·c+1)), with c in cost units "
                        f"(draft {model.c:.2f}, n-gram 0) and with c measured in wall time"
                        f"{c_wall_note}"
                        f"; k in the predictions is the mean number of proposals per verification (n-gram lookup often "
                        f"finds fewer than k, and a decode step with no proposal is a plain step); the formula prices "
                        f"a verification like one plain step (oracle, the test drafter that proposes the target's own "
                        f"tokens with free proposals, is the ceiling; its α is below 1 only because a run cut by "
                        f"max_tokens counts only the tokens kept; its wall columns are left out, as its proposals "
                        f"replay a baseline run it computes itself), the cost model prices it "
                        f"{model.fixed:g} + (k+1), so a cost-model prediction is shown too. Both predictions "
                        f"are for batch 1; in the batched workloads (max_batch {data.get('max_batch', 4)}) plain "
                        f"decoding already shares each pass's fixed part among the batch, so speculation gains "
                        f"less than predicted — the *no sharing, batch 1* rows run the same stream one request "
                        f"at a time. The formula's α is an independent per-position acceptance probability; Σ accepted / "
                        f"Σ proposed is not that (a rejection ends the run, and acceptance falls with position), so "
                        f"the tokens per verification it implies (in brackets) understate the measured ones when "
                        f"acceptance is front-loaded — one reason measured and predicted differ."))
    rows, per_pos, speedups, tkv = [], {}, [], []
    for name, by in wl.items():
        plain = ec.cost_per_token(by["none"]["results"], model)
        for drafter in data["drafters"][1:]:
            res = by[drafter]["results"]
            m = model if drafter == "draft" else model.with_draft(0.0)
            acc = ec.acceptance(res)
            spec = ec.cost_per_token(res, m)
            s_wall, s_units = ec.speedup(plain, spec)
            alpha = acc.alpha or 0.0
            # n-gram lookup often finds fewer than k tokens: predict with the proposals actually made
            k = acc.proposed / acc.verifications if acc.verifications else data["k"]
            c_wall = (data.get("c_wall") or 0.0) if drafter == "draft" else 0.0
            pred_u = ec.predicted_speedup(alpha, k, m.c)
            pred_w = ec.predicted_speedup(alpha, k, c_wall)
            tokens = (k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
            pred_cm = tokens / (m.verification(k) / m.target_pass(1))
            per_pos[(name, drafter)] = acc.alpha_per_position
            short = name.split()[0].rstrip(",") + (" b1" if name.endswith("batch 1") else "")
            speedups.append((f"{short}\n{drafter}", s_units, pred_cm, pred_u, s_wall, pred_w))
            label = "oracle (ceiling)" if drafter == "oracle" else drafter
            if drafter == "oracle":  # its proposals replay a baseline run it computes: wall time is not its cost
                spec, s_wall, pred_w = attrs.evolve(spec, seconds=None), None, None
            rows.append([name, label, fmt(k, 2), fmt(acc.alpha, 3), " ".join(fmt(a, 2) for a in acc.alpha_per_position),
                         f"{fmt(acc.committed_per_verification)} ({fmt(tokens)})", f"{fmt(plain.units_per_token)} → {fmt(spec.units_per_token)}",
                         f"{ms(plain.s_per_token)} → {ms(spec.s_per_token)}", fmt(s_units), fmt(pred_cm), fmt(pred_u),
                         fmt(s_wall), fmt(pred_w)])
            t = ec.temporary_kv(res, by[drafter]["trace"])
            tkv.append([name, label, t.allocated, t.freed, t.promoted, t.peak])
    blocks.append(("table", ["workload", "drafter", "k used", "α", "α per position", "tokens / verification (from α)",
                             "units / token (plain → spec)", "ms / token (plain → spec)", "speedup units",
                             "predicted (cost model)", "predicted (formula, c units)", "speedup wall",
                             "predicted (formula, c wall)"], rows))
    blocks.append(("img", plot_acceptance(per_pos, out), "Acceptance per draft position."))
    blocks.append(("img", plot_speedups(speedups, out), "Measured vs predicted speedup, cost units and wall time."))

    blocks.append(("h2", "4. Temporary KV for rejected branches"))
    blocks.append(("p", "Draft positions need KV while they are verified: the scheduler reserves provisional "
                        "blocks for them, verification keeps the blocks accepted tokens filled (promoted) and "
                        "frees the rest. Peak = most provisional blocks held at once (they live within one step)."))
    blocks.append(("table", ["workload", "drafter", "allocated", "freed (rejected)", "promoted", "peak"], tkv))


def demo_section(data: dict, out: Path, blocks: list[Block]) -> None:
    model: ec.CostModel = data["cost_model"]
    blocks.append(("h2", "5. Acceptance is not the bill: 12 / 9 / 18"))
    w = ec.worked_example(model.with_draft(0.0), model.per_draft)
    blocks.append(("p", f"Three plain decode tokens cost 3 × {model.target_pass(1):g} = {w['plain']['cost']:g}. "
                        f"Propose 5 and verify them in one pass of 6 tokens: if 2 are accepted, the target's own "
                        f"token follows and the same three tokens are committed for {model.target_pass(6):g} "
                        f"units of target work. With free n-gram proposals that is {w['cheap']['cost']:g} "
                        f"(cheaper than plain although 3 of 5 drafts were wrong); with draft-model proposals at "
                        f"{model.per_draft:g} each it is {w['dear']['cost']:g} — dearer than plain, at the same "
                        f"acceptance α = {w['dear']['alpha']:.1f}. Acceptance says nothing about what proposing "
                        f"and verifying cost."))
    demo = data.get("demo")
    if demo is None:
        blocks.append(("p", "*Engine demonstration skipped: the tiny-draft checkpoint is not present.*"))
        return
    if not demo["found"]:
        blocks.append(("p", f"*No held-out prompt among {demo['searched']} tried had both drafters accept exactly "
                            f"2 of 5; only the arithmetic above is shown.*"))
        return
    blocks.append(("p", f"**On the reference engine.** Searching held-out text ({demo['tried']} prompts tried) "
                        f"for a prompt where, after the first token, n-gram lookup and the tiny draft model both "
                        f"propose 5 tokens of which exactly the first 2 are the target's: a {demo['prompt_len']}-token "
                        f"prompt; target output {demo['output']}, n-gram proposed {demo['ngram']}, draft proposed "
                        f"{demo['draft']}. Each configuration runs it with max_tokens 4 (1 token from prefill + 3 "
                        f"decode tokens); the decode phase is priced from what the engine did (wall: median of 7 runs)."))
    rows, bars = [], []
    for name, r in demo["results"].items():
        m = model if "draft" in name else model.with_draft(0.0)
        units = ec.decode_cost(r, m)
        wall = r.timings.get("tpot_s")
        acc = ec.acceptance([r]) if r.draft_proposed else None
        rows.append([name, list(r.output), r.draft_proposed or 0, r.draft_accepted or 0,
                     fmt(acc.alpha, 2) if acc else "–", fmt(r.extra["decode_passes"], 0), r.extra["decode_forwards"],
                     fmt(m.per_draft * (r.draft_proposed or 0), 1), fmt(units, 1),
                     ms(None if wall is None else wall * (len(r.output) - 1))])
        bars.append((name, units))
    blocks.append(("table", ["configuration", "output", "proposed", "accepted", "α", "decode passes",
                             "tokens fed", "proposal units", "decode units", "decode wall ms"], rows))
    blocks.append(("img", plot_demo(bars, out), "The same three committed tokens, priced."))


def chunk_section(data: dict, out: Path, blocks: list[Block]) -> None:
    rows = data["chunks"]
    blocks.append(("h2", "6. Chunked prefill: interference vs efficiency"))
    blocks.append(("p", "A few requests are decoding when one long prompt arrives. Per chunk size (the last row is "
                        "the whole prompt in one pass): the decoding requests' inter-token gaps while the long "
                        "prompt is prefilled (p50 / p99), the long request's TTFT, and the completion time of the "
                        "whole batch. Small chunks keep decodes flowing but need more passes, each paying the "
                        "fixed cost: chunking trades throughput for smoothness and does not make every workload "
                        "faster. Wall numbers are the median of the repetitions."))
    blocks.append(("table", ["chunk", "passes", "gap p50 ms", "gap p99 ms", "gap p50 units", "gap p99 units",
                             "long TTFT ms", "completion ms", "completion units"],
                   [[("whole " if r["whole"] else "") + str(r["chunk"]), r["passes"], ms(r["p50_s"]), ms(r["p99_s"]),
                     fmt(r["p50_units"], 1), fmt(r["p99_units"], 1), ms(r["ttft_s"]), ms(r["total_s"]),
                     fmt(r["total_units"], 0)] for r in rows]))
    blocks.append(("img", plot_chunks(rows, out), "Inter-token gap of concurrent decodes during a long prefill "
                                                  "(left) and completion time (right) against chunk size."))


def transformers_sections(data: dict, out: Path, blocks: list[Block]) -> None:
    """`--engine transformers`: reuse and batch-1 speculation, wall time only (what transformers exposes)."""
    blocks.append(("h2", "1. Workload mixes and prefix reuse (generate_batch, observed hits)"))
    rows = []
    for name, res in data["workloads"].items():
        r = ec.reuse_ratio(res)
        rows.append([name, len(res), int(r.den), int(r.num), fmt(r.value, 3)])
    blocks.append(("table", ["workload", "requests", "Σ Lin", "Σ Lhit", "reuse ratio"], rows))
    blocks.append(("p", "Shared-system requests are sent in waves of a few (the manager and its paged cache persist "
                        "between calls); each chat turn is one batch. transformers reports no TTFT / TPOT, no "
                        "queueing and no per-token times, so there is no latency budget or chunked-prefill sweep "
                        "for this engine."))
    blocks.append(("h2", "2. Speculation at batch 1 (wall time only)"))
    k = data["k"]
    plain = data["spec"]["generate"]
    plain_tok = sum(len(r.output) for r in plain)
    plain_s = sum(r.timings["total_s"] for r in plain) / plain_tok
    rows = []
    for mode, res in data["spec"].items():
        if mode == "generate":
            continue
        acc = ec.acceptance(res)
        s_tok = sum(r.timings["total_s"] for r in res) / sum(len(r.output) for r in res)
        c = (data.get("c_wall") or 0.0) if mode == "assisted" else 0.0
        alpha = acc.alpha or 0.0
        rows.append([mode, fmt(alpha, 3), fmt(acc.committed_per_verification), f"{ms(plain_s)} → {ms(s_tok)}",
                     fmt(plain_s / s_tok), fmt(ec.predicted_speedup(alpha, k, c))])
    blocks.append(("table", ["mode", "α", "tokens / verification", "ms / token (generate → mode)",
                             "speedup wall", "predicted (formula, c wall)"], rows))
    blocks.append(("p", f"k = {k}; ms / token is whole-call time (prefill included) over output tokens. c for "
                        f"the draft is measured on the reference implementation of the same weights "
                        f"({fmt(data.get('c_wall'))}). Per-position acceptance and temporary KV are not observable."))


# -- rendering ------------------------------------------------------------------------------------------
def to_markdown(blocks: list[Block]) -> str:
    lines = []
    for b in blocks:
        if b[0] in ("h1", "h2"):
            lines += [("# " if b[0] == "h1" else "## ") + b[1], ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "table":
            lines.append("| " + " | ".join(b[1]) + " |")
            lines.append("|" + "---|" * len(b[1]))
            lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in b[2]]
            lines.append("")
        elif b[0] == "ul":
            lines += [f"- {item}" for item in b[1]] + [""]
        elif b[0] == "img":
            lines += [f"![{b[2]}]({b[1]})", "", f"*{b[2]}*", ""]
    return "\n".join(lines)


def _inline(text: str) -> str:
    import re

    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"\*(.+?)\*", r"<i>\1</i>", t)


def to_html(blocks: list[Block], title: str) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
             "body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.45}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px}"
             "th{background:#f3f3f3}img{max-width:100%}figcaption{font-style:italic;color:#555}</style></head><body>"]
    for b in blocks:
        if b[0] in ("h1", "h2"):
            parts.append(f"<{b[0]}>{html.escape(b[1])}</{b[0]}>")
        elif b[0] == "p":
            parts.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "table":
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b[1]) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in b[2]]
            parts.append("</table>")
        elif b[0] == "ul":
            parts.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in b[1]) + "</ul>")
        elif b[0] == "img":
            parts.append(f"<figure><img src='{html.escape(b[1])}' alt='{html.escape(b[2])}'>"
                         f"<figcaption>{html.escape(b[2])}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(data: dict, out_dir: str | os.PathLike) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"kvparity economics — {data['engine']} engine ({data['size']} size)"
    blocks: list[Block] = [("h1", title),
                           ("p", "Absolute times below are from a shared 2-core CPU with other work running: they "
                                 "are noisy. Compare ratios (speedups, reuse, gap shapes), and prefer the cost-unit "
                                 "columns, which are deterministic."),
                           ("table", ["", ""], environment() + [("bench wall time", f"{data['elapsed_s']:.0f} s")]),
                           ("p", cost_model_prose(data["cost_model"]))]
    if data["engine"] == "reference":
        blocks += [("h2", "Summary"), ("ul", summary(data))]
        workload_sections(data, out, blocks)
        demo_section(data, out, blocks)
        chunk_section(data, out, blocks)
    else:
        transformers_sections(data, out, blocks)
    (out / "report.md").write_text(to_markdown(blocks))
    (out / "report.html").write_text(to_html(blocks, title))
    return [out / "report.md", out / "report.html"] + sorted(out.glob("*.png"))
