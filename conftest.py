"""Shared pytest set-up: Triton's interpreter where there is no GPU, the hypothesis profiles, and
the rule that a test needing a GPU carries the ``gpu`` mark (the GPU tier runs those).

HYPOTHESIS_PROFILE=ci (default): fast and derandomised. HYPOTHESIS_PROFILE=long: thorough runs.
"""

import os
import re

import pytest
from hypothesis import HealthCheck, settings

from pagebench.triton_setup import interpret_without_gpu

pytest_plugins = ["pytester"]  # tests/test_gpu_tier.py runs this file's collection rule

interpret_without_gpu()  # before a test builds a transformers model, which imports Triton

settings.register_profile(
    "ci", max_examples=40, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "long", max_examples=1000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


NEEDS_GPU = re.compile(r"needs an? (CUDA|NVIDIA|GPU)\b")


def needs_gpu(item) -> bool:
    """Whether ``item`` skips itself without a GPU: a ``skipif`` whose reason starts "needs a
    CUDA ...", "needs an NVIDIA ..." or "needs a GPU ..."."""
    return any(NEEDS_GPU.match(str(m.kwargs.get("reason", "")))
               for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    """Refuse a test that needs a GPU but lacks the ``gpu`` mark: ``make test-gpu`` (``pytest -m
    gpu``) would never run it, and the CPU tier skips it."""
    unmarked = [item.nodeid for item in items
                if needs_gpu(item) and item.get_closest_marker("gpu") is None]
    if unmarked:
        raise pytest.UsageError("tests that need a GPU without the gpu mark (add "
                                "@pytest.mark.gpu): " + ", ".join(unmarked))
