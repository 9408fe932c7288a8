"""Where a run keeps the failing examples Hypothesis replays first: a local folder, or a shared Redis.

Hypothesis saves every failing example it finds (shrunk) to its example database and replays the saved
ones before drawing anything new. With a local folder (the default, `.hypothesis/kvparity/<engine>/`)
that helps the next run on the same machine only. A campaign's shards run on several machines, so
`--database redis://HOST:PORT/N` puts the store in Redis, through Hypothesis' own
`RedisExampleDatabase` (maintained with Hypothesis, in its `extra` package; the `redis` client is the
optional `campaign` extra): a failure found by one shard is then replayed first by every shard started
after it, and by the next night's campaign.

Why Redis and not another backend: it is the one networked store Hypothesis itself maintains an
adapter for (its other databases are a local folder, a read-only GitHub artifact, and wrappers over
those), and a CI system can run it as a service container beside the shard jobs.

A database URL is treated like a host in a witness (conformance.untrusted): only loopback hosts are
accepted. Failing examples are kvparity's own evidence and the store holds no secrets, but a run
should not send them to a machine it was not meant to talk to because a URL was mistyped or copied
from a CI file; tunnel a remote Redis to a local port (e.g. `ssh -L`) to say so on purpose. An
unreachable store is a one-line usage error before any engine is built, never a run that silently
forgets its failures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from conformance.contract import UsageError
from conformance.untrusted import is_loopback

SCHEME = "redis://"
PING_TIMEOUT_S = 5.0


def is_url(value: str | None) -> bool:
    """Any `scheme://`, not only redis's: a mistyped scheme (`rediss://`, `redis:/`... is a folder) is
    refused by `check_url` rather than taken for a folder of that name, where the shards would each keep
    their failures to themselves."""
    return bool(value) and "://" in str(value)


def check_url(url: str) -> str:
    """A `redis://HOST[:PORT][/N]` URL naming this machine, or a one-line usage error (another scheme too)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range raises ValueError here
    except ValueError as exc:
        raise UsageError(f"--database {url!r}: not a redis URL ({exc})") from None
    if parts.scheme.lower() != SCHEME[:-3]:
        raise UsageError(f"--database {url!r}: only {SCHEME}HOST:PORT/N is accepted as a URL (or give a folder)")
    host = parts.hostname or ""
    if parts.username or parts.password:
        raise UsageError(f"--database {url!r}: credentials in the URL are not accepted (the store is loopback only)")
    if not host or not is_loopback(host):
        raise UsageError(f"--database {url!r}: {host or 'no host'} is not this machine; only loopback hosts "
                         "(127.0.0.1, ::1, localhost) are accepted. Tunnel a remote Redis to a local port to use it")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise UsageError(f"--database {url!r}: the path must be a database number, e.g. /0")
    if parts.query or parts.fragment:
        raise UsageError(f"--database {url!r}: no query or fragment is accepted")
    return url


def _client(url: str) -> Any:
    try:
        import redis
    except ImportError:
        raise UsageError(f"--database {url}: the redis client is not installed "
                         "(pip install 'kvparity[campaign]')") from None
    return redis.Redis.from_url(url, socket_timeout=PING_TIMEOUT_S, socket_connect_timeout=PING_TIMEOUT_S)


def reachable(url: str) -> None:
    """Refuse, in one line, a store that cannot be reached: before the engine is built, not mid-run."""
    client = _client(check_url(url))
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - redis.ConnectionError, TimeoutError, an auth error...
        raise UsageError(f"--database {url}: cannot reach the store: {type(exc).__name__}: {exc}") from None
    finally:
        client.close()


def _key(engine_name: str) -> str:
    return engine_name.replace(":", "_").replace("/", "_")


def database(engine_name: str, url: str | None = None, directory: str | Path | None = None) -> Any:
    """The Hypothesis example database of a run against `engine_name`: Redis at `url`, else the folder
    `directory` (default `.hypothesis`) / kvparity / <engine>. Both are keyed by engine, so one engine's
    failures are not replayed against another."""
    if url:
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(_client(check_url(url)), key_prefix=f"kvparity:{_key(engine_name)}:".encode())
    from hypothesis.database import DirectoryBasedExampleDatabase

    return DirectoryBasedExampleDatabase(str(Path(directory or ".hypothesis") / "kvparity" / _key(engine_name)))


def keep_with_seed(test: Any, db: Any) -> None:
    """Give a seeded Hypothesis test its example database back. `hypothesis.seed` turns the database
    off (a seed alone should reproduce a run), which is right for `kvparity run --seed` but would make
    every shard (each is seeded, conformance.shards) and every run given `--database` ignore the store
    it was given: a failure found by one shard would never be replayed by the next. Hypothesis has no
    public way to have both, so this sets the settings `@seed` replaced (tests/test_shards.py fails if
    a Hypothesis release changes that)."""
    from hypothesis import settings

    test._hypothesis_internal_use_settings = settings(test._hypothesis_internal_use_settings, database=db)
