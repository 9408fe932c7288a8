"""One run's configuration: validated once, frozen, handed to `run_suite(engine, config)`.

Before, `kvparity run` checked the checks and the profile, and `run_suite` checked them again from its
16 keyword parameters. Now the command builds a `RunConfig` from its arguments (and the suite's own
tests from theirs); a bad value is a one-line `UsageError` at construction, before any engine is built,
and nothing downstream validates again. The Hypothesis profiles are registered by the run that needs
them (`profile_settings`), not as a side effect of importing a module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
from hypothesis import HealthCheck, Phase, settings

from conformance.arguments import DEFAULT_REPORT_DIR, DEFAULT_TIMEOUT_S
from conformance.contract import UsageError
from conformance.shards import Shard

PROFILES = {"dev": 4, "ci": 5, "nightly": 8}  # profile -> max steps per scenario

QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
         HealthCheck.large_base_example]
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_EXAMPLES = {"dev": 12, "ci": 100, "nightly": 1000}


def register_profiles() -> None:
    """Register kvparity's Hypothesis profiles (idempotent). An explicit parent: on CI Hypothesis loads
    its *own* "ci" profile, and a profile without a parent would silently inherit it. Ours are namespaced
    and rooted at "default"; only ci is derandomised."""
    for name, examples in _EXAMPLES.items():
        settings.register_profile(f"kvparity-{name}", parent=settings.get_profile("default"),
                                  max_examples=examples, deadline=None, suppress_health_check=QUIET,
                                  phases=PHASES, print_blob=True, **({"derandomize": True} if name == "ci" else {}))


def profile_settings(profile: str) -> settings:
    """The Hypothesis settings of a kvparity profile, registered on first use."""
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    register_profiles()
    return settings.get_profile(f"kvparity-{profile}")


def _checks(names: Sequence[str] | None) -> tuple[str, ...]:
    from conformance.analysis import select_checks

    return tuple(select_checks(names))


def _profile(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    profile_settings(value)


def _known(entries: Sequence[Mapping[str, str]] | None) -> tuple[dict[str, str], ...] | None:
    return None if entries is None else tuple(dict(e) for e in entries)


def _database_url(instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None:
        from conformance.example_database import check_url

        check_url(value)


def _optional_path(value: str | os.PathLike[str] | None) -> Path | None:
    return None if value is None else Path(value)


@attrs.frozen(kw_only=True)
class RunConfig:
    """Everything that decides what one run does. `checks` None or empty: every check. `run_dir`: the
    run folder itself (None: a new one under `report_dir`). `close`: close the engine as the run's last
    engine call, so a failing close is an `error` event of its history (`kvparity run`).
    `known_findings` (`--known`): failures with those signatures are reported as known and the run looks
    on (`keep_looking`; False: the first round only). `max_shrink_seconds`: stop shrinking that long after
    the first failure (None: Hypothesis' own cap). `tolerance`, `calibration`: a `kvparity calibrate`
    file's measured tau and its path; `logprob_epsilon`: its measured logprob epsilon (None: the file
    measured none, or no file: logprob_parity is not run). `shard` (`--shard i/n`): the stream is shard
    i's of n, its seed derived (conformance.shards). `database_url` (`--database redis://...`): the
    example database is a shared Redis on this machine (conformance.example_database); else the folder
    `database_dir`."""

    engine_name: str
    engine_args: Mapping[str, str] = attrs.field(factory=dict, converter=lambda a: dict(a or {}))
    profile: str = attrs.field(default="dev", validator=_profile)
    checks: tuple[str, ...] = attrs.field(default=None, converter=_checks)
    report_dir: Path = attrs.field(default=DEFAULT_REPORT_DIR, converter=Path)
    run_dir: Path | None = attrs.field(default=None, converter=_optional_path)
    database_dir: Path | None = attrs.field(default=None, converter=_optional_path)
    database_url: str | None = attrs.field(default=None, validator=_database_url)
    seed: int | None = None
    max_examples: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    shrink: bool = True
    max_shrink_seconds: float | None = None
    tolerance: float | None = None
    calibration: str | None = None
    logprob_epsilon: float | None = None
    close: bool = False
    known_findings: tuple[dict[str, str], ...] | None = attrs.field(default=None, converter=_known)
    strict_known: bool = False
    keep_looking: bool = True
    shard: Shard | None = None

    def __attrs_post_init__(self) -> None:
        if self.strict_known and self.known_findings is None:
            raise UsageError("--strict-known needs --known FILE")
        if self.max_examples is not None and self.max_examples < 1:
            raise UsageError(f"max_examples {self.max_examples} must be at least 1")

    @property
    def settings(self) -> settings:
        return profile_settings(self.profile)

    @property
    def max_steps(self) -> int:
        return PROFILES[self.profile]

    @property
    def example_budget(self) -> int:
        return self.max_examples if self.max_examples is not None else self.settings.max_examples
