"""`kvparity export WITNESS.json --out FILE.py [--engine NAME|module:Class] [--minimal]`: a standalone
reproducer of a witness for the engine's own API, which does not import kvparity (for a `module:Class`
adapter, kvparity/commands/export/adapter.py: it imports the adapter's module); `--minimal` prints the
steps and one assertion (minimal.py).

To report a finding upstream, an engine developer should not have to install kvparity and trust its
adapter. The script this writes drives the engine the way the adapter did (one module per engine here:
`reference`, `transformers`, `vllm`, `llama_cpp`, `openai_http`, each a driver template plus what it
resolves at export time), runs the witness's steps, and checks the suite's claims with a small shared
checker (`runtime`, embedded verbatim, standard library only) against the oracle's expected tokens,
embedded as a JSON literal (`plan`). It exits 0 when every claim held, 1 with a one-line diff when the
engine still misbehaves, 3 when the case could not be run.

Nothing in the witness is executed or chooses code: it may name a registered engine only (as for
`kvparity replay`), and its values reach the script as JSON data.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from kvparity.commands.export.quoting import docstring, shown, string_literal
from conformance.contract import UsageError

EXPORTERS = {name: f"kvparity.commands.export.{name}"
             for name in ("reference", "transformers", "vllm", "llama_cpp", "openai_http")}
RUNTIME = Path(__file__).with_name("runtime.py")


def exporter_for(engine: str):
    if ":" in engine:  # a user's `module:Class` adapter, driven through the Engine contract
        from kvparity.commands.export.adapter import Exporter

        return Exporter(engine)
    if engine not in EXPORTERS:
        raise UsageError(f"no reproducer exporter for engine {engine!r}; known: {', '.join(EXPORTERS)}")
    return importlib.import_module(EXPORTERS[engine])


def _without_docstring(source: str) -> str:
    """A module's source minus its docstring (the script has its own)."""
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return "\n".join(source.splitlines()[first.end_lineno:]).lstrip("\n")
    return source


_NUMBERS = re.compile(r"\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]")


def _plan_literal(plan: dict) -> str:
    """The plan as a JSON string literal, a list of numbers (a prompt, an output) on one line."""
    text = _NUMBERS.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                        json.dumps(plan, indent=1))
    return f"load_plan({string_literal(text)})"  # read by json.loads: witness text stays data


def story(plan: dict) -> str:
    """The steps in a line each: what a reader should see before the JSON (witness values `shown`)."""
    lines = []
    for step in plan["steps"]:
        if step["step"] == "configure":
            lines.append("configure " + ", ".join(f"{shown(k)}={shown(v)}" for k, v in step["config"].items()))
        elif step["step"] == "reset":
            lines.append("reset (flush the prefix cache)")
        else:
            reqs = []
            for q in step["requests"]:
                ident = ", ".join(f"{k} {shown(v)}" for k, v in q["identity"].items()
                                  if v is not None and k != "adapter_digest" and not (k == "revision" and v == "a"))
                reqs.append(f"{shown(q['id'])}: {len(q['prompt'])}-token prompt, max_tokens {q['max_tokens']}"
                            + (f", stop {q['stop_ids']}" if q["stop_ids"] else "") + (f", {ident}" if ident else "")
                            + f" -> expected {q['expected']['output']}")
            lines.append(f"batch {step['index']}: " + "; ".join(reqs))
    return "".join(f"  {i + 1}. {line}\n" for i, line in enumerate(lines))


def render(plan: dict, exporter, witness: str, args: dict | None = None, out: str = "THIS_FILE") -> str:
    """The reproducer's source: a docstring saying what it is, the checker, the driver, the plan."""
    w = plan["witness"]
    title = f" — {shown(w['title'])}" if w.get("title") else ""
    text = (f"Standalone reproducer: kvparity witness {shown(w['file'])} ({shown(w['check'])}{title}) on "
            f"{shown(plan['description'].rsplit(' on ', 1)[-1].rstrip('.'))}.\n\n"
            f"Exported by `kvparity export {shown(witness)}`. It does not import kvparity: it needs\n"
            f"{exporter.NEEDS}.\n"
            f"Witness engine arguments: {json.dumps(w['engine_args'])}. Steps (from a cold cache):\n"
            f"{story(plan)}\n"
            f"Run:  python {shown(out)}   (--help lists its options)\n"
            f"Exit: 0 every output equals plain greedy decoding and every claim held; 1 the engine still\n"
            f"misbehaves (one line: the claim, the request, the first divergent position, expected vs got);\n"
            f"3 the case could not be run.\n"
            f"{exporter.how(args or {}) if hasattr(exporter, 'how') else getattr(exporter, 'HOW', '')}")
    doc = docstring(text) + "\n"  # every witness value escaped: a quote in a title cannot end it
    helpers = "".join("\n\n" + inspect.getsource(fn) for fn in getattr(exporter, "HELPERS", ()))
    if helpers:  # the names their annotations use
        helpers = ("\n\n# --- the adapter's own helpers, embedded by source ---\n"
                   "from typing import Any, Mapping, Sequence  # noqa: F401 (not every helper uses each)\n" + helpers)
    runtime = _without_docstring(RUNTIME.read_text())
    return ("#!/usr/bin/env python3\n" + doc
            + "\nfrom __future__ import annotations  # the embedded helpers' type hints stay unevaluated\n\n"
            "# --- the checker shared by every reproducer (kvparity kvparity/commands/export/runtime.py) ---\n"
            + runtime + helpers + "\n" + exporter.DRIVER.strip("\n") + "\n\n\n"
            "# --- the witness: steps, requests (token ids, identities) and the oracle's expected outputs ---\n"
            f"PLAN = {_plan_literal(plan)}\n\n\n"
            'if __name__ == "__main__":\n'
            "    sys.exit(main(PLAN, Driver))\n")


def export(witness: str | os.PathLike, out: str | os.PathLike, engine: str | None = None,
           engine_args: dict[str, str] | None = None) -> Path:
    """Write the reproducer of `witness` (see `plan_of`) to `out`."""
    out = Path(out)
    exporter, params, args = plan_of(witness, engine, engine_args, out)
    source = render(params, exporter, str(witness), args, str(out))
    compile(source, str(out), "exec")  # a template mistake is ours: never write a script that cannot run
    out.write_text(source)
    out.chmod(0o755)
    return out


def plan_of(witness: str | os.PathLike, engine: str | None, engine_args: dict[str, str] | None,
            out: Path | None = None) -> tuple[Any, dict, dict[str, str]]:
    """(exporter, plan, engine arguments) of `witness` for `engine` (default: the witness's; a registered
    name or a `module:Class` the user names); `engine_args` override the witness's engine arguments (for
    another engine, they are its only ones). `out`: where the script goes, for exporters that locate
    files beside it (None: `--minimal` alone, no script)."""
    from kvparity.commands.export import plan as plans
    from conformance.witness_replay import read_witness
    from conformance.untrusted import refuse_remote_hosts

    raw = plans.witness_json(Path(witness))
    named = raw.get("engine")
    target = engine or named
    exporter = exporter_for(str(target))
    _, args, check, steps = read_witness(witness, engine)  # an engine the user names may be module:Class
    if check in NOT_RESTATED:
        raise UsageError(f"{witness}: a {check} witness cannot be exported: the reproducer's checker restates "
                         f"the token claims only (not logprobs); replay it with `kvparity replay {witness}`")
    if timed(steps):
        raise UsageError(f"{witness}: a witness with requests that arrive or abort mid-flight cannot be exported: "
                         f"the reproducer submits whole batches; replay it with `kvparity replay {witness}`")
    if target != named:
        args = {}  # the witness's engine arguments belong to its own engine
    refuse_remote_hosts(args, engine_args or {}, str(witness))  # the script would send traffic there
    args = {**args, **(engine_args or {})}
    params = plans.build(witness, exporter, str(target), str(named), args, check, steps)
    if hasattr(exporter, "locate") and out is not None:
        params["engine"].update(exporter.locate(out))
    return exporter, params, args


# Checks the standalone checker (runtime.py) does not restate: exporting their witness would print PASSED
# with the bug on.
NOT_RESTATED = ("logprob_parity",)


def timed(steps) -> bool:
    """Whether a request of `steps` carries a timeline (an arrival step or an abort point): the standalone
    reproducer submits whole batches, so it would run another scenario and could print PASSED."""
    return any(getattr(item, "arrive_at_step", None) is not None or getattr(item, "abort_after", None) is not None
               for step in steps for item in getattr(step, "items", ()))


def build_parser() -> argparse.ArgumentParser:
    from kvparity.parsing import UsageParser, summary

    p = UsageParser(prog="kvparity export", description=summary(__doc__))
    p.add_argument("witness", help="a witness JSON file (a report's witnesses/ folder, reports/fault-zoo/witnesses/)")
    p.add_argument("--out", default=None, help="the reproducer to write (FILE.py); required unless --minimal")
    p.add_argument("--minimal", action="store_true",
                   help="print only the steps and one assertion (about 15 lines, for an upstream issue)")
    p.add_argument("--engine", default=None,
                   help=f"engine to write it for: {', '.join(EXPORTERS)} or a module:Class adapter "
                        "(default: the engine the witness names)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="K=V",
                   help="override an engine argument of the witness (e.g. fault=none), or give one for --engine; "
                        "a witness may only name loopback hosts, another machine is named here")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    from kvparity.parsing import output_file

    from conformance.engines import parse_engine_args

    args = build_parser().parse_args(argv)
    args.engine_args = parse_engine_args(args.engine_arg)
    if not Path(args.witness).is_file():
        raise UsageError(f"no such witness file: {args.witness}")
    if args.out is None and not args.minimal:
        raise UsageError("--out FILE.py is required (or --minimal, to print the steps and one assertion)")
    if args.out is not None:
        output_file(args.out)
    return args


def work(args: argparse.Namespace) -> int:
    import sys

    from conformance.exit_codes import ExitCode
    from conformance.contract import EngineError

    try:
        if args.minimal:
            from kvparity.commands.export.minimal import minimal

            print(minimal(plan_of(args.witness, args.engine, args.engine_args)[1]), end="")
            if args.out is None:
                return 0
        out = export(args.witness, args.out, args.engine, args.engine_args)
    except (UsageError, EngineError) as exc:  # EngineError: an adapter built for its oracle failed
        print(f"kvparity export: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"wrote {out}: python {out}  (0 = every claim held, 1 = still misbehaves, 3 = could not run)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from kvparity.parsing import run_command

    return run_command("kvparity export", parse_args, work, argv)
