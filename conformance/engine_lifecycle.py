"""Building and closing an engine for a command, each bounded by a watchdog, and what a command must
tell its process afterwards (an engine call left hanging on a thread means the process ends with
os._exit). Library code shared by `kvparity run`, `replay`, `calibrate` and the plugin's state-machine
child, so it lives here and not in any one command. Also the one wrapper a run puts around an engine
(`accept_unsteered`)."""

from __future__ import annotations

from typing import Any

from conformance.contract import Capabilities, evolve


class Session:
    """What one command did that its caller must know after it returns: whether an engine call was left
    hanging on a thread (then the process must end with os._exit, not wait for that thread at shutdown)."""

    def __init__(self) -> None:
        self.hard_exit = False


def build_engine(name: str, engine_args: dict[str, str], timeout_s: float) -> Any:
    """Construct the adapter on the main thread (some engines install signal handlers, which only the
    main thread may), bounded by a watchdog."""
    from conformance.calls import watchdog
    from conformance.engines import load_engine

    with watchdog(timeout_s, f"building engine {name!r}"):
        return load_engine(name, engine_args)


def close_engine(engine: Any, timeout_s: float) -> str | None:
    """Close an engine within the timeout; the cause in one line if close() failed, else None."""
    from conformance.calls import one_line, watchdog

    try:
        with watchdog(timeout_s, "close()"):
            engine.close()
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        return f"close() raised {type(exc).__name__}: {one_line(exc)}"
    return None


def accept_unsteered(engine) -> None:
    """`kvparity run --accept-unsteered`: the engine's capabilities say the user accepts situations left
    unsteered, so the history records the choice and a re-analysis reads the same verdict."""
    inner = engine.capabilities

    def capabilities() -> Capabilities:
        caps = inner()
        return evolve(caps, landmarks=evolve(caps.landmarks, unsteered_accepted=True))

    engine.capabilities = capabilities
