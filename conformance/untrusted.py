"""Reading files and values that someone else may have written: witnesses, histories, calibrations.

A witness is sent around in bug reports and a run folder is copied between machines, so kvparity reads
them as hostile input (issue 26): whatever is in them is refused with one line (a `UsageError`, exit 3)
before it costs memory, crashes the reader or reaches an engine. What is checked here:

- size: a file is measured before it is read, and at most `cap + 1` bytes are ever read (a file that
  grows, or a device such as /dev/zero, cannot make the read unbounded). A 1 GB witness used to take
  3.6 GB of memory to be refused. A history is read a line at a time, each line bounded, its events
  counted (a gzipped one is measured decompressed before any line is parsed);
- depth: JSON nested deeper than `MAX_DEPTH` is refused by a scan of its brackets outside strings,
  *before* `json.loads` recurses (100,000 nested lists were a RecursionError traceback);
- hosts: engine arguments a witness carries that name a host (`base_url=`, `host=`, any `scheme://`)
  must name this machine (loopback), else replay traffic would go wherever the file says. The user's own
  `--engine-arg` for the same name replaces the witness's value and is not checked: the command line
  is trusted, the file is not;
- configurations: a `configure` step may only choose values the engine declares in its
  `config_space`; `pool_tokens=10**12` in a witness made the reference engine allocate for minutes.

The caps fit real use with a wide margin: committed witnesses are tens of KB, a history 2-36 KB an
example (a 10,000-example nightly shard wrote 357 MB), and nothing kvparity writes nests deeper than
about ten levels.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from conformance.contract import UsageError

MIB = 1 << 20
MAX_WITNESS_BYTES = 16 * MIB  # witnesses, calibrations, results.json: tens to hundreds of KB in use
# A history is read line by line (never held whole as text): 2-36 KB an example in the committed runs, so
# 1 GiB is a shard of ~30,000-500,000 examples, whose parsed events need several GiB of memory to judge.
MAX_HISTORY_BYTES = 1024 * MIB
MAX_LINE_BYTES = 64 * MIB  # one event: a batch with its results and snapshot is KBs to a few MB
# Parsed, an event costs up to ~20x its line (a 14-byte line is a ~290-byte dict): the count bounds the
# memory a file of tiny lines takes, far above a real run's 10-50 events an example.
MAX_HISTORY_EVENTS = 4_000_000
MAX_DEPTH = 100  # kvparity writes ~10 levels; json.loads recurses once per level
# One example (a witness, an example of a history): judging it compares its requests pairwise (what each
# earlier one made cacheable, every two runs of one request), so its cost grows with the square of its size.
# A nightly run of the FAKE engine (400 examples) held at most 25 steps and 41 requests an example.
MAX_EXAMPLE_STEPS = 500
MAX_EXAMPLE_REQUESTS = 500

# --------------------------------------------------------------------------- size


def _too_big(path: Path, what: str, size: int | str, cap: int) -> UsageError:
    return UsageError(f"{what} {path} is {size} bytes, over the {cap // MIB} MiB a {what} may be; "
                      f"refused without reading it")


def read_capped(path: str | os.PathLike[str], cap: int, what: str) -> str:
    """The text of `path`, refused (one-line UsageError) when it is not a regular file or is larger
    than `cap` bytes. The size is checked before reading and the read itself is bounded, so neither a
    huge file nor one that grows meanwhile is ever held whole. OSError (missing, unreadable) is left to
    the caller, which knows how to say what the file should have been."""
    path = Path(path)
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise UsageError(f"{what} {path} is not a regular file")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > cap:
            raise _too_big(path, what, size, cap)
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise _too_big(path, what, f"more than {cap}", cap)
    return data.decode("utf-8")


def capped_lines(path: str | os.PathLike[str], cap: int, what: str,
                 max_lines: int) -> Iterable[tuple[str, bool]]:
    """The lines of `path` (a `.gz` one decompressed), each as (text, ended by a line break), read one at a
    time so the text is never held whole; refused (one-line UsageError) when it is not a regular file,
    holds more than `cap` bytes (a gzipped one measured decompressed, before its first line is given),
    a line over `MAX_LINE_BYTES` or more than `max_lines` lines. A line break is \\n, \\r\\n or a lone
    \\r. Undecodable bytes are replaced: the caller reads the line as JSON, which refuses them."""
    path, info = Path(path), os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{what} {path} is not a regular file")
    if path.name.endswith(".gz"):
        _refuse_gzip_over(path, cap, what)  # a gzip bomb is refused before anything of it is parsed
    elif info.st_size > cap:
        raise _too_big(path, what, info.st_size, cap)
    seen = lines = 0
    with _opened(path) as fh:
        while raw := _gz_read(path, what, lambda: fh.readline(min(cap - seen, MAX_LINE_BYTES) + 1)):
            seen, lines = seen + len(raw), lines + 1
            if lines > max_lines:
                raise UsageError(f"{what} {path} has over {max_lines:,} lines; refused")
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(f"{what} {path} has a line over the {MAX_LINE_BYTES // MIB} MiB a line may be; "
                                 "refused")
            if seen > cap:
                raise _too_big(path, what, f"more than {cap}", cap)
            ended = raw.endswith((b"\n", b"\r"))
            parts = raw.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r").split("\r")
            for k, part in enumerate(parts):
                yield part, ended or k < len(parts) - 1


def _opened(path: Path) -> Any:
    import gzip

    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _gz_read(path: Path, what: str, read: Any) -> bytes:
    """`read()`, a damaged or cut gzip stream refused in one line (zlib.error is neither an OSError nor
    an EOFError); a plain file's OSError is left to the caller."""
    import zlib

    try:
        return read()
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError; EOFError: cut short
        if not path.name.endswith(".gz"):
            raise
        raise UsageError(f"{what} {path} is not a readable gzip file: {exc}") from None


def _refuse_gzip_over(path: Path, cap: int, what: str) -> None:
    """Refuse a gzip file that decompresses to more than `cap` bytes (read in chunks, thrown away)."""
    size = 0
    with _opened(path) as fh:
        while chunk := _gz_read(path, what, lambda: fh.read(MIB)):
            size += len(chunk)
            if size > cap:
                raise UsageError(f"{what} {path} decompresses to more than {cap // MIB} MiB; refused")


def check_example_size(steps: int, requests: int, where: str) -> None:
    """Refuse an example larger than any the suite draws, before it is judged or replayed: a history's
    example of 4,000 one-request batches (3.4 MB) took `kvparity report` 131 s, and a witness of 50,000
    requests was still replaying after 5 minutes, every engine call within its timeout."""
    if steps > MAX_EXAMPLE_STEPS or requests > MAX_EXAMPLE_REQUESTS:
        raise UsageError(f"{where} holds {steps:,} steps and {requests:,} requests, over the {MAX_EXAMPLE_STEPS} "
                         f"and {MAX_EXAMPLE_REQUESTS} an example may hold (the suite draws at most a few dozen); "
                         "refused")


# --------------------------------------------------------------------------- depth


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not count). A
    cheap upper bound comes first: with no more openers than `limit`, it cannot nest deeper."""
    openers = text.count("[") + text.count("{")
    if openers <= limit:
        return openers
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(text: str, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` for untrusted text: nesting deeper than `max_depth` is a one-line UsageError naming
    `where`, found before the parser recurses. JSON errors stay ValueErrors, for the caller to word."""
    if json_depth(text, max_depth) > max_depth:
        raise UsageError(f"{where}: JSON nested deeper than {max_depth} levels; refused (kvparity writes ~10)")
    try:
        return json.loads(text)
    except RecursionError:  # the scan is an upper bound of what the parser meets; belt and braces
        raise UsageError(f"{where}: JSON nested too deep to read; refused") from None


def read_json(path: str | os.PathLike[str], what: str, cap: int = MAX_WITNESS_BYTES) -> Any:
    """A whole JSON file that someone else may have written, size- and depth-capped."""
    return loads(read_capped(path, cap, what), str(path))


# --------------------------------------------------------------------------- hosts


_HOST_KEY = re.compile(r"(^|_)(url|uri|host|hostname|endpoint|addr|address|server_url)$", re.I)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*")
_NETLOC = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::\d{1,5})?$")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (an IPv4-mapped loopback too) or the name localhost. Other names are not
    resolved: a DNS lookup is already traffic, and a name can resolve differently when connecting."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def _hosts(key: str, value: str) -> list[str | None]:
    """The hosts `value` points at (None: cannot tell). URLs anywhere in the value count, and a
    host-like key's bare value (host[:port]) too."""
    out: list[str | None] = []
    for url in _URL.findall(value):
        netloc = urlsplit(url).netloc
        m = _NETLOC.match(netloc)  # user@host, odd characters: refused rather than guessed
        out.append(m.group("host") if m else None)
    if not out and _HOST_KEY.search(key) and value.strip():
        m = _NETLOC.match(value.strip().split("/", 1)[0])
        out.append(m.group("host") if m and not value.strip().startswith("/") else None)
    return out


def refuse_remote_hosts(witness_args: Mapping[str, str], user_args: Mapping[str, str], where: str) -> None:
    """A witness cannot choose where traffic goes: each of its engine arguments that names a host must
    name this machine, unless the user gave that argument on the command line (then the user's value
    is used and the witness's is dropped)."""
    for key, value in witness_args.items():
        if key in user_args:
            continue
        for host in _hosts(key, str(value)):
            if host is None or not is_loopback(host):
                target = "a host it does not name plainly" if host is None else host
                raise UsageError(f"{where}: engine_args {key}={value!r} would send traffic to {target}, not this "
                                 f"machine; a witness may only name loopback hosts. To replay there, say so "
                                 f"yourself: --engine-arg {key}=URL")


# --------------------------------------------------------------------------- configurations


def _canonical(value: Any) -> str:
    """A value as the JSON it is written as: a tuple and a list are the same, True and 1 are not."""
    return json.dumps(value, sort_keys=True)


def check_config(config: Mapping[str, Any], space: Mapping[str, Sequence[Any]], where: str) -> None:
    """Every knob of `config` is declared in `space`, with one of its declared values."""
    if not isinstance(config, Mapping):
        raise UsageError(f"{where}: a configure step's config is {type(config).__name__}, not a mapping")
    for knob, value in config.items():
        if knob not in space:
            declared = ", ".join(sorted(space)) or "none"
            raise UsageError(f"{where}: configure names knob {knob!r}, which the engine does not declare "
                             f"(its config_space knobs: {declared}); refused before the engine sees it")
        allowed = space[knob]
        if not isinstance(allowed, (list, tuple)):
            raise UsageError(f"{where}: the declared values of knob {knob!r} are not a list")
        if _canonical(value) not in {_canonical(v) for v in allowed}:
            shown = _canonical(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise UsageError(f"{where}: configure sets {knob}={shown}, not one of the engine's declared values "
                             f"({', '.join(_canonical(v) for v in allowed)}); refused before the engine sees it")


def check_configs(configs: Iterable[Mapping[str, Any]], space: Mapping[str, Sequence[Any]], where: str) -> None:
    for config in configs:
        check_config(config, space, where)


def _a_knob(k: Any) -> bool:
    """A recorded knob's shape (conformance.knobs.Knob as JSON), before anything reads it."""
    off = k.get("off", k.get("prefix_caching_off", [])) if isinstance(k, Mapping) else None
    return (isinstance(k, Mapping) and isinstance(k.get("name"), str) and isinstance(k.get("values"), list)
            and isinstance(off, list) and isinstance(k.get("context_limits", {}), Mapping))


def recorded_space(caps: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """knob -> declared values, from a run_start's capabilities: its `knobs` (each a mapping with a
    name and values), or the `config_space` map that histories recorded before knobs were one value."""
    if "knobs" not in caps:
        space = caps.get("config_space") or {}
        if not isinstance(space, Mapping):
            raise UsageError(f"{where}: run_start's config_space is not a mapping")
        return space
    knobs = caps.get("knobs") or []
    if not isinstance(knobs, list) or not all(_a_knob(k) for k in knobs):
        raise UsageError(f"{where}: run_start's knobs are not a list of named knobs with lists of values")
    return {k["name"]: k.get("values") for k in knobs}


def check_history_configs(events: Sequence[Mapping[str, Any]], where: str) -> None:
    """A history's `config` events against the config_space its own `run_start` declared: the suite
    only ever draws from that space, so anything else was written by someone else."""
    caps = events[0].get("capabilities") if events else None
    if not isinstance(caps, Mapping):
        return  # no declared space to hold the configurations to (a session's events)
    space = recorded_space(caps, where)
    for number, ev in enumerate(events):
        if ev.get("event") == "config":
            check_config(ev.get("config") or {}, space, f"{where} event {number + 1}")
