"""The exit codes of every kvparity command, defined once (pytest's `ExitCode` is the model).

A CI reads PASS from the exit code before anything else, so each number has exactly one meaning across
`run`, `replay`, `report`, the plugin commands and the supervisor: 0 the claim held, 1 a violation with a
witness, 2 nothing was proved (a claimed capability never exercised, an audit without power), 3 an error
(the engine crashed, hung or answered malformed, a run ended badly, or the input was bad: one line says
which), and 128 + the signal for a run stopped from outside (conformance.stopping).
"""

from __future__ import annotations

import enum
import signal


class ExitCode(enum.IntEnum):
    PASS = 0
    FAIL = 1
    INCONCLUSIVE = 2
    ERROR = 3
    USAGE = 3  # an alias of ERROR: bad input is refused with one line before any engine starts
    SIGHUP = 128 + signal.SIGHUP  # 129: the terminal went away
    INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C
    SIGTERM = 128 + signal.SIGTERM  # 143: a CI cancel, `docker stop`
