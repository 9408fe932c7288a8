"""Shared test set-up. One torch thread per process: CI runs two xdist workers on two cores."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Profiles carry an explicit parent: on CI machines Hypothesis loads its own "ci" profile, and a profile
# without a parent would silently inherit from whichever is loaded.
settings.register_profile("kvparity-tests", parent=settings.get_profile("default"), deadline=None,
                          print_blob=True)
settings.load_profile("kvparity-tests")


@pytest.fixture(autouse=True)
def _short_landmark_searches(tmp_path_factory, monkeypatch):
    """An adapter on a user's checkpoint searches its landmarks at start (adapters/landmark_search.py):
    in tests for 2 s, cached under the session's temporary folder, never the checkout's .kvparity/.
    A test that needs a real search passes its own budget and cache folder."""
    from adapters import landmark_search

    monkeypatch.setattr(landmark_search, "DEFAULT_BUDGET_S", 2.0)
    monkeypatch.setattr(landmark_search, "CACHE_DIR", tmp_path_factory.getbasetemp() / "landmarks")
