"""Shared pytest set-up: Triton's interpreter where there is no GPU, the hypothesis profiles.

HYPOTHESIS_PROFILE=ci (default): fast and derandomised. HYPOTHESIS_PROFILE=long: thorough runs.
"""

import os

from hypothesis import HealthCheck, settings

from pagebench.triton_setup import interpret_without_gpu

interpret_without_gpu()  # before a test builds a transformers model, which imports Triton

settings.register_profile(
    "ci", max_examples=40, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "long", max_examples=1000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
