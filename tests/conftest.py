"""Fixtures shared by the tests under tests/ (the repository's conftest.py sets up Triton and
the hypothesis profiles for every suite). Plain helpers shared with the torchrun worker live in
``engine_models.py``."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model():
    """``tiny_model(family="qwen2", seed=0, **config)``: a new random-weight model at the engine
    tests' size (``engine_models.small_model``); each call builds a fresh one, so a test may
    change it."""
    pytest.importorskip("transformers")
    from engine_models import small_model

    return small_model
