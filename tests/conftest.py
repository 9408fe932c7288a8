"""Shared test set-up. One torch thread per process: CI runs two xdist workers on two cores."""

from __future__ import annotations

import os

import torch
from hypothesis import settings

torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Profiles carry an explicit parent: on CI machines Hypothesis loads its own "ci" profile, and a profile
# without a parent would silently inherit from whichever is loaded.
settings.register_profile("kvparity-tests", parent=settings.get_profile("default"), deadline=None,
                          print_blob=True)
settings.load_profile("kvparity-tests")
