"""pagebench.measure.launch_tuning: the launch grids refuse a CPU, and one timing step's bookkeeping."""

from __future__ import annotations

import pytest

from pagebench.measure import launch_tuning


@pytest.mark.parametrize("grid", [launch_tuning.decode_launch_grid, launch_tuning.prefill_launch_grid])
def test_grids_refuse_a_cpu_before_any_work(grid):
    with pytest.raises(ValueError, match="--device: the launch grids time CUDA graphs"):
        grid("cpu")


def test_every_prefill_configuration_is_a_launch():
    from pagebench.kernels.triton_prefill import PrefillLaunch

    launches = {PrefillLaunch(**config) for config in launch_tuning.PREFILL_CONFIGS}
    assert len(launches) == len(launch_tuning.PREFILL_CONFIGS)  # no configuration timed twice


def test_a_timed_configuration_is_a_row_and_a_failing_one_is_skipped(monkeypatch):
    class Timing:
        median_us = 4.0

    monkeypatch.setattr(launch_tuning, "measure", lambda fn, **kw: fn() or Timing())
    monkeypatch.setattr(launch_tuning.torch.cuda, "synchronize", lambda: None)
    rows, skipped = [], []
    timed = launch_tuning._timer("cuda", rows, skipped, repeat=1, warmup=0)
    row = timed(lambda: None, {"batch": 1}, 8000, backend="triton", tile_n=64)
    assert row == rows[0] == {"batch": 1, "backend": "triton", "tile_n": 64, "time_us": 4.0,
                              "gbps": 2.0}  # 8,000 bytes in 4 us
    assert timed(lambda: 1 / 0, {"batch": 2}, tile_n=128) is None
    assert len(rows) == 1 and skipped[0][:2] == (2, 128)
    assert "ZeroDivisionError" in skipped[0][-1]
