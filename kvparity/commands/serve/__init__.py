"""`kvparity serve`: the reference engine behind an OpenAI-compatible HTTP server.

    kvparity serve [--host 127.0.0.1] [--port 8000] [--cache-scope user|tenant|global] [--fault NAME]
                   [--engine-arg KNOB=VALUE ...] [--revision a] [--model-name kvparity]

A real target on loopback for what only sees an engine as an endpoint: the HTTP adapter
(`--engine openai_http --engine-arg serve=kvparity`), gateways, and the timing audit
(`kvparity audit-timing`). Rooms: `loop` (one engine on one thread, continuous batching: requests join
the running batch at every step), `app` (the aiohttp routes, vLLM's wire format, and the cache scope
that decides which requests may share KV), `build` (a server from these arguments); this module is the
command.

`--engine-arg` takes the reference adapter's knobs (block_size, num_blocks, pool_tokens, drafter, k,
chunk_size, token_budget, max_batch, prefix_cache), so a chunked, speculative or small-pool engine is
served the same way it runs in-process. Prints one line `kvparity serve: listening on URL` once the socket
is bound, then serves until SIGINT/SIGTERM (or `--max-seconds`). Bad arguments: one line, exit 3, before
any engine is built. Needs the `serve` extra (aiohttp).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Sequence

from kvparity.parsing import UsageParser, run_command, summary
from conformance.arguments import positive_int
from conformance.contract import UsageError
from conformance.exit_codes import ExitCode


def parse_args(argv: list[str]) -> argparse.Namespace:
    if importlib.util.find_spec("aiohttp") is None:
        raise UsageError("kvparity serve needs aiohttp: pip install 'kvparity[serve]'")
    from kvparity.commands.serve.app import SCOPES

    p = UsageParser(prog="kvparity serve", description=summary(__doc__))
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="port to bind (0: any free port, printed)")
    p.add_argument("--cache-scope", choices=SCOPES, default="tenant",
                   help="who may share KV: the same user of a tenant, a tenant (cache_salt), or everyone (leaky)")
    p.add_argument("--fault", default=None, help="plant one fault of the zoo (reference_engine/faults.py); "
                                                 "default: none")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KNOB=VALUE",
                   help="a reference-engine knob, as for --engine reference (repeatable)")
    p.add_argument("--revision", default="a", help="the shipped target revision served as the base model")
    p.add_argument("--model-name", default="kvparity", help="the base model's name in /v1/models")
    p.add_argument("--max-seconds", type=positive_int, default=None,
                   help="stop serving after this many seconds (a bound for scripted runs); default: no bound")
    args = p.parse_args(argv)
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port}: not a port number")
    from conformance.engines import parse_engine_args

    args.engine_args = parse_engine_args(args.engine_arg)
    if args.fault is not None and args.fault.lower() in ("", "none", "off"):
        args.fault = None
    from kvparity.commands.serve.build import build

    args.server = build(scope=args.cache_scope, fault=args.fault, engine_args=args.engine_args,
                        revision=args.revision, model_name=args.model_name)  # validates; builds the engine
    return args


def serve(args: argparse.Namespace) -> int:
    import asyncio

    from aiohttp import web

    async def main() -> None:
        runner = web.AppRunner(args.server.app(), handle_signals=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"kvparity serve: listening on http://{host}:{port} (cache scope {args.cache_scope}, "
              f"fault {args.fault or 'none'})", flush=True)
        try:
            if args.max_seconds:
                await asyncio.sleep(args.max_seconds)
            else:
                await asyncio.Event().wait()  # until a signal ends the loop
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, web.GracefulExit):
        pass
    except OSError as exc:
        print(f"kvparity serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return ExitCode.ERROR
    return ExitCode.PASS


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("kvparity serve", parse_args, serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
