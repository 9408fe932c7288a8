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

NEEDS = ("the adapter's own module and what it imports: by name where it is importable (PYTHONPATH, installed),\n"
         "else from the file it was exported from (--adapter-file moves it)")

DRIVER = r'''
# --- the engine: the user's adapter, driven through the Engine contract as `kvparity run` drives it ---
from collections import namedtuple

_Identity = namedtuple("Identity", "revision adapter adapter_digest salt")
_Request = namedtuple("Request", "id prompt max_tokens stop_ids identity")


class Driver:
    OPTIONS = [("--adapter-file", {"default": None, "help": "the adapter module's file, where its name is not "
                                   "importable (default: the file it was exported from)"})]

    def __init__(self, params, args):
        module = _adapter_module(params["module"], args.adapter_file or params["file"], bool(args.adapter_file))
        self.Request = getattr(module, "Request", _Request)
        self.Identity = getattr(module, "Identity", _Identity)
        self.engine = getattr(module, params["class"])(**params["args"])
        if not callable(getattr(self.engine, "snapshot", None)):
            self.snapshot = None  # the checker's sign of an engine without a white-box snapshot

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
        return dict(self.engine.snapshot())

    def close(self):
        self.engine.close()


def _adapter_module(name, file, explicit):
    """The adapter module: from `file` where the user named one (--adapter-file), else imported by name
    where that works (PYTHONPATH, an installed package), else loaded from the file it was exported from
    (an adapter that imports its own package's siblings needs one of the first two)."""
    import importlib
    import importlib.util

    if not explicit:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not file or not (name == exc.name or name.startswith(f"{exc.name}.")):  # one it imports
                raise
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
'''


def split(target: str) -> tuple[str, str]:
    module, _, cls = target.partition(":")
    return module, cls


def file_of(module_name: str) -> str | None:
    """The file the adapter module was imported from (None: one without a file)."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    file = getattr(module, "__file__", None)
    return None if file is None else str(Path(file).resolve())


def params_for(target: str) -> Callable[[Mapping[str, str]], dict[str, Any]]:
    module, cls = split(target)

    def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
        return {"module": module, "class": cls, "args": dict(args), "file": file_of(module)}

    return engine_params


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The step's configuration, as the adapter's configure() received it."""
    return dict(config)


def check_request(args: Mapping[str, str], request: Request) -> None:
    """Whatever the adapter accepted during the run, it is given again."""


def oracle_for(target: str) -> Callable[..., tuple[Callable[[Request], Baseline], Callable[[], None]]]:
    def oracle(args: Mapping[str, str], caps: Any) -> tuple[Callable[[Request], Baseline], Callable[[], None]]:
        """The adapter's own baseline, from a freshly built adapter."""
        from conformance.engines import load_engine

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
