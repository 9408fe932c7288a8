"""A witness as a reproducer's plan: the steps with every request resolved to token ids and its expected
output from the oracle, plus what the claims need to know (tolerance, eos, when a repeat must hit).

The plan is plain JSON (it is embedded in the script as a JSON literal and read with json.loads). What
the suite works out from its capabilities and the witness's configurations is worked out here, once, so
the script's checker (runtime.py) stays a few lines of arithmetic:

- expected outputs: the adapter's oracle, computed now (a witness file holds none). Where the witness
  sits in a run folder whose history.jsonl recorded a baseline for the same request, the two must agree
  (else the checkpoints changed since the run, and the reproducer would test something else);
- continuations (a turn built from an earlier output) are resolved with the *expected* output: where the
  engine's own earlier output differs, that earlier request already fails;
- per batch: the cache epoch (resets) and segment (configures), the prompt length above which an exact
  repeat must hit (`min_hit_prompt`, the block size, a configured block size), whether the
  configuration switches caching off — as conformance/checks/coverage.py's positive control reads them.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from conformance.contract import Baseline, Capabilities, Request, UsageError
from conformance.untrusted import read_json

FORMAT = 1


def witness_json(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path, "witness")
    except UsageError:
        raise
    except (OSError, ValueError) as exc:
        raise UsageError(f"not a kvparity witness file: {path} ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"not a kvparity witness file: {path}")
    return data


def _history(path: Path) -> Any | None:
    """The run's history beside a run folder's witnesses/ (None for a witness kept on its own), read as
    `kvparity report` and `merge` read one (conformance.reanalysis.read_verified): its chain, its match with
    the run's results.json, its example sizes and the types of what it recorded are checked, and anything
    else is one line. Export takes the run's capabilities and recorded baselines from it; read plainly, a
    history's string block size went into the reproducer's plan, and a history whose chain did not verify
    was read all the same (its problems were the history's errors, which export did not look at)."""
    from conformance.history_files import history_in
    from conformance.reanalysis import read_verified

    run_dir = path.parent.parent  # a committed run folder keeps history.jsonl.gz
    if path.parent.name != "witnesses" or history_in(run_dir) is None:
        return None
    return read_verified(run_dir).history


def capabilities(data: Mapping[str, Any], history: Any | None, same_engine: bool,
                 build: Any) -> Capabilities:
    """The engine's declared capabilities: the witness's record, the run's, or a freshly built adapter's."""
    from conformance.history_codec import capabilities_from

    if same_engine and isinstance(data.get("capabilities"), dict):
        return capabilities_from(data["capabilities"])
    if same_engine and history is not None and history.capabilities is not None:
        return history.capabilities
    return build()


def resolve(item: Any, resolved: Mapping[str, tuple[Request, Baseline]]) -> Request:
    """`ScenarioRunner.resolve` with the oracle's outputs standing for the engine's."""
    from conformance.scenario import Continuation

    if not isinstance(item, Continuation):
        return item
    parent = resolved.get(item.parent)
    stop_ids = item.stop_ids
    if parent is None:
        prompt = item.extra
    elif item.restop is not None and parent[1].output:
        prompt = parent[0].prompt
        stop_ids = (parent[1].output[item.restop % len(parent[1].output)],)
    else:
        prompt = parent[0].prompt + tuple(parent[1].output) + item.extra
    return Request(item.id, prompt[: item.max_prompt] or item.extra[:1], item.max_tokens, stop_ids, item.identity)


def _expected(b: Baseline) -> dict[str, Any]:
    return {"output": [int(t) for t in b.output], "finish_reason": b.finish_reason,
            "margins": [float(m) for m in b.margins], "runner_up": [None if t is None else int(t) for t in b.runner_up]}


def _identity(q: Request) -> dict[str, Any]:
    i = q.identity
    return {"revision": i.revision, "adapter": i.adapter, "adapter_digest": i.adapter_digest, "salt": i.salt}


def build(path: str | Path, exporter: ModuleType, target: str, named: str, args: Mapping[str, str],
          check: str, steps: list[Any]) -> dict[str, Any]:
    """The plan of witness `path` for engine `target` (whose exporter module is `exporter`)."""
    from conformance.history_facts import caching_disabled, config_block_size
    from conformance.checks.hygiene import SNAPSHOT_AT_REST
    from conformance.history_codec import oracle_key_str
    from conformance.engines import load_engine
    from conformance.scenario import Configure, Reset
    from conformance.untrusted import check_configs

    path = Path(path)
    data = witness_json(path)
    history = _history(path) if target == named else None

    def built_caps() -> Capabilities:
        engine = load_engine(target, dict(args))
        try:
            return engine.capabilities()
        finally:
            engine.close()

    declared = getattr(exporter, "declared_capabilities", None)  # an engine that cannot be built here
    caps = capabilities(data, history, target == named, built_caps if declared is None else lambda: declared(args))
    # A configure the engine does not declare never reaches the reproducer (`replay` refuses it the same way):
    # pool_tokens=10**12 was written as num_blocks 62,500,000,000, the allocation `replay` guards against.
    check_configs([s.config for s in steps if isinstance(s, Configure)], caps.config_space, str(path))
    baseline, close_oracle = exporter.oracle(args, caps)
    memo: dict[str, Baseline] = {}
    resolved: dict[str, tuple[Request, Baseline]] = {}
    out_steps: list[dict[str, Any]] = []
    epoch, segment, config, index = 1, 0, {}, 0
    try:
        for step in steps:
            if isinstance(step, Configure):
                config, segment = dict(step.config), segment + 1
                out_steps.append({"step": "configure", "config": exporter.config_params(args, config)})
                continue
            if isinstance(step, Reset):
                epoch += 1
                out_steps.append({"step": "reset"})
                continue
            requests = []
            for item in step.items:
                q = resolve(item, resolved)
                exporter.check_request(args, q)
                key = oracle_key_str(q)
                if key not in memo:
                    memo[key] = baseline(q)
                    recorded = history.baselines.get(key) if history is not None else None
                    if recorded is not None and (tuple(recorded.output), recorded.finish_reason) != (
                            tuple(memo[key].output), memo[key].finish_reason):
                        raise UsageError(f"request {q.id}: the oracle now says {list(memo[key].output)}, the run "
                                         f"recorded {list(recorded.output)}; the checkpoints changed since the run")
                resolved[q.id] = (q, memo[key])
                requests.append({"id": q.id, "prompt": list(q.prompt), "max_tokens": q.max_tokens,
                                 "stop_ids": list(q.stop_ids), "identity": _identity(q),
                                 "expected": _expected(memo[key])})
            out_steps.append({"step": "batch", "index": index, "epoch": epoch, "segment": segment,
                              "hit_floor": max(caps.min_hit_prompt, caps.block_size,
                                               config_block_size(config, caps.block_size)),
                              "caching_off": caching_disabled(caps, config), "requests": requests})
            index += 1
    finally:
        close_oracle()
    failure = data.get("failure") if isinstance(data.get("failure"), dict) else {}
    return {
        "format": FORMAT,
        # argparse formats a description with %: a witness's own % signs must reach --help as text
        "description": (f"Standalone reproducer of kvparity witness {path.name} ({check}) on "
                        f"{target}.").replace("%", "%%"),
        "witness": {"file": path.name, "engine": named, "engine_args": dict(args), "check": check,
                    "case_id": failure.get("case_id"), "title": failure.get("title")},
        "tolerance": float(caps.tolerance), "eos_id": caps.eos_id,
        "positive_control": bool(caps.prefix_caching and caps.reports_cached_tokens),
        "at_rest": dict(SNAPSHOT_AT_REST),
        "steps": out_steps,
        "engine": exporter.engine_params(args),
    }
