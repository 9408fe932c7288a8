"""Witnesses, histories and calibrations are read as hostile input (issue 26, part 6).

Each probe of /work/shared/probes/reliability-2026-12-03 (main 1621583) is reproduced here: a witness
whose `base_url` sends replay traffic to any host, a configure step with `pool_tokens=10**12`, a file too
big to read, and JSON nested 100,000 deep (a RecursionError traceback). Each must now be refused with
one line and exit 3, before it costs memory or reaches an engine. The FAKE engine (tests/fake_engine.py)
is the suite's test double; the reference engine and the openai_http adapter are the real ones.
"""

from __future__ import annotations

import http.server
import json
import os
import resource
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from conformance import untrusted
from conformance.history import read_events as untrusted_read_events
from kvparity.cli import main
from conformance.contract import UsageError

ROOT = Path(__file__).resolve().parents[1]
FAKE = "fake_engine:FakeDictEngine"
DEEP = 100_000
BATCH = {"step": "batch", "requests": [{"id": "r0", "prompt": [5, 6, 7, 8, 9], "max_tokens": 2}]}

# Every socket connection this process makes while `_CONNECTS` is watching (an audit hook observes the
# real socket module; nothing is replaced). Hooks cannot be removed, so it records only when asked.
_CONNECTS: list[tuple] = []
_WATCHING = [False]


def _audit(event: str, args: tuple) -> None:
    if _WATCHING[0] and event == "socket.connect":
        _CONNECTS.append(args[1])


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # keep .hypothesis/ out of the repository


def witness(tmp_path: Path, name: str = "w.json", **changes) -> Path:
    data = {"kvparity_witness": 1, "engine": "reference", "engine_args": {}, "check": "parity",
            "steps": [BATCH], **changes}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def subprocess_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m kvparity ...` with memory capped at 3 GiB, so a regression fails the test instead of
    exhausting a machine (the pool_tokens probe grew to 2 GB in 30 s)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-m", "kvparity", *argv], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, env=env)


# --------------------------------------------------------------------------- where traffic goes


class _Listener(http.server.BaseHTTPRequestHandler):
    """The probe's listener: logs each request and answers every one with a model list."""

    seen: list[str] = []

    def _log(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        type(self).seen.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"data": [{"id": "m"}]}).encode())

    do_GET = do_POST = _log

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def listener():
    """An HTTP listener on 127.0.0.2, another loopback address: (url, the requests it saw)."""
    _Listener.seen = []
    server = http.server.HTTPServer(("127.0.0.2", 0), _Listener)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.2:{server.server_address[1]}", _Listener.seen
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("url", ["http://192.0.2.1:8000", "http://10.255.255.1", "http://evil.example:80/v1",
                                 "http://127.0.0.1@192.0.2.1/", "http://127.0.0.1.nip.io"])
def test_a_witness_base_url_off_this_machine_is_refused_before_any_connection(tmp_path, capsys, url):
    path = witness(tmp_path, engine="openai_http", engine_args={"base_url": url})
    _CONNECTS.clear()
    _WATCHING[0] = True
    try:
        code = main(["replay", str(path), "--timeout", "5"])
    finally:
        _WATCHING[0] = False
    err = one_line_error(capsys)
    assert code == 3 and _CONNECTS == []
    assert "base_url=" in err and "not this machine" in err and "--engine-arg base_url=URL" in err


def test_a_witness_base_url_on_another_loopback_address_is_used(tmp_path, capsys, listener):
    url, seen = listener
    path = witness(tmp_path, engine="openai_http", engine_args={"base_url": url})
    main(["replay", str(path), "--timeout", "10"])  # the listener is no engine: whatever the verdict, it was asked
    assert seen and seen[0] == "GET /v1/models"
    assert "not this machine" not in capsys.readouterr().err


def test_the_users_own_engine_arg_replaces_a_remote_base_url(tmp_path, capsys, listener):
    url, seen = listener
    path = witness(tmp_path, engine="openai_http", engine_args={"base_url": "http://192.0.2.1:8000"})
    main(["replay", str(path), "--timeout", "10", "--engine-arg", f"base_url={url}"])
    assert seen and "not this machine" not in capsys.readouterr().err


@pytest.mark.parametrize("args", [{"base_url": "http://localhost:8000"}, {"base_url": "http://[::1]:8000/v1"},
                                  {"base_url": "http://127.255.0.9"}, {"host": "127.0.0.1:9000"},
                                  {"base_url": "http://[::ffff:127.0.0.1]:1"}, {"base_url": ""},
                                  {"serve": "kvparity", "model": "/tmp/ckpt", "extra_body": '{"a": 1}'}])
def test_loopback_and_hostless_arguments_pass(args):
    assert untrusted.refuse_remote_hosts(args, {}, "w.json") is None  # raises UsageError when it refuses


@pytest.mark.parametrize("args", [{"host": "10.0.0.1"}, {"endpoint": "gpu-box:8000"}, {"base_url": "0.0.0.0:80"},
                                  {"extra_body": '{"callback": "https://192.0.2.7/x"}'},
                                  {"api_url": "//192.0.2.1/v1"}, {"base_url": "http://127.1:80"},
                                  {"base_url": "http://user:pw@localhost:80"}])
def test_remote_or_unclear_hosts_in_any_argument_are_refused(args):
    with pytest.raises(UsageError, match="may only name loopback hosts"):
        untrusted.refuse_remote_hosts(args, {}, "w.json")
    untrusted.refuse_remote_hosts(args, dict(args), "w.json")  # the user's own value is the user's choice


def test_export_refuses_a_remote_base_url_too(tmp_path, capsys):
    from kvparity.commands.export import main as export_main

    path = witness(tmp_path, engine="openai_http", engine_args={"base_url": "http://192.0.2.1:8000"})
    assert export_main([str(path), "--out", str(tmp_path / "repro.py")]) == 3
    assert "not this machine" in one_line_error(capsys)
    assert not (tmp_path / "repro.py").exists()


# --------------------------------------------------------------------------- the declared config space


def test_a_configure_off_the_declared_space_never_reaches_the_engine(tmp_path):
    """The probe: pool_tokens=10**12 made the reference engine allocate 2 GB in 30 s."""
    path = witness(tmp_path, steps=[{"step": "configure", "config": {"pool_tokens": 10**12}}, BATCH])
    proc = subprocess_cli("replay", str(path), "--timeout", "30")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"pool_tokens={10**12}, not one of the engine's declared values (4096, 64, 256)" in err


def test_export_writes_no_configure_the_engine_does_not_declare(tmp_path, capsys):
    """`replay` refused pool_tokens=10**12; `export` wrote it into the reproducer as num_blocks
    62,500,000,000 (a helper's hunt), the allocation replay guards against, left for whoever runs it."""
    from kvparity.commands.export import main as export_main

    path = witness(tmp_path, steps=[{"step": "configure", "config": {"pool_tokens": 10**12}}, BATCH])
    assert export_main([str(path), "--out", str(tmp_path / "repro.py")]) == 3
    assert f"pool_tokens={10**12}, not one of the engine's declared values" in one_line_error(capsys)
    assert not (tmp_path / "repro.py").exists()


def test_an_undeclared_knob_is_refused_and_a_declared_value_replays(tmp_path, capsys):
    bad = witness(tmp_path, "bad.json", engine=FAKE,
                  steps=[{"step": "configure", "config": {"num_blocks": 1}}, BATCH])
    assert main(["replay", str(bad), "--engine", FAKE]) == 3
    assert "knob 'num_blocks', which the engine does not declare" in one_line_error(capsys)
    good = witness(tmp_path, "good.json", steps=[{"step": "configure", "config": {"cache_blocks": 6}}, BATCH])
    assert main(["replay", str(good), "--engine", FAKE]) in (0, 2)


def test_config_values_compare_as_json(tmp_path):
    space = {"k": (3, 1), "drafter": ("none", "ngram"), "on": (True,)}
    untrusted.check_config({"k": 1, "drafter": "ngram", "on": True}, space, "w")
    for config in ({"k": "1"}, {"k": True}, {"on": 1}, {"k": [1]}):
        with pytest.raises(UsageError, match="not one of the engine's declared values"):
            untrusted.check_config(config, space, "w")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run folder of the FAKE engine, to tamper with."""
    base = tmp_path_factory.mktemp("run")
    cwd = os.getcwd()
    os.chdir(base)
    try:
        main(["run", "--engine", FAKE, "--report-dir", str(base / "reports"), "--seed", "3", "--max-examples", "4",
              "--checks", "parity", "-q"])
    finally:
        os.chdir(cwd)
    (folder,) = [p for p in (base / "reports").glob("*/*") if p.is_dir()]
    return folder


def unchained(line: str) -> str:
    """A history line as kvparity wrote it before histories were hash-chained (tests/test_history_chain.py
    pins the chain itself; here the reader's own guards are what is tested)."""
    event = json.loads(line)
    for key in ("chain", "events", "sealed"):
        event.pop(key, None)
    return json.dumps(event)


def tampered(run_dir: Path, tmp_path: Path, lines: list[str]) -> Path:
    """A legacy (unchained) copy of `run_dir`'s history with `lines` inserted after its run_start."""
    out = tmp_path / "run"
    out.mkdir(parents=True)
    first, *rest = map(unchained, (run_dir / "history.jsonl").read_text().splitlines())
    (out / "history.jsonl").write_text("\n".join([first, *lines, *rest]) + "\n")
    return out


def test_a_history_configuring_off_its_declared_space_is_refused(run_dir, tmp_path, capsys):
    assert main(["report", str(tampered(run_dir, tmp_path, []))]) == 0  # the copy alone reads as it did
    capsys.readouterr()
    folder = tampered(run_dir, tmp_path / "t", ['{"event":"example","index":0}',
                                                '{"event":"config","config":{"cache_blocks":1000000000000}}'])
    assert main(["report", str(folder)]) == 3
    assert "cache_blocks=1000000000000, not one of the engine's declared values" in one_line_error(capsys)


TURN = {"kind": "Continuation", "id": "r1", "parent": "r0", "extra": [5], "max_tokens": 3}


@pytest.mark.parametrize("steps, check, said", [
    ('[{"step": "batch", "requests": [{"id": "r0", "prompt": [5, 6], "max_tokens": Infinity}]}]', "parity",
     "cannot convert float infinity"),
    ('[{"step": "batch", "requests": ["r0"]}]', "parity", "bad steps"),
    ('[{"step": "batch", "requests": [{"id": ["r0"], "prompt": [5, 6], "max_tokens": 2}]}]', "parity", "list id"),
    (json.dumps([BATCH, {"step": "batch", "requests": [{**TURN, "restop": "x"}]}]), "parity", "str restop"),
    (json.dumps([BATCH]), '["parity"]', "its check is list"),
])
def test_a_witness_of_odd_types_is_one_line_exit_3(tmp_path, capsys, steps, check, said):
    """Each was a traceback (OverflowError, AttributeError, TypeError mid-replay, AttributeError in the
    check's lookup): the step reader passed ids, restop and the check on unconverted, and Python's JSON
    reads Infinity."""
    path = tmp_path / "odd.json"
    path.write_text('{"kvparity_witness": 1, "engine": "reference", "engine_args": {}, "check": '
                    + (check if check.startswith("[") else json.dumps(check)) + ', "steps": ' + steps + "}")
    assert main(["replay", str(path)]) == 3
    assert said in one_line_error(capsys)


# --------------------------------------------------------------------------- size


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)  # no disk blocks: a hole the size of the cap and one byte
    return path


def peak_bytes(fn) -> tuple[int, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_oversized_witness_is_refused_without_reading_it(tmp_path, capsys):
    path = sparse(tmp_path / "big.json", untrusted.MAX_WITNESS_BYTES + 1)
    code, peak = peak_bytes(lambda: main(["replay", str(path)]))
    assert code == 3 and peak < 8 << 20  # reading it would take > 16 MiB; the probe's 1 GB witness took 3.6 GB
    assert "over the 16 MiB a witness may be; refused without reading it" in one_line_error(capsys)


def test_a_witness_that_is_no_regular_file_is_refused(capsys):
    assert main(["replay", "/dev/zero"]) == 3  # stat says 0 bytes; reading it would never end
    assert "is not a regular file" in one_line_error(capsys)


def test_an_oversized_history_is_refused_without_reading_it(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    sparse(tmp_path / "run" / "history.jsonl", untrusted.MAX_HISTORY_BYTES + 1)
    code, peak = peak_bytes(lambda: main(["report", str(tmp_path / "run")]))
    assert code == 3 and peak < 8 << 20  # imports included; reading it would take > 1 GiB
    assert "over the 1024 MiB a history may be" in one_line_error(capsys)


def test_a_gzipped_history_of_one_endless_line_is_refused_without_holding_it(tmp_path, capsys):
    """A committed-style history.jsonl.gz that decompresses to a 320 MB line: refused in one line, the
    memory bounded by the 64 MiB a line may be (it was read up to the whole history cap)."""
    import gzip

    (tmp_path / "run").mkdir()
    with gzip.open(tmp_path / "run" / "history.jsonl.gz", "wb", compresslevel=1) as fh:
        for _ in range(20):
            fh.write(b"x" * (16 * untrusted.MIB))
    code, peak = peak_bytes(lambda: main(["report", str(tmp_path / "run")]))
    assert code == 3 and peak < 192 * untrusted.MIB, peak  # the old reading held 256 MiB and more
    assert "has a line over the 64 MiB a line may be" in one_line_error(capsys)


def _gzipped(path: Path, line: bytes, total: int) -> Path:
    import gzip

    with gzip.open(path, "wb", compresslevel=1) as fh:
        chunk = line * (untrusted.MIB // len(line))
        for _ in range(total // len(chunk) + 1):
            fh.write(chunk)
    return path


def test_a_gzipped_history_of_tiny_lines_is_measured_before_any_is_parsed(tmp_path, capsys):
    """A few MB of gzip that decompress to over 1 GiB of 14-byte events: each parsed is a ~290-byte dict,
    so parsing up to the cap before noticing it would take ~20 GB. Measured first, then refused."""
    (tmp_path / "run").mkdir()
    _gzipped(tmp_path / "run" / "history.jsonl.gz", b'{"event":"x"}\n', untrusted.MAX_HISTORY_BYTES)
    code, peak = peak_bytes(lambda: main(["report", str(tmp_path / "run")]))
    assert code == 3 and peak < 32 * untrusted.MIB, peak
    assert "decompresses to more than 1024 MiB" in one_line_error(capsys)


def test_a_history_that_does_not_start_with_run_start_is_refused_at_its_first_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / "history.jsonl", "w") as fh:
        fh.write('{"event":"x"}\n' * 2_000_000)  # 28 MB: ~600 MB of dicts, had they all been parsed first
    code, peak = peak_bytes(lambda: main(["report", str(tmp_path / "run")]))
    assert code == 3 and peak < 32 * untrusted.MIB, peak
    assert "does not start with a run_start event" in one_line_error(capsys)


def test_a_damaged_gzipped_history_is_one_line_and_exit_3(tmp_path, capsys):
    """zlib.error (damaged deflate data) is neither an OSError nor an EOFError: it crashed the reader."""
    import gzip

    (tmp_path / "run").mkdir()
    packed = gzip.compress(b"".join(b'{"event":"run_start","n":%d}\n' % i for i in range(20000)))
    broken = packed[:len(packed) // 2] + bytes(b ^ 0x55 for b in packed[len(packed) // 2:len(packed) // 2 + 64]) \
        + packed[len(packed) // 2 + 64:]
    (tmp_path / "run" / "history.jsonl.gz").write_bytes(broken)
    assert main(["report", str(tmp_path / "run")]) == 3
    assert "is not a readable gzip file" in one_line_error(capsys)


def test_a_line_broken_by_a_lone_cr_at_the_end_is_not_torn(tmp_path):
    lines = list(untrusted.capped_lines(_write(tmp_path / "h", b'{"a":1}\r{"b":2}\r'), untrusted.MIB, "history", 10))
    assert lines == [('{"a":1}', True), ('{"b":2}', True)]
    lines = list(untrusted.capped_lines(_write(tmp_path / "h", b'{"a":1}\r\n{"b":2'), untrusted.MIB, "history", 10))
    assert lines == [('{"a":1}', True), ('{"b":2', False)]  # no line break after it: torn


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_long_shard_s_history_is_read_line_by_line_past_the_old_cap(tmp_path):
    """A 10,000-example nightly shard wrote a 357 MB history, over the 256 MiB cap a history had, so
    `kvparity merge` and `kvparity report` refused a correct engine's long shard as an error. The cap is
    1 GiB now, and the history is read a line at a time (its text was held whole, then split)."""
    path = tmp_path / "history.jsonl"
    pad = "x" * 4000
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"event": "run_start", "engine": "e"}) + "\n")
        for i in range(310 * 256):  # over 300 MiB
            fh.write(json.dumps({"event": "example", "index": i, "pad": pad}) + "\n")
    assert path.stat().st_size > 300 * untrusted.MIB
    events, problems = untrusted_read_events(path)
    path.unlink()  # pytest keeps the last runs' folders: not 310 MB of them
    assert problems == [] and len(events) == 1 + 310 * 256


def test_the_caps_fit_every_committed_file():
    """Real use: every witness and history in reports/ is far inside the caps."""
    histories = list((ROOT / "reports").rglob("history.jsonl*"))  # committed ones are gzipped
    witnesses = list((ROOT / "reports").rglob("witnesses/*.json"))
    assert histories and witnesses
    sizes = [sum(len(line) for line, _ in untrusted.capped_lines(p, untrusted.MAX_HISTORY_BYTES, "history",
                                                                   untrusted.MAX_HISTORY_EVENTS)) for p in histories]
    assert max(sizes) * 16 < untrusted.MAX_HISTORY_BYTES
    assert max(p.stat().st_size for p in witnesses) * 100 < untrusted.MAX_WITNESS_BYTES


@pytest.mark.parametrize("noise, flips", [("[[0.001, 1000000000000]]", "0"), ("[[0.001, 1000001]]", "0"),
                                          ("[[0.001, Infinity]]", "0"), ("[[0.001, 5]]", "Infinity")])
def test_a_calibration_s_counts_are_bounded_not_trusted(tmp_path, capsys, noise, flips):
    """plain_noise is stored as [value, count] pairs and expanded: a count of 10**12 was a MemoryError
    traceback, 3*10**8 took 4.7 GB and 31 s and passed, and Infinity (which Python's JSON reads) an
    OverflowError traceback. Now each is one line, exit 3, before any engine starts."""
    cal = json.loads((ROOT / "reports" / "calibration" / "reference.json").read_text())
    text = json.dumps({**cal, "plain_noise": "@noise", "plain_near_ties": {"flips": "@flips", "steps": 10752}})
    (tmp_path / "cal.json").write_text(text.replace('"@noise"', noise).replace('"@flips"', flips))
    assert main(["run", "--engine", FAKE, "--calibration", str(tmp_path / "cal.json")]) == 3
    assert "--calibration" in one_line_error(capsys)


def test_an_example_larger_than_the_suite_draws_is_refused_before_it_is_judged(run_dir, tmp_path, capsys):
    """Judging an example is quadratic in its size: one of 4,000 one-request batches (a 3.4 MB history, its
    chain intact) took `kvparity report` 131 s, and a witness of 50,000 requests still replayed after 5 min."""
    submit = '{"event":"submit","requests":[{"id":"x%d","prompt":[5,6,7,8,9],"max_tokens":1}]}'
    batch = '{"event":"batch","results":[{"request_id":"x%d","output":[7],"finish_reason":"length"}]}'
    lines = [line % k for k in range(untrusted.MAX_EXAMPLE_REQUESTS + 1) for line in (submit, batch)]
    assert main(["report", str(tampered(run_dir, tmp_path, lines))]) == 3
    assert "example 0 holds 501 steps and 501 requests, over the 500 and 500" in one_line_error(capsys)
    path = witness(tmp_path, steps=[{"step": "reset"}] * (untrusted.MAX_EXAMPLE_STEPS + 1))
    assert main(["replay", str(path)]) == 3
    assert "holds 501 steps and 0 requests" in one_line_error(capsys)


def test_infinity_in_a_legacy_history_is_one_line_exit_3(run_dir, tmp_path, capsys):
    """Python's JSON reads Infinity; the chain refuses it (it writes no such number), but a legacy history
    has no chain, and int(Infinity) was an OverflowError traceback in `report` and `merge`."""
    lines = ['{"event":"submit","requests":[{"id":"x","prompt":[5,6],"max_tokens":Infinity}]}',
             '{"event":"batch","results":[{"request_id":"x","output":[7],"finish_reason":"length"}]}']
    assert main(["report", str(tampered(run_dir, tmp_path, lines))]) == 3
    assert "not a readable kvparity history: OverflowError" in one_line_error(capsys)


def _first(events: list, kind: str) -> dict:
    return next(e for e in events if e["event"] == kind)


ODD_VALUES = {  # one value of the wrong type, where the checks (not the reader) met it: each was a traceback
    "a string count": (lambda evs: _first(evs, "batch")["results"][0].update(prefill_chunks="x"), "prefill_chunks"),
    "a list id": (lambda evs: [q.update(id=["a"]) for q in _first(evs, "submit")["requests"]]
                  and _first(evs, "batch")["results"][0].update(request_id=["a"]), "request id"),
    "a string tolerance": (lambda evs: evs[0]["capabilities"].update(tolerance="x"), "tolerance"),
    "a list engine_args": (lambda evs: evs[0].update(engine_args=[1]), "engine_args"),
    "checks of numbers": (lambda evs: evs[0].update(checks=[1, 2]), "checks"),
    "a string duration": (lambda evs: _first(evs, "run_end").update(duration_s="x"), "duration_s"),
    "a string engine time": (lambda evs: _first(evs, "run_end").update(engine_s="x"), "engine_s"),
    "an int finish_reason": (lambda evs: _first(evs, "batch")["results"][0].update(finish_reason=5), "finish_reason"),
    "a string snapshot": (lambda evs: _first(evs, "reset").update(snapshot="x"), "AttributeError"),
    "an int baseline key": (lambda evs: _first(evs, "baseline").update(key=7), "AttributeError"),
}


@pytest.mark.parametrize("case", list(ODD_VALUES))
def test_a_history_of_odd_types_is_one_line_exit_3(run_dir, tmp_path, capsys, case):
    """A history whose chain was recomputed after an edit passes the chain (it has no secret); a legacy one
    has none. A value of another type than a run writes reached the checks, and `kvparity report` ended in
    a traceback and "internal error" (11 of 55 single-field edits, a helper's hunt). Now the reader checks
    the types the checks rely on: one line naming the field, exit 3."""
    edit, named = ODD_VALUES[case]
    events = [json.loads(unchained(line)) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    edit(events)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["report", str(folder)]) == 3
    assert named in one_line_error(capsys)


# --------------------------------------------------------------------------- depth


def deep(n: int = DEEP) -> str:
    return "[" * n + "]" * n


def test_a_deeply_nested_witness_is_one_line_exit_3(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"kvparity_witness": 1, "engine": "reference", "check": "parity", "steps": ' + deep() + "}")
    assert main(["replay", str(path)]) == 3
    assert "JSON nested deeper than 100 levels" in one_line_error(capsys)


def test_a_deeply_nested_history_line_is_one_line_exit_3(run_dir, tmp_path, capsys):
    folder = tampered(run_dir, tmp_path, ['{"event":"example","index":0,"x":' + deep() + "}"])
    assert main(["report", str(folder)]) == 3
    err = one_line_error(capsys)
    assert "history.jsonl line 2: JSON nested deeper than 100 levels" in err


def test_a_deeply_nested_baseline_key_is_one_line_exit_3(run_dir, tmp_path, capsys):
    key = json.dumps(deep())  # a string holding brackets, read as a legacy JSON key
    folder = tampered(run_dir, tmp_path, ['{"event":"baseline","key":' + key + ',"baseline":{"output":[],"finish_reason":"eos"}}'])
    assert main(["report", str(folder)]) == 3
    assert "a baseline key: JSON nested deeper" in one_line_error(capsys)


def test_a_deeply_nested_calibration_is_refused_before_the_engine(tmp_path, capsys):
    (tmp_path / "cal.json").write_text(deep())
    assert main(["run", "--engine", FAKE, "--calibration", str(tmp_path / "cal.json")]) == 3
    assert "--calibration" in one_line_error(capsys)


def test_a_deeply_nested_results_json_is_ignored_as_unreadable(run_dir, tmp_path, capsys):
    folder = tampered(run_dir, tmp_path, [])
    (folder / "results.json").write_text(deep())
    assert main(["report", str(folder)]) == 0
    assert json.loads((folder / "reanalysis" / "results.json").read_text())["verdict"] == "pass"


def test_the_deeply_nested_witness_cannot_crash_export(tmp_path, capsys):
    from kvparity.commands.export import main as export_main

    path = tmp_path / "deep.json"
    path.write_text(deep())
    assert export_main([str(path), "--out", str(tmp_path / "repro.py")]) == 3
    assert "JSON nested deeper than 100 levels" in one_line_error(capsys)


def test_brackets_inside_strings_do_not_count_and_the_scan_is_exact():
    text = json.dumps({"cause": "[" * 500, "a": [[[{"b": "]]]}"}]]], "c": '\\"[[[['})
    assert untrusted.json_depth(text, limit=0) == 5  # the object, three lists, the inner object
    assert untrusted.loads(text, "x")["a"][0][0][0]["b"] == "]]]}"
    nested: object = 1
    for _ in range(untrusted.MAX_DEPTH):
        nested = [nested]
    assert untrusted.loads(json.dumps(nested), "x") == nested  # exactly at the cap: read
    with pytest.raises(UsageError, match="deeper than 100"):
        untrusted.loads(json.dumps([nested]), "x")
