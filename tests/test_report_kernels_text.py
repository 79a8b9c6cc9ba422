"""The kernel section says in words where pagebench's Triton decode is slower than another
backend (issue #43: the report says plainly where it is slower and why)."""

import pandas as pd

from pagebench.report.sections import triton_behind_text


def frame(rows):
    return pd.DataFrame(rows, columns=["device_label", "shape", "lengths", "batch", "backend",
                                       "relative_time"])


def test_points_where_triton_is_behind_are_named_with_their_share_and_worst_ratio():
    df = frame([("H100", "llama", "uniform", 8, "triton-paged", 1.00),
                ("H100", "llama", "uniform", 8, "flashinfer-tc-paged", 1.02),
                ("H100", "llama", "uniform", 64, "triton-paged", 1.05),
                ("H100", "llama", "lognormal:0,0.8", 64, "triton-paged", 2.20),
                ("H100", "llama", "uniform", 1, "triton-paged", 1.50)])  # batch 1: not counted
    text = triton_behind_text(df)
    assert "llama, uniform: up to 1.05× the fastest (1 of 2 points)" in text
    assert "llama, lognormal:0,0.8: up to 2.20× the fastest (1 of 1 points)" in text
    assert "1.50" not in text and "load imbalance" in text


def test_triton_fastest_everywhere_says_so():
    df = frame([("H100", "llama", "uniform", 8, "triton-paged", 1.0),
                ("H100", "llama", "uniform", 8, "sdpa-contiguous", 1.1)])
    assert "fastest at every point" in triton_behind_text(df)
