"""A server started for a run dies with the run, whatever ends the run (SIGKILL included).

    python -I adapters/openai_http/leash.py --parent PID -- SERVER COMMAND ...

An adapter that starts a server (`serve=vllm|llama_cpp|kvparity` in adapters/openai_http) stops it in
`close()` — but a run killed by SIGKILL, or one that abandoned a hung call and ended with `os._exit`,
never gets there, and the server it started listens on under PID 1 (with vLLM: holding a GPU). So the
server is started through this leash, a small process between the run and the server:

- it starts the server as its own child, asking Linux to SIGTERM the server if the leash itself dies
  (`PR_SET_PDEATHSIG`, safe here: the leash is single-threaded, so "the thread that forked it" is the
  leash's only thread);
- every `POLL_S` it checks that the run (`--parent`) is still its parent. When the run is gone it
  SIGTERMs the server, waits `GRACE_S` for it, then SIGKILLs its whole process group (the leash, the
  server and any workers the server started in that group) — the run cannot be asked anymore;
- otherwise it waits for the server and exits with its exit code, so `ServerProcess` sees the server's
  fate through the leash. A stop signal to the leash is passed on to the server (once: `ServerProcess`
  signals the leash, not the group, so the server can stop its own workers first); what the server
  leaves in the group when it ends gets SIGTERM.

Why not the alternatives. `PR_SET_PDEATHSIG` set directly on the server fires when the *thread* that
forked it ends, not the process: the HTTP adapter restarts its server from `configure()`, which runs on
the run's engine-call thread, and that thread ends before the run does. A lease the server checks only
works for a server we wrote (`kvparity serve`), not for vLLM or llama.cpp. A process group alone is
what `close()` signals, but nothing signals it when the process that would is dead. The leash covers
all three servers, and polling `getppid()` does not depend on which thread started it.

Linux-first: without prctl the polling still ends the server when the run dies; only a SIGKILL of the
leash itself then orphans the server.

The leash is a script run with `python -I`: stdlib only, neither the caller's PYTHONPATH nor the script's
folder among its imports, so it starts wherever the interpreter does and leaves the server's environment
exactly as the adapter built it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Any, Sequence

POLL_S = 0.5
GRACE_S = 3.0
EXIT_USAGE = 3
PR_SET_PDEATHSIG = 1


def command(parent_pid: int, server: Sequence[str]) -> list[str]:
    """The command line that starts `server` on a leash held by `parent_pid` (this process, normally)."""
    return [sys.executable, "-I", os.path.abspath(__file__), "--parent", str(parent_pid), "--", *server]


def _parse(argv: Sequence[str]) -> tuple[int, list[str]]:
    argv = list(argv)
    if len(argv) < 4 or argv[0] != "--parent" or argv[2] != "--" or not argv[1].isdigit():
        raise ValueError("usage: leash.py --parent PID -- COMMAND ...")
    return int(argv[1]), argv[3:]


def _server_death_signal() -> None:
    """In the server, between fork and exec: SIGTERM when the leash dies (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parent, cmd = _parse(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"kvparity leash: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if os.getppid() != parent:  # the run ended before its server could start
        return EXIT_USAGE
    server = subprocess.Popen(cmd, preexec_fn=_server_death_signal)

    def pass_on(signum: int, frame: Any) -> None:
        try:
            server.send_signal(signum)
        except OSError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, pass_on)
    while True:
        try:
            code = server.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                return _end(server)
            continue
        _term_rest_of_group()
        return _same_end(code)


def _same_end(code: int) -> int:
    """End as the server did: its exit code, or killed by the same signal (so a caller sees -N as before)."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code & 0xFF


def _term_rest_of_group() -> None:
    """The server has ended: SIGTERM what it left in this process group (workers), the leash excepted."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGTERM)
    except OSError:
        pass


def _end(server: subprocess.Popen) -> int:
    """The run is gone: stop the server, then everything left in this process group, this leash last."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    try:
        server.terminate()
        server.wait(timeout=GRACE_S)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        if os.getpgid(0) == os.getpid():  # a group of its own, as ServerProcess starts it
            os.killpg(os.getpid(), signal.SIGKILL)
    except OSError:
        pass
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
