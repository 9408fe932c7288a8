"""A FAKE engine that misbehaves on purpose, for the chaos suite — not an inference engine.

`ChaosEngine` is `FakeDictEngine` (a clean fake) plus one planted misbehaviour, chosen with
`chaos=ACTION@CALL` and fired on the `after`-th call of CALL (1 = the first), so a run can make progress
before it goes wrong:

    ACTION  raise | hang | exit0 | exit1 | sigkill | slow            (any CALL)
            nan_timing | string_cached | bad_token | short | bool_count (CALL = run)
            nan_margin                                                 (CALL = baseline)
            bad_vocab                                                  (CALL = capabilities)
    CALL    init | capabilities | configure | run | reset | baseline | snapshot | close

`slow` sleeps `slow_s` on every CALL from the `after`-th on (for tests that kill or interrupt a run that
is still going). Every action is something a real engine has done: crash, hang, end the process,
answer a value that is not what the contract says.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Mapping, Sequence

from attrs import evolve

from conformance.contract import Baseline, Capabilities, Request, Result
from fake_engine import FakeDictEngine

CALLS = ("init", "capabilities", "configure", "run", "reset", "baseline", "snapshot", "close")


class ChaosEngine(FakeDictEngine):
    """A fake, for testing that the suite fails closed. One misbehaviour, opt-in via `chaos=`."""

    def __init__(self, chaos: str = "none@run", after: str = "1", hang_s: str = "60", slow_s: str = "0.2") -> None:
        # First: FakeDictEngine sets a `hang_s` of its own (5 s), which used to overwrite ours, so a
        # `hang` lasted 5 s whatever `hang_s` said and raced a 5 s `--timeout`.
        super().__init__()
        self.action, _, self.call = chaos.partition("@")
        if self.call not in CALLS:
            raise ValueError(f"chaos={chaos!r}: CALL must be one of {', '.join(CALLS)}")
        self.after, self.hang_s, self.slow_s = int(after), float(hang_s), float(slow_s)
        self.counts: dict[str, int] = {}
        self._maybe("init")

    def _maybe(self, call: str) -> bool:
        """Fire the planted action if this is its call; True when a value-level action should apply."""
        if call != self.call:
            return False
        self.counts[call] = n = self.counts.get(call, 0) + 1
        if self.action == "slow" and n >= self.after:
            time.sleep(self.slow_s)
            return False
        if n != self.after:
            return False
        if self.action == "raise":
            raise RuntimeError(f"chaos: {call} raised\nsecond line of the message")
        if self.action == "hang":
            time.sleep(self.hang_s)
        if self.action == "exit0":
            os._exit(0)
        if self.action == "exit1":
            os._exit(1)
        if self.action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        return True

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        if self._maybe("capabilities") and self.action == "bad_vocab":
            return evolve(caps, vocab_size="64")
        return caps

    def configure(self, config: Mapping[str, Any]) -> None:
        self._maybe("configure")
        super().configure(config)

    def reset(self) -> None:
        self._maybe("reset")
        super().reset()

    def snapshot(self) -> Mapping[str, Any]:
        self._maybe("snapshot")
        return super().snapshot()

    def close(self) -> None:
        self._maybe("close")

    def baseline(self, request: Request) -> Baseline:
        b = super().baseline(request)
        if self._maybe("baseline") and self.action == "nan_margin":
            return evolve(b, margins=(float("nan"),) * len(b.margins))
        return b

    def run(self, requests: Sequence[Request]) -> list[Result]:
        fire = self._maybe("run")
        results = super().run(requests)
        if not fire:
            return results
        first = results[0]
        if self.action == "nan_timing":
            results[0] = evolve(first, timings={"ttft_s": float("nan")})
        elif self.action == "string_cached":
            results[0] = evolve(first, cached_tokens="12")
        elif self.action == "bool_count":
            results[0] = evolve(first, draft_accepted=True)
        elif self.action == "bad_token":
            results[0] = evolve(first, output=(10_000,))
        elif self.action == "short":
            results = results[:-1] if len(results) > 1 else []
        return results
