"""Reproducers for any `module:Class` adapter: the script imports the user's adapter module (not
kvparity) and drives the adapter through the Engine contract's own methods — configure, reset, run,
snapshot, close — the calls `kvparity run` made.

The adapter receives requests shaped as the contract's `Request` (id, prompt, max_tokens, stop_ids,
identity with revision, adapter, adapter_digest, salt): the adapter module's own `Request` and
`Identity` where it imported them (then the script needs kvparity, as the adapter does), else plain
stand-ins with the same fields. Results are read by attribute (output, finish_reason, cached_tokens,
...). So an adapter whose module imports kvparity only where kvparity alone calls it (capabilities(),
baseline()) gets a reproducer that runs without kvparity installed. The expected outputs are its own
oracle's (`baseline`), computed at export time, as for every exporter.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from conformance.contract import Baseline, Request, UsageError

NEEDS = "the adapter's own module and what it imports (its folder is put on sys.path; --adapter-path moves it)"

DRIVER = r'''
# --- the engine: the user's adapter, driven through the Engine contract as `kvparity run` drives it ---
from collections import namedtuple

_Identity = namedtuple("Identity", "revision adapter adapter_digest salt")
_Request = namedtuple("Request", "id prompt max_tokens stop_ids identity")


class Driver:
    OPTIONS = [("--adapter-path", {"default": None, "help": "the folder to import the adapter module from "
                                   "(default: the one it was exported from)"})]

    def __init__(self, params, args):
        import importlib

        folder = args.adapter_path or params["path"]
        if folder:
            sys.path.insert(0, folder)
        module = importlib.import_module(params["module"])
        self.Request = getattr(module, "Request", _Request)
        self.Identity = getattr(module, "Identity", _Identity)
        self.engine = getattr(module, params["class"])(**params["args"])

    def configure(self, config):
        self.engine.configure(config)

    def reset(self):
        self.engine.reset()

    def run(self, requests):
        batch = [self.Request(id=q["id"], prompt=tuple(q["prompt"]), max_tokens=q["max_tokens"],
                              stop_ids=tuple(q["stop_ids"]), identity=self.Identity(**q["identity"]))
                 for q in requests]
        fields = ("cached_tokens", "draft_proposed", "draft_accepted", "evictions")
        return [{"output": list(r.output), "finish_reason": r.finish_reason,
                 **{f: getattr(r, f, None) for f in fields}} for r in self.engine.run(batch)]

    def snapshot(self):
        snap = getattr(self.engine, "snapshot", None)
        return dict(snap()) if callable(snap) else {}

    def close(self):
        self.engine.close()
'''


def split(target: str) -> tuple[str, str]:
    module, _, cls = target.partition(":")
    return module, cls


def folder_of(module_name: str) -> str | None:
    """The sys.path entry the adapter module was imported from (None: an installed package's own)."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    root = Path(file).resolve().parent
    for _ in module_name.split(".")[1:]:
        root = root.parent
    return str(root)


def params_for(target: str) -> Callable[[Mapping[str, str]], dict[str, Any]]:
    module, cls = split(target)

    def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
        return {"module": module, "class": cls, "args": dict(args), "path": folder_of(module)}

    return engine_params


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The step's configuration, as the adapter's configure() received it."""
    return dict(config)


def check_request(args: Mapping[str, str], request: Request) -> None:
    """Whatever the adapter accepted during the run, it is given again."""


def oracle_for(target: str) -> Callable[..., tuple[Callable[[Request], Baseline], Callable[[], None]]]:
    def oracle(args: Mapping[str, str], caps: Any) -> tuple[Callable[[Request], Baseline], Callable[[], None]]:
        """The adapter's own baseline, from a freshly built adapter."""
        from conformance.registry import load_engine

        engine = load_engine(target, dict(args))
        return engine.baseline, engine.close

    return oracle


class Exporter:
    """The exporter module's interface (NEEDS, DRIVER, engine_params, ...) for one `module:Class`."""

    def __init__(self, target: str) -> None:
        if not all(split(target)):
            raise UsageError(f"not a module:Class adapter: {target!r}")
        self.NEEDS, self.DRIVER = NEEDS, DRIVER
        self.engine_params = params_for(target)
        self.config_params, self.check_request = config_params, check_request
        self.oracle = oracle_for(target)
        self.HOW = f"Drives adapter {target} (its module is imported; kvparity is not).\n"
