"""What each field of a request is drawn from, as the engine declares it (`Capabilities`): token ids,
prompt lengths, output limits, stop ids, identities, configurations."""

from __future__ import annotations

import functools
import random
from typing import Any, Callable, Mapping, TypeVar

from attrs import evolve
from hypothesis import strategies as st

from conformance.contract import Capabilities, Identity
from conformance.scenario import MAX_NEW, MAX_PROMPT


F = TypeVar("F", bound=Callable[..., Any])


def per_engine(fn: F) -> F:
    """Build a strategy once per (capabilities, arguments): a stream draws thousands of fields, and a
    strategy built afresh is validated afresh by Hypothesis each time (most of what drawing cost). The
    capabilities object is kept with its entry, so its id cannot be reused for another while cached."""
    cache: dict[tuple, tuple[Any, Any]] = {}

    @functools.wraps(fn)
    def cached(caps: Any, *args: Any) -> Any:
        key = (id(caps), *args)
        hit = cache.get(key)
        if hit is None or hit[0] is not caps:
            if len(cache) >= 4096:
                cache.clear()
            hit = cache[key] = (caps, fn(caps, *args))
        return hit[1]

    return cached  # type: ignore[return-value]


def max_prompt_len(caps: Capabilities, config: Mapping[str, Any] | None = None) -> int:
    """The longest prompt to send: room for MAX_NEW tokens within the context, under `config` if given."""
    return max(2, min(MAX_PROMPT, caps.context_limit(config) - MAX_NEW - 1))


def token_range(caps: Capabilities) -> tuple[int, int]:
    """A small alphabet (<= 48 ids) above the usual special ids: collisions make shared prefixes likely."""
    lo = min(4, caps.vocab_size - 2)
    return lo, min(caps.vocab_size - 1, lo + 47)


@per_engine
def tokens(caps: Capabilities) -> st.SearchStrategy[int]:
    lo, hi = token_range(caps)
    eos = caps.eos_id
    return st.integers(lo, hi).map(lambda t: t if t != eos else (t + 1 if t < hi else lo))


# The seed whose lists repeat every REPEAT_PERIOD tokens: a prompt that repeats itself block for block (a
# template, a repeated line) at every block size that divides the period or is a multiple of it (4, 16,
# 32). Sent again, its second block is looked up by the same tokens as its first: a block key blind to
# its parent (nano-vllm-style hashing, BUG_CLASSES A) serves the first block's KV at the second's
# positions. Not seed 0, where shrinking goes.
REPEATING_SEED, REPEAT_PERIOD = 7, 16


# One seed in EDGE_PERIOD draws its tokens from the small alphabet AND the vocabulary's edges (`edge_tokens`):
# the ids a stream of ordinary text never holds, where an engine that gives an id a meaning inside a
# prompt (an end, a pad to mask, a separator, an out-of-range embedding row) shows it. Not seed 0.
EDGE_PERIOD, EDGE_RESIDUE = 8, 5


def edge_tokens(caps: Capabilities) -> tuple[int, ...]:
    """The vocabulary's edges: its first two ids, its last, and eos (the special ids live there)."""
    edges = {0, 1, caps.vocab_size - 1} | ({caps.eos_id} if caps.eos_id is not None else set())
    return tuple(sorted(t for t in edges if 0 <= t < caps.vocab_size))


def seeded_tokens(caps: Capabilities, n: int, seed: int) -> tuple[int, ...]:
    """`n` tokens of the small alphabet (never eos; with the vocabulary's edges for one seed in
    EDGE_PERIOD), a pure function of `seed`: the first `n` of one endless sequence per seed, so the
    lists of one seed are prefixes of each other (and a sequence drawn once is only extended, never
    drawn again: a stream asks for the same seeds over and over, at every length)."""
    lo, hi = token_range(caps)
    edges = edge_tokens(caps) if seed % EDGE_PERIOD == EDGE_RESIDUE else ()
    return _SEQUENCES.prefix((lo, hi, caps.eos_id, edges, seed), n)


def _alphabet(lo: int, hi: int, eos: int | None, edges: tuple[int, ...]) -> list[int]:
    alphabet = [t for t in range(lo, hi + 1) if t != eos] or [lo]
    return alphabet + list(edges) * max(1, len(alphabet) // 8) if edges else alphabet  # ~1 token in 5 an edge


class _Sequences:
    """The sequences of the seeds in use, each with the generator that extends it (a bounded cache)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._drawn: dict[tuple, tuple[random.Random, list[int], list[int]]] = {}  # key: alphabet, seed

    def prefix(self, key: tuple, n: int) -> tuple[int, ...]:
        entry = self._drawn.get(key)
        if entry is None:
            if len(self._drawn) >= self.size:
                self._drawn.clear()
            lo, hi, eos, edges, seed = key
            entry = self._drawn[key] = (random.Random(seed), [], _alphabet(lo, hi, eos, edges))
        rng, drawn, alphabet = entry
        if len(drawn) < n:
            if key[-1] == REPEATING_SEED:  # one period drawn, then repeated
                if not drawn:
                    drawn.extend(rng.choice(alphabet) for _ in range(REPEAT_PERIOD))
                drawn.extend(drawn[i % REPEAT_PERIOD] for i in range(len(drawn), n))
            else:
                drawn.extend(rng.choice(alphabet) for _ in range(n - len(drawn)))
        return tuple(drawn[:n])


_SEQUENCES = _Sequences()


@per_engine
def token_lists(caps: Capabilities, n: int) -> st.SearchStrategy[tuple[int, ...]]:
    """`n` tokens drawn as ONE choice (a seed), not n: shrinking a length drawn before this (a prompt,
    a root, a suffix) then shortens the tokens without shifting every later choice of the scenario,
    which is what kept witnesses long (Hypothesis re-reads the rest of the scenario differently and
    loses the failure). Half the seeds come from a small set, and lists of one seed are prefixes of
    each other, so unrelated requests still share prefixes by chance (as the small alphabet intends).
    Seed 0, where shrinking goes, is as simple as any. The seeds' strategy is one object for every `n`: a
    flood draws lengths from hundreds of values, and each new strategy under the map was validated afresh
    (6% of the harness thread on the reference engine). A map's span label is its class's, not its
    function's, so the choices and spans drawn are what they were."""
    return _SEEDS.map(lambda seed: seeded_tokens(caps, n, seed))


_SEEDS = st.one_of(st.integers(0, 7), st.integers(8, 2**24))

# One character of the whole of Unicode but the surrogates, or none: what `st.text(max_size=1)` draws,
# the same choices. Named rather than `st.text()`, whose default alphabet is a codec's: Hypothesis then
# maps which code points UTF-8 encodes: 1-3 s of CPU in every process started where its cache of that map
# is absent (a fresh checkout, a test's temporary directory, a shard's worker).
ONE_CHARACTER = st.text(st.characters(exclude_categories=("Cs",)), max_size=1)


@per_engine
def prompt_lengths(caps: Capabilities, top: int | None = None) -> st.SearchStrategy[int]:
    """Mostly k * block_size + {+1, 0, -1}; sometimes anything. Never below 1 or above the cap
    (`Stream.fresh_request` adds the other end of the domain: prompts that fill the context).

    +1 comes first, so the simplest length — where shrinking goes, and what the simplest scenario
    (the one Hypothesis runs first in every run) sends twice — is one full block and the token after
    it: the shortest prompt that can be served from the cache, so the smallest witness of a hit bug,
    and a prefix hit (with its positive control) that every run exercises, however short."""
    b, top = caps.block_size, top or max_prompt_len(caps)
    near = st.builds(lambda k, d: k * b + d, st.integers(1, max(1, top // b)), st.sampled_from((1, 0, -1)))
    return st.one_of(near, st.integers(1, min(top, 3 * b))).map(lambda n: min(max(1, n), top))


@functools.lru_cache(maxsize=1024)
def at_context_end(budget: int, limit: int, past: bool = False) -> st.SearchStrategy[int]:
    """A prompt length at the far end of the domain: the request fills the context exactly (its last
    output token takes the last position a request may use) or stops one short of it — and, for an
    engine that refuses what lies past its limits (`Capabilities.refuses`), goes one token past it.
    Draft slots, pool reservations and position limits are clamped there, and nowhere else."""
    return st.sampled_from((0, 1, -1) if past else (0, 1)).map(lambda short: max(1, limit - budget - short))


@per_engine
def max_tokens(caps: Capabilities) -> st.SearchStrategy[int]:
    """1 to MAX_NEW, both ends weighted: one token (prefill only) and the longest output, where a run
    has room for draft runs, a stop past them and a model's own repetition."""
    return st.one_of(st.sampled_from((1, MAX_NEW)), st.integers(1, MAX_NEW))


@per_engine
def stop_ids(caps: Capabilities) -> st.SearchStrategy[tuple[int, ...]]:
    """No stop ids four times in five, else one or two tokens (both strategies built once: a strategy built
    inside the draw is validated by Hypothesis at every draw)."""
    none, some = st.just(()), st.lists(tokens(caps), min_size=1, max_size=2).map(tuple)
    return st.integers(0, 4).flatmap(lambda n: none if n else some)


@per_engine
def token_suffixes(caps: Capabilities, lo: int, hi: int) -> st.SearchStrategy[tuple[int, ...]]:
    """`lo` to `hi` tokens (`token_lists`): a list drawn to extend a prompt."""
    return st.integers(lo, hi).flatmap(lambda n: token_lists(caps, n))


@per_engine
def roots(caps: Capabilities) -> st.SearchStrategy[list[tuple[int, ...]]]:
    """One to three shared roots (a system prompt, few-shot examples) that a stream's requests extend."""
    return st.lists(prompt_lengths(caps).flatmap(lambda n: token_lists(caps, n)), min_size=1, max_size=3)


@functools.lru_cache(maxsize=4096)
def _sampled(elements: tuple) -> st.SearchStrategy:
    return st.sampled_from(elements)


def sampled(elements: Any) -> st.SearchStrategy:
    """`st.sampled_from(elements)`, built once per distinct sequence: a stream samples from the same pools,
    identities and step kinds again and again, and each strategy built afresh is validated afresh by
    Hypothesis. (Unhashable elements, which a configuration's values may be, are built each time.)"""
    elements = tuple(elements)
    try:
        return _sampled(elements)
    except TypeError:
        return st.sampled_from(elements)


def adapter_bindings(caps: Capabilities) -> list[tuple[str | None, str | None]]:
    """(name, weights digest) pairs: `Capabilities.adapters` entries are names, or "name@digest" where an
    engine can (re)load a name with several weights (an in-place reload: same name, new weights)."""
    out: list[tuple[str | None, str | None]] = [(None, None)]
    for entry in caps.adapters:
        name, _, digest = entry.partition("@")
        out.append((name, digest or None))
    return out


def all_identities(caps: Capabilities, salts: tuple[str, ...] = ()) -> list[Identity]:
    """Every identity the engine can express, the default first (it is what shrinking goes to).

    One salt is crafted to equal an adapter name: extra keys that are concatenated instead of
    domain-separated make adapter "X" and salt "X" collide (vLLM 44701, SGLang 24638). `salts`: more
    salts (`derived_salts`, drawn per stream)."""
    revisions = caps.revisions if "revision" in caps.identities else caps.revisions[:1]
    adapters = adapter_bindings(caps) if "adapter" in caps.identities else [(None, None)]
    crafted = next((name for name, _ in adapters if name), "tenant-b")
    base = (None, "tenant-a", crafted) if "salt" in caps.identities else (None,)
    every = base + tuple(s for s in salts if s not in base) if "salt" in caps.identities else base
    return [Identity(revision=r, adapter=a, adapter_digest=d, salt=s)
            for r in revisions for a, d in adapters for s in every]


def identity_strings(caps: Capabilities) -> list[str]:
    """The identity strings in play before a stream starts: the base salts, adapter names, revisions."""
    names = [n for n, _ in adapter_bindings(caps) if n]
    return sorted({"tenant-a", *names, *caps.revisions})


@per_engine
def derived_salts(caps: Capabilities) -> st.SearchStrategy[tuple[str, ...]]:
    """One or two salts made from the identity strings in play, each one edit away from one of them:
    a character appended (a key that truncates), the last dropped (a key that compares prefixes), the
    case flipped (a key that folds case), or two joined by a character, possibly none (a key that
    concatenates fields). The character is drawn from the whole of Unicode, not from a list of
    separators; none where the engine takes no salt."""
    if "salt" not in caps.identities:
        return st.just(())
    seeds = identity_strings(caps)
    one = st.sampled_from(seeds)
    char = ONE_CHARACTER
    edits = st.one_of(
        st.tuples(one, char).map(lambda p: p[0] + p[1]),
        one.map(lambda s: s[:-1]),
        one.map(str.swapcase),
        st.tuples(one, char, one).map(lambda p: p[0] + p[1] + p[2]),
    )
    return st.lists(edits.filter(lambda s: s and s not in seeds), min_size=1, max_size=2, unique=True).map(tuple)


def identity_distance(a: Identity, b: Identity) -> int:
    """How many identity inputs differ; reloading an adapter (same name, other weights) counts as one."""
    return (int(a.revision != b.revision) + int(a.adapter != b.adapter) + int(a.salt != b.salt)
            + int(a.adapter == b.adapter and a.adapter_digest != b.adapter_digest))


def nearest_by_input(victim: Identity, others: list[Identity]) -> dict[str, list[Identity]]:
    """Identities one input away from `victim`, grouped by the input that differs, so a poisoning step
    picks the input first (each equally likely) and a key that drops any one input is found fast."""
    out: dict[str, list[Identity]] = {}
    for i in others:
        if identity_distance(i, victim) != 1:
            continue
        which = ("revision" if i.revision != victim.revision else "salt" if i.salt != victim.salt
                 else "reload" if i.adapter == victim.adapter else "adapter")
        out.setdefault(which, []).append(i)
    return out


def one_binding_per_adapter(items: tuple) -> tuple:
    """An adapter name is bound to one set of weights at a time: within a batch, every use of a name
    takes the weights of its first use (a reload happens between batches)."""
    first: dict[str, str | None] = {}
    out = []
    for item in items:
        i = item.identity
        if i.adapter is not None:
            digest = first.setdefault(i.adapter, i.adapter_digest)
            if digest != i.adapter_digest:
                item = evolve(item, identity=evolve(i, adapter_digest=digest))
        out.append(item)
    return tuple(out)


@per_engine
def configs(caps: Capabilities) -> st.SearchStrategy[dict[str, Any]]:
    """One point of `config_space`: each knob drawn from its allowed values (the first shrinks best)."""
    space = {k: tuple(v) for k, v in sorted(caps.config_space.items()) if v}
    return st.fixed_dictionaries({k: st.sampled_from(v) for k, v in space.items()})


def spec_knobs(caps: Capabilities) -> list[str]:
    """Knobs of `config_space` whose declared role is speculation (drafter, k, ...;
    `Capabilities.knob_roles`) and that have another value to switch to."""
    return [k for k, v in sorted(caps.config_space.items())
            if caps.knob_roles.get(k) == "speculation" and len({str(x) for x in v}) > 1]
