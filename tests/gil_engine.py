"""A FAKE engine for the supervisor's heartbeat tests — not an inference engine.

`GilHoldingEngine` is the chaos suite's `ChaosEngine` whose `at`-th `run()` blocks in C *holding the
GIL* for `secs` seconds, as a pybind11 call without `gil_scoped_release` does: libc `sleep` called
through `ctypes.PyDLL`, which (unlike `ctypes.CDLL`) does not release the GIL. While it sleeps no other
thread of the process runs — not the thread waiting for the call's `--timeout`, not the heartbeat.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

from chaos_engine import ChaosEngine
from conformance.contract import Request, Result


class GilHoldingEngine(ChaosEngine):
    """A fake: `ChaosEngine` plus one `run()` that holds the GIL in a native sleep."""

    def __init__(self, at: str = "3", secs: str = "40", **kw: str) -> None:
        super().__init__(**kw)
        self._runs, self._at, self._secs = 0, int(at), int(secs)

    def run(self, requests: Sequence[Request]) -> list[Result]:
        self._runs += 1
        if self._runs == self._at:
            ctypes.PyDLL(None).sleep(self._secs)
        return super().run(requests)
