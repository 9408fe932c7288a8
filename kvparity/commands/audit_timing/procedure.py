"""The probes of the timing audit (Gu et al., "Auditing Prompt Caching in Language Model APIs", ICML 2025).

A *hit procedure*: the victim sends a fresh prompt of random letters `victim_repeats` times (1, 5 or 25),
then the attacker sends a prompt sharing the first `share` of it (100% or 95% of the letters; the rest
fresh letters) with `max_tokens=1`, and the client times that request. A *miss procedure* is the same
with an attacker prompt that shares nothing with the victim's. Hits and misses are randomly interleaved
(in blocks, each half hits, so every look of the sequential mode sees a balanced sample). Every prompt is
fresh random letters, so nothing earlier in the audit (or anyone else's traffic) can be a prefix of it.

One deviation from the paper, and why: in the paper's miss procedure the attacker sends its prompt alone.
Here the victim sends an unrelated prompt first, exactly as often as in a hit procedure. The two
procedures then differ *only* in whether the attacker's prompt shares the victim's prefix — not in
whether the server has just done work (warm caches, an allocator, a batch just finished) — so a timing
difference can come from cache sharing alone. It costs the victim's tokens twice.

Sharing levels are who the attacker is relative to the victim, in the request fields that carry tenancy
on vLLM-style servers: `cache_salt` (a tenant / organisation) and `user`:
  same-user     the same salt and user        (what any prompt cache may share)
  same-org      the same salt, another user   (shared within an organisation)
  cross-tenant  another salt and user         (must never share)
With `no_salt` the audit sends no `cache_salt` at all (tenancy is then only `user`, or nothing), which
is how to ask whether a server shares across requests that name no tenant. Every salt carries a fresh
nonce, so an audit never meets an earlier audit's cache entries.

The clock (`client`): client-side wall time from sending the request to the whole answer (`max_tokens=1`,
not streamed: the answer is the first token), over one keep-alive connection so no connection set-up
enters the measurement; every request within a wall-clock deadline.

A level the run's time bound ends between two probes stops "time": it keeps its probes for the report
but no test of them counts as a detection (a fixed-sample test is planned at the probe budget, and the
sequential looks at their planned counts), so a time-cut level is never a verdict from partial data.
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Callable

import attrs

from kvparity.commands.audit_timing.client import Client
from kvparity.commands.audit_timing.decision import Plan, Test, ks_faster

LETTERS = "abcdefghijklmnopqrstuvwxyz"
LEVELS = ("same-user", "same-org", "cross-tenant")


@attrs.frozen
class Party:
    salt: str | None
    user: str | None


def parties(level: str, nonce: str, no_salt: bool) -> tuple[Party, Party]:
    """(victim, attacker) for a sharing level."""
    org_v, org_a = (None, None) if no_salt else (f"org-v-{nonce}", f"org-a-{nonce}")
    victim = Party(org_v, f"user-v-{nonce}")
    if level == "same-user":
        return victim, victim
    if level == "same-org":
        return victim, Party(org_v, f"user-a-{nonce}")
    if level == "cross-tenant":
        if no_salt:
            raise ValueError("cross-tenant needs cache_salt (drop --no-salt, or test same-user,same-org)")
        return victim, Party(org_a, f"user-a-{nonce}")
    raise ValueError(f"unknown level {level!r}; choose from {', '.join(LEVELS)}")


@attrs.define
class LevelResult:
    level: str
    plan: Plan
    hits: list[float] = attrs.Factory(list)
    misses: list[float] = attrs.Factory(list)
    looks: list[Test] = attrs.Factory(list)
    stopped: str = ""  # "decisive" (a look before the budget rejected) | "budget" | "time"

    @property
    def probes(self) -> int:
        return len(self.hits) + len(self.misses)

    @property
    def final(self) -> Test:
        return self.looks[-1] if self.looks else ks_faster(self.hits, self.misses)

    @property
    def detected(self) -> bool:
        return any(t.pvalue < self.plan.alpha_per_look for t in self.looks)

    @property
    def verdict(self) -> str:
        if self.detected:
            return "sharing detected"
        return "not detected" if self.stopped == "budget" else "inconclusive (time bound reached)"


@attrs.frozen
class Procedure:
    letters: int  # prompt length in random letters (each letter + space is about one token)
    share: float  # fraction of the victim's letters the attacker's prompt starts with, in (0, 1]
    victim_repeats: int

    def prompt(self, rng: random.Random, n: int | None = None) -> str:
        return " ".join(rng.choice(LETTERS) for _ in range(self.letters if n is None else n))

    def attacker_prompt(self, rng: random.Random, victim: str) -> str:
        letters = victim.split(" ")
        keep = round(self.share * len(letters))
        if keep >= len(letters):
            return victim
        tail = [rng.choice(LETTERS.replace(letters[keep], "")) for _ in range(len(letters) - keep)]
        return " ".join(letters[:keep] + tail)  # the first changed letter differs for sure

    def run_one(self, client: Client, rng: random.Random, hit: bool, victim: Party, attacker: Party) -> float:
        shared = self.prompt(rng)
        sent = shared if hit else self.prompt(rng)  # a miss: the victim sends something unrelated
        for _ in range(self.victim_repeats):
            client.complete(sent, victim)
        return client.complete(self.attacker_prompt(rng, shared), attacker)


def run_level(level: str, plan: Plan, procedure: Procedure, client: Client, rng: random.Random,
              victim: Party, attacker: Party, deadline: float,
              progress: Callable[[LevelResult], None] | None = None) -> LevelResult:
    """Hit and miss procedures, interleaved in shuffled balanced blocks, until a look is decisive, the
    probe budget is spent or the deadline passes."""
    out = LevelResult(level, plan)
    block = max(2, plan.look_every - plan.look_every % 2)
    while out.probes < 2 * plan.pairs:
        left = 2 * plan.pairs - out.probes
        order = [True, False] * (min(block, left) // 2)
        rng.shuffle(order)
        for hit in order:
            if time.monotonic() > deadline:
                out.stopped = "time"  # no look of the partial sample: `final` shows it, `detected` ignores it
                return out
            t = procedure.run_one(client, rng, hit, victim, attacker)
            (out.hits if hit else out.misses).append(t)
            if plan.is_look(out.probes):
                out.looks.append(ks_faster(out.hits, out.misses))
                if progress is not None:
                    progress(out)
                if out.detected:
                    out.stopped = "decisive" if out.probes < 2 * plan.pairs else "budget"
                    return out
    out.stopped = "budget"
    return out


def new_nonce() -> str:
    return secrets.token_hex(4)
