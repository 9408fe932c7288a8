"""The `kvparity` command line: ONE dispatcher over the subcommands in kvparity/commands/ and the
third-party ones of the entry-point group `kvparity.commands`.

Exit codes are conformance.exit_codes.ExitCode (0 pass, 1 fail, 2 inconclusive, 3 error or bad input,
128 + the signal when stopped from outside). Every error path prints one line saying why; bad input is
refused before an engine is built. `kvparity run` and `kvparity replay` from the console are supervised
(conformance.supervisor): the work runs in a child process (`python -m kvparity`), so an engine that ends
the process itself still gets an `error` verdict and a report. `main()` runs in-process (tests call it).
"""

from __future__ import annotations

import ast
import os
import re
import sys
import traceback
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Sequence

from conformance.contract import EngineError, UsageError
from conformance.engine_lifecycle import Session
from conformance.exit_codes import ExitCode
from kvparity.parsing import UsageParser

# The built-in commands, each a peer under kvparity/commands/ (name -> module:function). A third-party
# entry point of the same name does not replace one (nor does a stale installed copy of ours).
BUILTIN = {
    "run": "kvparity.commands.run:main",
    "replay": "kvparity.commands.replay:main",
    "report": "kvparity.commands.report:main",
    "merge": "kvparity.commands.merge:main",
    "campaign": "kvparity.commands.campaign:main",
    "engines": "kvparity.commands.engines:main",
    "calibrate": "kvparity.commands.calibrate:main",
    "fault-zoo": "kvparity.commands.fault_zoo:main",
    "museum": "kvparity.commands.museum:main",
    "bench": "kvparity.commands.bench:main",
    "export": "kvparity.commands.export:main",
    "export-gguf": "kvparity.commands.export_gguf:main",
    "serve": "kvparity.commands.serve:main",
    "audit-timing": "kvparity.commands.audit_timing:main",
    "mutate": "kvparity.commands.mutate:main",
}
TAKES_SESSION = {"run", "replay"}  # they may leave a thread inside a hung engine (then: os._exit)


def commands() -> dict[str, str]:
    """Every subcommand: the built-in ones, then third-party entry points of group `kvparity.commands`."""
    from importlib.metadata import entry_points

    found = dict(BUILTIN)
    for ep in entry_points(group="kvparity.commands"):
        found.setdefault(ep.name, ep.value)
    return found


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvparity")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def command_summary(target: str) -> str:
    """The first sentence of a command's module docstring, read without importing the module (a command
    may import an engine library; `kvparity --help` must stay instant and never run plugin code)."""
    try:
        spec = find_spec(target.partition(":")[0])
        origin = spec.origin if spec else None
        doc = ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8"))) if origin else None
    except (ImportError, OSError, SyntaxError, ValueError):
        doc = None
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    sentence = re.sub(r"^`kvparity [^`]*`:\s*", "", paragraph).split(". ")[0].rstrip(".")
    return sentence[:1].lower() + sentence[1:] if sentence else f"{target} (its module has no docstring)"


def build_parser() -> UsageParser:
    """The top-level parser: `--version`, `--help` listing every command. Each command parses its own
    arguments (its module's `build_parser`)."""
    p = UsageParser(prog="kvparity", description="Does an engine's KV reuse change what it says?")
    p.add_argument("--version", action="version", version=f"kvparity {installed_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=UsageParser, metavar="COMMAND")
    for name, target in commands().items():
        sub.add_parser(name, help=command_summary(target), add_help=False)
    return p


def load(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr or "main")


def dispatch(argv: Sequence[str], session: Session) -> int:
    """Run one command in this process; every failure is a one-line message and an exit code."""
    argv = list(argv)
    try:
        known = commands()
        if not argv or argv[0] not in known:
            try:
                build_parser().parse_args(argv)  # --help, --version, or a usage error
            except SystemExit as exc:
                return ExitCode.PASS if exc.code in (0, None) else ExitCode.USAGE
            return ExitCode.USAGE  # not reached: a known command is dispatched below
        main = load(known[argv[0]])
        if argv[0] in TAKES_SESSION and known[argv[0]] == BUILTIN.get(argv[0]):
            return int(main(argv[1:], session) or 0)
        return int(main(argv[1:]) or 0)
    except UsageError as exc:
        print(f"kvparity: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return ExitCode.USAGE
    except EngineError as exc:
        print(f"kvparity: engine error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM or SIGHUP in a supervised child (conformance.stopping)
        from conformance import stopping

        stopping.ignore_further()
        print(f"kvparity: interrupted ({stopping.describe(exc)})", file=sys.stderr)
        return stopping.exit_code(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """In-process entry (tests, embedding): never ends the process itself."""
    return dispatch(list(sys.argv[1:] if argv is None else argv), Session())


def internal_error(exc: BaseException) -> int:
    """A bug in a command (ours or a plugin's) that escaped every handler: the traceback for whoever fixes
    it, a last line saying so, and exit 3 (error). Left alone, Python would exit 1, which in kvparity's
    exit codes is FAIL — a verdict nobody reached."""
    from conformance.calls import one_line

    traceback.print_exc()
    print(f"kvparity: internal error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
    return ExitCode.ERROR


def console_main() -> None:
    """The `kvparity` console script: supervise `run` and `replay`, run everything else directly."""
    from conformance import lifeline, status, stopping, supervisor

    argv = sys.argv[1:]
    lifeline.stop_with_parent()  # a campaign's shard: stopped, with its report, when the campaign dies
    if supervisor.should_supervise(argv):
        raise SystemExit(supervisor.supervise(argv))
    child = lifeline.attach()  # a supervised child: it beats for its supervisor and dies with it
    if child:
        stopping.install()  # SIGTERM and SIGHUP end the work as Ctrl-C does, at the next safe point
    session = Session()
    try:
        code = dispatch(argv, session)
    except Exception as exc:  # noqa: BLE001 - a bug: never Python's exit 1, which kvparity reads as FAIL
        if child:
            raise  # its supervisor answers for a child that ends without its exit code (conformance.supervisor)
        code = internal_error(exc)
    status.tell(exit=code)
    if session.hard_exit:  # a thread is still inside the engine: do not wait for it at shutdown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
