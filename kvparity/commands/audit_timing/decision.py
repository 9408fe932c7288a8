"""The statistical decision of the timing audit: a one-sided two-sample Kolmogorov–Smirnov test.

Gu et al. (ICML 2025) test, per sharing level, whether the attacker's time to first token after a victim
sent the shared prompt (hit procedure) is stochastically *smaller* than after an unrelated prompt (miss
procedure): H0 "hit TTFTs are not faster", rejected at α = 1e-8. `scipy.stats.ks_2samp(hits, misses,
alternative="greater")` is that test: its alternative is that the hits' empirical CDF lies above the
misses' somewhere, i.e. hits are faster. The exact p-value is used for these sample sizes. Why KS and not a
t-test: it assumes no distribution shape (TTFTs are skewed, with heavy right tails) and is the paper's test.

Sequential mode. Looking at the data after every block of probes and stopping at the first rejection
would inflate the false-detection rate if each look used α. With at most K looks planned in advance, each
look tests at α / K (Bonferroni): the chance that *any* look falsely rejects is at most α, whatever the
dependence between looks, so stopping early keeps the guarantee. A level with no sharing runs to its
probe budget and ends "not detected"; one with sharing stops as soon as a look rejects.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs

ALPHA = 1e-8


@attrs.frozen
class Test:
    statistic: float  # sup (F_hit - F_miss): 1.0 when every hit was faster than every miss
    pvalue: float
    hits: int
    misses: int


def ks_faster(hits: Sequence[float], misses: Sequence[float]) -> Test:
    """One-sided two-sample KS test of "hits are faster than misses"."""
    from scipy.stats import ks_2samp

    if not hits or not misses:
        return Test(0.0, 1.0, len(hits), len(misses))
    r = ks_2samp(list(hits), list(misses), alternative="greater")
    return Test(float(r.statistic), float(r.pvalue), len(hits), len(misses))


@attrs.frozen
class Plan:
    """How many probes (hit + miss procedures) a level may spend, and when it is tested."""

    max_probes: int  # hits + misses, split evenly
    sequential: bool
    look_every: int  # probes between two looks (sequential mode)
    alpha: float = ALPHA

    @property
    def pairs(self) -> int:
        return self.max_probes // 2

    @property
    def looks(self) -> int:
        """K: the planned number of looks (1 in fixed-sample mode)."""
        return max(1, math.ceil(self.max_probes / self.look_every)) if self.sequential else 1

    @property
    def alpha_per_look(self) -> float:
        return self.alpha / self.looks

    def is_look(self, probes_done: int) -> bool:
        """Test after this many probes? Every `look_every` in sequential mode; at the end always."""
        if probes_done >= 2 * self.pairs:
            return True
        return self.sequential and probes_done % self.look_every == 0
