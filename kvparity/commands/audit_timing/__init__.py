"""`kvparity audit-timing`: does an OpenAI-compatible endpoint share its prompt cache across users or
tenants? Decided from client-side time to first token alone (Gu et al., ICML 2025).

    kvparity audit-timing --base-url http://127.0.0.1:8000 [--levels same-user,same-org,cross-tenant]
        [--sequential] [--max-probes 500] [--max-seconds 900] [--letters 800] [--share 1.0]
        [--victim-repeats 1] [--no-salt] [--seed 0] [--out DIR]

Four rooms: `procedure` (prompts, parties, the hit and miss procedures), `client` (HTTP, its clock and
its deadlines), `decision` (the one-sided KS test, α = 1e-8, and the sequential plan), `report` (results.json, report.md,
ttft.png). Exit: 1 when cross-tenant sharing is detected (the endpoint leaks across tenants); 2 when
the positive control — the same-user level, where any working prompt cache must show — was tested and
showed nothing (the audit had no power, so "no cross-tenant sharing" would mean nothing), or a level ran
out of time; 0 otherwise; 3 on a usage error or a failed request (fail closed: an audit that could not
measure never says "no sharing").

Bounded: at most `--max-probes` timed probes per level (each probe also costs the victim's
`--victim-repeats` requests) and `--max-seconds` in all, a hard bound: every request has a wall-clock
deadline, `--timeout` from its start or the end of `--max-seconds` if that comes first, however slowly the
server drips its answer; a request cut off at either is exit 3 with one line. A level the time bound
reaches between two probes is inconclusive (exit 2), never judged on its partial sample. Loopback only unless `--allow-remote`: an audit
sends a provider hundreds of requests, which is a decision to take on purpose, never by default.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import pathlib
import random
import socket
import sys
import time
import urllib.parse
from typing import Sequence

from kvparity.parsing import UsageParser, output_dir, run_command, summary
from conformance.arguments import positive_int, positive_seconds
from conformance.contract import EngineError, UsageError
from conformance.exit_codes import ExitCode

WARMUP = 4  # untimed requests first: the first answers of a fresh server include one-off start-up work


def is_loopback(host: str) -> bool:
    """Every address `host` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def _share(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text}: the shared fraction must be in (0, 1]")
    return v


def parse_args(argv: list[str]) -> argparse.Namespace:
    from kvparity.commands.audit_timing.procedure import LEVELS

    p = UsageParser(prog="kvparity audit-timing", description=summary(__doc__))
    p.add_argument("--base-url", required=True, help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to send; default: the first of GET /v1/models")
    p.add_argument("--levels", default=",".join(LEVELS), help="sharing levels to test, comma-separated")
    p.add_argument("--no-salt", action="store_true",
                   help="never send cache_salt (tenancy only by `user`); cross-tenant cannot be tested then")
    p.add_argument("--letters", type=positive_int, default=800,
                   help="prompt length in random letters (about one token each; keep within the model's context)")
    p.add_argument("--share", type=_share, default=1.0, help="fraction of the victim's prompt the attacker's shares")
    p.add_argument("--victim-repeats", type=positive_int, default=1, help="victim sends its prompt this many times")
    p.add_argument("--max-probes", type=positive_int, default=500, help="timed probes per level (hits + misses)")
    p.add_argument("--sequential", action="store_true",
                   help="test every --look-every probes (at alpha / looks) and stop a level once decisive")
    p.add_argument("--look-every", type=positive_int, default=50, help="probes between looks (sequential mode)")
    p.add_argument("--max-seconds", type=positive_seconds, default=900.0, help="time bound for the whole audit")
    p.add_argument("--timeout", type=positive_seconds, default=60.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the hit/miss order")
    p.add_argument("--out", default=None, help="report folder; default .kvparity/audit-timing/<time>")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a target that is not loopback (you are about to send it hundreds of requests)")
    args = p.parse_args(argv)
    if importlib.util.find_spec("scipy") is None:
        raise UsageError("kvparity audit-timing needs scipy (its KS test): pip install 'kvparity[serve]'")
    u = urllib.parse.urlsplit(args.base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"--base-url {args.base_url!r}: expected http://HOST:PORT")
    if not args.allow_remote and not is_loopback(u.hostname):
        raise UsageError(f"--base-url {args.base_url}: {u.hostname} is not a loopback address; an audit sends "
                         f"hundreds of requests, pass --allow-remote to audit it on purpose")
    args.levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    unknown = [lv for lv in args.levels if lv not in LEVELS]
    if unknown or not args.levels:
        raise UsageError(f"--levels {','.join(args.levels)!r}: choose from {', '.join(LEVELS)}")
    if args.no_salt and "cross-tenant" in args.levels:
        raise UsageError("--no-salt cannot test cross-tenant (tenants are told apart by cache_salt); "
                         "give --levels same-user,same-org")
    if args.max_probes < 2 or args.look_every < 2:
        raise UsageError("--max-probes and --look-every must be at least 2 (one hit and one miss)")
    args.out = output_dir(args.out or pathlib.Path(".kvparity") / "audit-timing" / time.strftime("%Y%m%d-%H%M%S"))
    return args


def _first_model(client) -> tuple[str, str]:
    """The first model GET /v1/models lists, and what GET /version says (within the client's deadlines)."""
    data = client.get_json("/v1/models")
    try:
        model = data["data"][0]["id"]
    except (KeyError, IndexError, TypeError) as exc:
        raise EngineError(f"/v1/models lists no model: {str(data)[:80]}") from exc
    if not isinstance(model, str):
        raise EngineError(f"/v1/models lists a model id that is not a string: {str(model)[:80]}")
    version = "unknown"
    try:
        v = client.get_json("/version", timeout=min(5.0, client.timeout))
        if isinstance(v, dict) and v.get("version"):
            version = str(v["version"]) + (f" (cache scope {v['cache_scope']})" if "cache_scope" in v else "")
    except EngineError:
        pass
    return model, version


def audit(args: argparse.Namespace) -> int:
    from kvparity.commands.audit_timing import report
    from kvparity.commands.audit_timing.decision import Plan
    from kvparity.commands.audit_timing.client import Client
    from kvparity.commands.audit_timing.procedure import Procedure, new_nonce, parties, run_level

    start = time.monotonic()
    deadline = start + args.max_seconds
    client = Client(args.base_url, args.model, args.timeout, run_deadline=deadline, max_seconds=args.max_seconds)
    try:
        found, version = _first_model(client)
        client.model = args.model or found
        procedure = Procedure(args.letters, args.share, args.victim_repeats)
        plan = Plan(args.max_probes, args.sequential, args.look_every)
        rng = random.Random(args.seed)
        nonce = new_nonce()
        warm = parties("same-user", nonce, args.no_salt)[0]
        for _ in range(WARMUP):
            client.complete(procedure.prompt(rng), warm)
        results = []
        for level in args.levels:
            victim, attacker = parties(level, nonce, args.no_salt)

            def progress(r, level=level):
                t = r.looks[-1]
                print(f"  {level}: {r.probes} probes, p = {t.pvalue:.3g}", file=sys.stderr, flush=True)

            results.append(run_level(level, plan, procedure, client, rng, victim, attacker, deadline,
                                     progress if args.sequential else None))
    except EngineError as exc:  # a failed or cut-off request: no verdict from what was measured before it
        print(f"kvparity audit-timing: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return ExitCode.ERROR
    finally:
        client.close()
    code, conclusion = decide(results)
    report.write(args.out, target=args.base_url, version=version, levels=results, procedure=procedure,
                 client=client, seed=args.seed, elapsed_s=time.monotonic() - start, exit_code=code,
                 conclusion=conclusion, plot=importlib.util.find_spec("matplotlib") is not None)
    for r in results:
        t = r.final
        print(f"{r.level:13s} {r.verdict:34s} p = {t.pvalue:.3g}  (D = {t.statistic:.3f}, {r.probes} probes)")
    print(f"{conclusion}; cost {client.requests} requests, {client.prompt_tokens + client.completion_tokens} "
          f"tokens; report {args.out / 'report.md'}")
    return code


def decide(results) -> tuple[int, str]:
    """The exit code and a one-line conclusion (see the module docstring)."""
    by = {r.level: r for r in results}
    cross, control = by.get("cross-tenant"), by.get("same-user")
    if cross is not None and cross.detected:
        return ExitCode.FAIL, "LEAK: cross-tenant prompt-cache sharing detected"
    if control is not None and not control.detected:
        return ExitCode.INCONCLUSIVE, ("UNDECIDED: the positive control (same-user) showed no caching, so absence of "
                                "sharing elsewhere means nothing")
    if any(r.stopped == "time" and not r.detected for r in results):
        return ExitCode.INCONCLUSIVE, "UNDECIDED: the time bound ended a level before its probe budget"
    if cross is not None:
        return ExitCode.PASS, "no cross-tenant sharing detected"
    return ExitCode.PASS, "no level tests cross-tenant sharing; see the verdict per level"


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("kvparity audit-timing", parse_args, audit, argv)


if __name__ == "__main__":
    raise SystemExit(main())
