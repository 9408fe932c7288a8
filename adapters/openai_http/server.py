"""Starting a real OpenAI-compatible server on 127.0.0.1 for the HTTP adapter, and stopping it.

`ServerProcess` owns the child process: its own session (so the whole process tree can be signalled),
a log file, a health probe until it answers, and a stop that escalates SIGTERM → SIGKILL. A
`weakref.finalize` stops a server whose adapter was dropped without `close()`, so a forgotten close
never leaves a server running (and no `__del__` runs at an unpredictable time). And a run that never
closes — killed by SIGKILL, or ended with `os._exit` after a hung call — does not leave it running
either: the server is started on a leash (`adapters.openai_http.leash`) that ends it when the run's process is gone.

The command lines are plain functions of the adapter's arguments, one per server.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Mapping, Sequence

from adapters.openai_http import leash
from adapters.openai_http.transport import Http, last_line
from adapters.vllm import speculative_config  # importing the adapter module does not import vLLM
from conformance.contract import EngineError


def vllm_command(*, folder: str, port: int, block_size: int, max_context: int, loras: Mapping[str, str],
                 budget: int | None, spec: str, k: int, draft_folder: str) -> list[str]:
    """`vllm.entrypoints.openai.api_server` on the shipped checkpoint: float32, eager, prefix caching with
    per-request cached-token counts, top-2 logprobs, optional LoRA modules, chunked prefill, speculation."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
           "--served-model-name", "kvparity", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--block-size", str(block_size),
           "--enable-prefix-caching", "--enable-prompt-tokens-details", "--max-model-len", str(max_context),
           "--max-logprobs", "2", "--seed", "0", "--disable-uvicorn-access-log"]
    if loras:
        cmd += ["--enable-lora", "--max-lora-rank", "8", "--max-loras", str(len(loras)), "--lora-modules",
                *[f"{name}={path}" for name, path in loras.items()]]
    if budget is not None:
        cmd += ["--max-num-batched-tokens", str(budget), "--enable-chunked-prefill"]
    speculation = speculative_config(spec, k, draft_folder)
    if speculation is not None:
        cmd += ["--speculative-config", json.dumps(speculation)]
    return cmd


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes POST /reset_prefix_cache
    return env


def llama_cpp_command(*, gguf: str, port: int, max_context: int) -> list[str]:
    """`llama_cpp.server` on an exported GGUF with f32 KV (`type_k = type_v = 0`)."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(max_context), "--type_k", "0", "--type_v", "0"]


def kvparity_command(*, port: int, block_size: int, scope: str, fault: str | None,
                     knobs: Mapping[str, str]) -> list[str]:
    """`kvparity serve` (kvparity/commands/serve/): the reference engine behind an OpenAI-compatible server."""
    cmd = [sys.executable, "-m", "kvparity.commands.serve", "--host", "127.0.0.1", "--port", str(port),
           "--cache-scope", scope, "--engine-arg", f"block_size={block_size}"]
    for knob, value in knobs.items():
        cmd += ["--engine-arg", f"{knob}={value}"]
    if fault:
        cmd += ["--fault", fault]
    return cmd


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (through its leash, which passes it on), SIGKILL its whole process group if it
    has not gone within 30 s."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class ServerProcess:
    """One server child process, healthy once `start` returns its base URL."""

    def __init__(self, name: str, cmd: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.name = name
        fd, log = tempfile.mkstemp(prefix=f"kvparity-{name}-", suffix=".log")
        self.log_path = pathlib.Path(log)
        self.proc = subprocess.Popen(leash.command(os.getpid(), cmd), stdout=fd, stderr=subprocess.STDOUT,
                                     env=dict(env or os.environ), stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(fd)
        self._finalizer = weakref.finalize(self, _stop, self.proc)

    def wait_healthy(self, base: str, health_path: str, timeout_s: float) -> str:
        """Poll `health_path` until it answers; a server that exits or never answers is an EngineError."""
        probe = Http(base, 5)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")
                raise EngineError(f"{self.name} server exited with code {self.proc.returncode}: "
                                  f"{last_line(tail)} (log {self.log_path})")
            try:
                probe.call("GET", health_path, raw=True)
                return base
            except EngineError:
                time.sleep(1.0)
        self.stop()
        raise EngineError(f"{self.name} server not healthy after {timeout_s:g}s (log {self.log_path})")

    def stop(self) -> None:
        self._finalizer()  # runs _stop once; later calls do nothing
