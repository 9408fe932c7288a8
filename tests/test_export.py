"""`kvparity export`: standalone reproducers that need no kvparity.

The reproducers are run by a Python that *cannot* import kvparity: the venv's interpreter with `-S` (no
site processing, so the editable install's import hook never loads), its site-packages and a temporary
copy of `reference_engine/` on PYTHONPATH, and a clean working directory. The first test proves that
interpreter finds no `conformance` and no `adapters`. To keep CI cheap, the scripts of one test run in one
such process (`_run_all`: torch is imported once; each script still runs as `__main__` from its own file,
with its own argv), and one script also runs on its own as a plain command.

Fault zoo: every committed witness's reproducer fails with its fault and passes with `--fault none`.
transformers: the two committed findings reproduce under plain transformers. vLLM, llama.cpp: marked
`thirdparty`, skipped where the engine is not importable. HTTP: a fault-zoo witness against `kvparity serve`
(the reference engine behind an OpenAI-compatible server) with and without the fault.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from conformance.contract import UsageError
from kvparity.commands import export as exporting
from kvparity.commands.export import runtime
from tests.test_generated_files import public_reproducers

REPO = Path(__file__).resolve().parent.parent
ZOO = sorted(w for w in (REPO / "reports" / "fault-zoo" / "witnesses").glob("*.json")  # what export restates
             if json.loads(w.read_text())["check"] not in exporting.NOT_RESTATED
             and not any(r.get("arrive_at_step") is not None or r.get("abort_after") is not None
                         for s in json.loads(w.read_text())["steps"] for r in s.get("requests", ())))
TRANSFORMERS_RUN = REPO / "reports" / "transformers" / "20261130-145852" / "witnesses"
VLLM_WITNESS = REPO / "reports" / "vllm" / "lora-20261130-140204" / "witnesses" / "parity-40e0b84fa8.json"
LLAMA_WITNESS = REPO / "reports" / "llama_cpp" / "shared-ram-parity" / "witnesses" / "parity-4006517376.json"
KVPARITY_MODULES = ("kvparity", "conformance", "adapters")

_HARNESS = r'''
import contextlib, io, json, runpy, sys
for path, argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    sys.argv = [path, *argv]
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    lines = out.getvalue().strip().splitlines()
    print(json.dumps([code, lines[-1] if lines else ""]), flush=True)
'''


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """(command prefix, env, cwd) of an interpreter that has torch and a copy of reference_engine, not kvparity."""
    root = tmp_path_factory.mktemp("sandbox")
    shutil.copytree(REPO / "reference_engine", root / "lib" / "reference_engine",
                    ignore=shutil.ignore_patterns("__pycache__", "training"))
    (root / "cwd").mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "lib"), sysconfig.get_paths()["purelib"]])}
    return [sys.executable, "-S"], env, root / "cwd"


def _run_all(sandbox, runs: list[tuple[Path, list[str]]]) -> list[tuple[int, str]]:
    cmd, env, cwd = sandbox
    proc = subprocess.run([*cmd, "-c", _HARNESS, json.dumps([[str(p), a] for p, a in runs])], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(rows) == len(runs), proc.stdout[-2000:] + proc.stderr[-2000:]
    return [(int(c), str(t)) for c, t in rows]


def test_the_sandbox_cannot_import_kvparity(sandbox):
    cmd, env, cwd = sandbox
    probe = ("import importlib.util as u, json; "
             "print(json.dumps({m: u.find_spec(m) is not None for m in ('conformance', 'adapters', 'torch')} | "
             "{'reference_engine': u.find_spec('reference_engine').origin}))")
    seen = json.loads(subprocess.run([*cmd, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True,
                                     check=True).stdout)
    assert seen["conformance"] is False and seen["adapters"] is False and seen["torch"] is True
    assert not seen["reference_engine"].startswith(str(REPO)), seen  # the temporary copy, not the repository
    normal = subprocess.run([sys.executable, "-c", "import conformance, adapters"], capture_output=True)
    assert normal.returncode == 0  # the same interpreter with its site processing does find kvparity


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_runtime_and_every_driver_import_no_kvparity():
    """The checker is stdlib only; the templates import their engine and nothing of kvparity."""
    assert _imports(exporting.RUNTIME.read_text()) <= set(sys.stdlib_module_names)
    for name in exporting.EXPORTERS:
        found = _imports(exporting.exporter_for(name).DRIVER) - set(sys.stdlib_module_names)
        assert not found & set(KVPARITY_MODULES), (name, found)


@pytest.fixture(scope="module")
def zoo_scripts(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    return {w.stem: exporting.export(w, out / f"{w.stem}.py") for w in ZOO}


@pytest.fixture(scope="module")
def transformers_scripts(tmp_path_factory):
    if importlib.util.find_spec("transformers") is None:
        return {}
    out = tmp_path_factory.mktemp("transformers")
    return {name: exporting.export(TRANSFORMERS_RUN / f"{name}.json", out / f"{name}.py")
            for name in ("parity-f291db0373", "exercised-0379084d2b")}


@pytest.fixture(scope="module")
def verdicts(sandbox, zoo_scripts, transformers_scripts, tmp_path_factory):
    """Every sandboxed run of this module, in one process: {(script name, argv): (exit code, last line)}.
    The fault zoo with its fault and with --fault none, a script exported with fault=none, and the
    transformers findings."""
    fixed = exporting.export(ZOO[0], tmp_path_factory.mktemp("fixed") / "fixed.py", engine_args={"fault": "none"})
    runs = [(name, path, argv) for argv in ([], ["--fault", "none"]) for name, path in sorted(zoo_scripts.items())]
    runs += [("fixed", fixed, [])] + [(name, path, []) for name, path in sorted(transformers_scripts.items())]
    results = _run_all(sandbox, [(path, argv) for _, path, argv in runs])
    return {(name, tuple(argv)): result for (name, _, argv), result in zip(runs, results)}


def test_every_committed_witness_has_a_reproducer_that_imports_no_kvparity(zoo_scripts):
    assert len(zoo_scripts) == len(ZOO) >= 27  # one per fault of the zoo whose witness export restates
    for name, path in zoo_scripts.items():
        used = _imports(path.read_text()) - set(sys.stdlib_module_names)
        assert used == {"reference_engine", "torch"}, (name, used)
        assert "PLAN = load_plan(" in path.read_text()


def _plan_of(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    (call,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PLAN"]
    return json.loads(call.args[0].value)


def test_the_committed_reproducers_are_current(tmp_path):
    """reproducers/ holds the public set (the Makefile's PUBLIC_REPRODUCERS, linked from the reports) as
    `kvparity export` writes it today: the current checker and driver, and the same plan as a fresh export
    of its witness (else: `make reproducers-public`). The rest are generated on demand, never committed."""
    public = public_reproducers()  # that nothing else is committed: tests/test_generated_files.py
    checker = exporting._without_docstring(exporting.RUNTIME.read_text())
    for script, witness in public:
        path = REPO / script
        text = path.read_text()
        engine = _plan_of(path)["witness"]["engine"]
        assert checker in text and exporting.exporter_for(engine).DRIVER.strip("\n") in text, path
        compile(text, str(path), "exec")
        (tmp_path / script).parent.mkdir(parents=True, exist_ok=True)
        fresh = exporting.export(REPO / witness, tmp_path / script)
        assert _rounded(_located(_plan_of(path), path)) == _rounded(_located(_plan_of(fresh), fresh)), script


def _located(plan: dict, script: Path) -> dict:
    """The plan with its checkpoint folder resolved: the script stores it relative to where it was written."""
    engine = dict(plan.get("engine") or {})
    if isinstance(engine.get("checkpoints"), str):
        engine["checkpoints"] = str((script.parent / engine["checkpoints"]).resolve())
    return {**plan, "engine": engine}


def _rounded(value):
    """Margins to 9 digits: float64 sums differ in the last bits with the thread count."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_fault_zoo_reproducers_fail_with_the_fault_and_pass_without(verdicts):
    checks = {w.stem: json.loads(w.read_text())["check"] for w in ZOO}
    for name, check in checks.items():
        code, line = verdicts[(name, ())]
        claim = "parity" if check in runtime.OUTPUT_CHECKS else check
        assert code == 1 and line.startswith(f"FAILED [{claim}]"), (name, code, line)  # the witness's own claim
        code, line = verdicts[(name, ("--fault", "none"))]
        assert code == 0 and line.startswith("PASSED "), (name, code, line)


def test_a_fixed_engine_exported_as_such_passes(verdicts):
    """--engine-arg overrides the witness's arguments at export time (fault=none: the correct engine)."""
    assert verdicts[("fixed", ())][0] == 0


def test_a_bad_option_to_a_reproducer_is_exit_3(sandbox, zoo_scripts):
    """Run as a plain command (as the HTTP test runs its script too); argparse's usage error is "could
    not run" (3), never 1 (a finding) or argparse's 2."""
    cmd, env, cwd = sandbox
    bad = subprocess.run([*cmd, str(zoo_scripts["salt_ignored"]), "--no-such-option"], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 3 and "--no-such-option" in bad.stderr and bad.stdout == ""


def test_transformers_reproducers_reproduce_both_findings(transformers_scripts, verdicts):
    if not transformers_scripts:
        pytest.skip("transformers is not installed")
    for path in transformers_scripts.values():
        used = _imports(path.read_text())
        assert "transformers" in used and not used & set(KVPARITY_MODULES), used
    code, line = verdicts[("parity-f291db0373", ())]
    assert code == 1 and line.startswith("FAILED [parity] request r1") and "got [287, 294]" in line, line
    code, line = verdicts[("exercised-0379084d2b", ())]
    assert code == 1 and line.startswith("FAILED [exercised] request r2") and "reported 0 cached tokens" in line, line


# --------------------------------------------------------------------------- the checker's own logic


def _plan(requests, check="parity", tau=0.0, control=True):
    return {"witness": {"check": check}, "tolerance": tau, "eos_id": 2, "positive_control": control,
            "at_rest": {"blocks_in_use": 0}, "steps": [],
            "engine": {}, "description": "test"}


def _q(rid, prompt, expected, max_tokens=2, stop=(), salt=None, margins=None, runner_up=None):
    return {"id": rid, "prompt": list(prompt), "max_tokens": max_tokens, "stop_ids": list(stop),
            "identity": {"revision": "a", "adapter": None, "adapter_digest": None, "salt": salt},
            "expected": {"output": list(expected), "finish_reason": "length",
                         "margins": margins or [1.0] * len(expected), "runner_up": runner_up or [0] * len(expected)}}


def _r(output, cached=None, finish="length", evictions=None):
    return {"output": list(output), "finish_reason": finish, "cached_tokens": cached, "draft_proposed": None,
            "draft_accepted": None, "evictions": evictions}


def _batch(index, requests, epoch=1, segment=0, hit_floor=16):
    return {"step": "batch", "index": index, "epoch": epoch, "segment": segment, "hit_floor": hit_floor,
            "caching_off": False, "requests": requests}


def test_checker_passes_equal_outputs_and_fails_a_divergence_with_a_one_line_diff():
    c = runtime.Checker(_plan([]))
    c.batch(_batch(0, [_q("r0", [5, 6], [7, 8])]), [_r([7, 8], cached=0)], None)
    assert c.violations == []
    c.batch(_batch(1, [_q("r1", [5, 6], [7, 8])]), [_r([7, 9], cached=0)], None)
    assert [v[0] for v in c.violations] == ["parity"]
    assert "first divergent position 1: expected 8, got 9" in c.headline() and "\n" not in c.headline()


def test_checker_excuses_a_near_tie_only_below_tolerance_and_on_the_runner_up():
    q = _q("r0", [5], [7, 8], margins=[1.0, 1e-5], runner_up=[0, 9])
    tie = runtime.Checker(_plan([], tau=1e-3))
    tie.batch(_batch(0, [q]), [_r([7, 9])], None)
    assert tie.violations == [] and len(tie.near_ties) == 1
    strict = runtime.Checker(_plan([], tau=0.0))
    strict.batch(_batch(0, [q]), [_r([7, 9])], None)
    assert [v[0] for v in strict.violations] == ["parity"]


def test_checker_bounds_cached_tokens_by_same_identity_traffic_and_the_last_prompt_token():
    prompt = list(range(3, 20))
    c = runtime.Checker(_plan([]))
    c.batch(_batch(0, [_q("r0", prompt[:16], [7], max_tokens=1)]), [_r([7], cached=0)], None)
    c.batch(_batch(1, [_q("r1", prompt, [7], max_tokens=1, salt="t")]), [_r([7], cached=16)], None)
    assert [v[0] for v in c.violations] == ["isolation"] and "its KV was reused" in c.violations[0][1]
    ok = runtime.Checker(_plan([]))
    ok.batch(_batch(0, [_q("r0", prompt[:16], [7], max_tokens=1)]), [_r([7], cached=0)], None)
    ok.batch(_batch(1, [_q("r1", prompt, [7], max_tokens=1)]), [_r([7], cached=16)], None)
    assert ok.violations == []
    whole = runtime.Checker(_plan([]))
    whole.batch(_batch(0, [_q("r0", prompt, [7], max_tokens=1)]), [_r([7], cached=0)], None)
    whole.batch(_batch(1, [_q("r1", prompt, [7], max_tokens=1)]), [_r([7], cached=17)], None)
    assert [v[0] for v in whole.violations] == ["prefix_only"]


def test_checker_positive_control_wants_a_hit_on_an_exact_repeat_unless_evicted():
    prompt = list(range(3, 24))
    for evictions, expected in ((None, ["exercised"]), (3, [])):
        c = runtime.Checker(_plan([]))
        c.batch(_batch(0, [_q("r0", prompt, [7], max_tokens=1)]), [_r([7], cached=0)], None)
        c.batch(_batch(1, [_q("r1", prompt, [7], max_tokens=1)]), [_r([7], cached=0, evictions=evictions)], None)
        assert [v[0] for v in c.violations] == expected


def test_checker_accounting_and_pool_at_rest():
    c = runtime.Checker(_plan([], check="accounting"))
    c.batch(_batch(0, [_q("r0", [5], [7], max_tokens=2, stop=[7])]), [_r([7, 8], finish="length")],
            {"blocks_in_use": 1})
    claims = [v[0] for v in c.violations]
    assert "accounting" in claims and "rollback_hygiene" in claims and c.headline().startswith("[accounting]")


# --------------------------------------------------------------------------- usage errors


def test_bad_input_is_one_line_and_exit_3(tmp_path, capsys):
    assert exporting.main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.py")]) == 3
    witness = tmp_path / "w.json"
    witness.write_text(json.dumps({**json.loads(ZOO[0].read_text()), "engine": "evil.module:Class"}))
    assert exporting.main([str(witness), "--out", str(tmp_path / "x.py")]) == 3
    salted = REPO / "reports" / "fault-zoo" / "witnesses" / "salt_ignored.json"
    assert exporting.main([str(salted), "--out", str(tmp_path / "x.py"), "--engine", "transformers"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("kvparity export: error: ") for line in err), err
    assert "salt" in err[2] and not (tmp_path / "x.py").exists()


# --------------------------------------------------------------------------- real engines


def _venv_sandbox(python: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(tmp)),
           "PYTHONPATH": purelib, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return [str(python), "-S"], env


def _vllm_run(witness: Path, tmp_path: Path) -> tuple[int, str]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not importable here (run under .venv-vllm: adapters/thirdparty.sh)")
    path = exporting.export(witness, tmp_path / "vllm_repro.py")
    cmd, env = _venv_sandbox(Path(sys.executable), tmp_path)
    proc = subprocess.run([*cmd, str(path)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, lines[-1] if lines else proc.stderr[-500:]


@pytest.mark.thirdparty
def test_vllm_reproducer_reproduces_the_lora_finding(tmp_path):
    """The minimal case of finding 1 (reports/vllm/probes/lora-pair.json, the `lora-pair` probe's batches
    as a witness): a base-model request batched with LoRA requests answers with a LoRA applied. Run by
    vLLM's own Python, without kvparity: `FAILED [parity] request r3 (batch 2, ...): ... expected 32, got
    201` on 2026-12-01 (vllm-cpu 0.32.0)."""
    code, line = _vllm_run(REPO / "reports" / "vllm" / "probes" / "lora-pair.json", tmp_path)
    assert code == 1 and line.startswith("FAILED [parity]") and "expected 32, got" in line, line


@pytest.mark.thirdparty
def test_vllm_reproducer_of_the_suite_witness_reaches_a_verdict(tmp_path):
    """The suite's shrunk witness of the same finding. vLLM mixes adapters only in some runs (which batch
    order triggers it varies, reports/vllm/README.md): on 2026-12-01 this reproducer printed PASSED, and so
    did `kvparity replay` of the same witness. It must end in a verdict, never a crash."""
    code, line = _vllm_run(VLLM_WITNESS, tmp_path)
    assert (code, line[:7]) in ((0, "PASSED "), (1, "FAILED ")), line


@pytest.mark.thirdparty
def test_llama_cpp_reproducer_reproduces_the_cross_revision_cache_finding(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed here")
    from adapters import gguf_export as export_gguf

    export_gguf.export_all()
    path = exporting.export(LLAMA_WITNESS, tmp_path / "llama_repro.py")
    cmd, env = _venv_sandbox(Path(sys.executable), tmp_path)
    proc = subprocess.run([*cmd, str(path), "--gguf-dir", str(export_gguf.default_out_dir())], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1 and proc.stdout.strip().splitlines()[-1].startswith("FAILED ["), proc.stdout[-2000:]


def _serve(fault: str | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "kvparity.commands.serve", "--port", "0", "--max-seconds", "300"]
    proc = subprocess.Popen(cmd + (["--fault", fault] if fault else []), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail("kvparity serve did not start")


def test_http_reproducer_needs_only_the_standard_library(tmp_path):
    """An OpenAI-compatible server's reproducer, run by a Python with no site-packages at all (-S, no
    PYTHONPATH), against `kvparity serve` with the witness's fault planted and without it."""
    pytest.importorskip("aiohttp")
    path = exporting.export(REPO / "reports" / "fault-zoo" / "witnesses" / "salt_ignored.json",
                            tmp_path / "http_repro.py", engine="openai_http",
                            engine_args={"salt": "true", "reset": "endpoint"})
    assert _imports(path.read_text()) <= set(sys.stdlib_module_names)
    verdicts = []
    for fault in ("salt_ignored", None):
        server, url = _serve(fault)
        try:
            proc = subprocess.run([sys.executable, "-S", "-E", str(path), "--base-url", url], cwd=tmp_path,
                                  env={"PATH": os.environ.get("PATH", "")}, capture_output=True, text=True, timeout=120)
        finally:
            server.terminate()
            server.wait(timeout=30)
        verdicts.append((proc.returncode, proc.stdout.strip()))
    (c1, l1), (c2, l2) = verdicts
    assert c1 == 1 and l1.startswith("FAILED [isolation] request r"), l1  # the id is the witness's own
    assert c2 == 0 and l2.startswith("PASSED "), l2


def test_a_witness_with_requests_mid_flight_is_refused_not_exported_as_a_passing_script(tmp_path):
    """The reproducer submits whole batches: a witness whose requests arrive or abort mid-flight would run
    another scenario there and could print PASSED with the bug on, so export refuses it in one line."""
    timed = [w for w in (REPO / "reports" / "fault-zoo" / "witnesses").glob("*.json")
             if any(r.get("abort_after") is not None or r.get("arrive_at_step") is not None
                    for s in json.loads(w.read_text())["steps"] for r in s.get("requests", ()))]
    assert timed, "the zoo commits mid-flight witnesses (abort_double_release and its kin)"
    with pytest.raises(UsageError, match="mid-flight cannot be exported"):
        exporting.export(timed[0], tmp_path / "repro.py")
    assert not (tmp_path / "repro.py").exists()


def test_the_run_history_beside_a_witness_is_read_as_report_reads_it(tmp_path, capsys):
    """Export takes the engine's capabilities and the recorded baselines from the run's history beside a
    witness. It read that history without the checks `kvparity report` applies: a string block size there
    went into the reproducer's plan, and a script was written. Now it is read as `report` reads one (types,
    example sizes, chain and results.json digest): one line, exit 3, no script. The committed run folder,
    unedited, still reads."""
    import gzip

    from kvparity.commands.export.plan import _history

    run = tmp_path / "run"
    shutil.copytree(TRANSFORMERS_RUN.parent, run)
    witness = run / "witnesses" / "parity-f291db0373.json"
    assert _history(witness).capabilities.block_size == 16  # the unedited (legacy) history reads
    with gzip.open(run / "history.jsonl.gz", "rt") as fh:
        events = [json.loads(line) for line in fh]
    events[0]["capabilities"]["block_size"] = "16"
    with gzip.open(run / "history.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in events))
    assert exporting.main([str(witness), "--out", str(tmp_path / "x.py")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvparity export: error: "), err
    assert "block_size is '16', not an integer" in err[0]
    assert not (tmp_path / "x.py").exists()
