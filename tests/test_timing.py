"""The timing primitive: what it calls, how often, and what its CUDA flush leaves behind."""

from __future__ import annotations

import time

import pytest
import torch

from pagebench.measure import timing
from pagebench.measure.timing import measure


def test_cpu_measure_calls_warmup_then_repeat_times():
    calls = []
    t = measure(lambda: calls.append(1), warmup=3, repeat=5)
    assert len(calls) == 8 and t.repeats == 5
    assert t.min_us <= t.q20_us <= t.median_us <= t.q80_us
    assert t.method.startswith("cpu")


def test_cpu_measure_repeats_until_min_time():
    t = measure(lambda: time.sleep(0.002), warmup=0, repeat=1, min_time_s=0.01)
    assert t.repeats >= 2 and t.repeats * t.median_us >= 0.5 * 0.01e6


@pytest.mark.parametrize("warmup, repeat", [(-1, 5), (0, 0)])
def test_bad_counts_are_refused(warmup, repeat):
    with pytest.raises(ValueError, match="warmup/repeat"):
        measure(lambda: None, warmup=warmup, repeat=repeat)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_measure_replays_the_graph_after_a_timed_warmup_and_flushes_by_reading():
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    calls = []

    def fn():
        calls.append(1)
        counter.add_(1)

    t = measure(fn, device="cuda", warmup=2, repeat=7, cuda_graph=True)
    torch.cuda.synchronize()
    # Python runs fn for the 2 warm-up calls, 2 side-stream calls and the capture; the capture
    # itself runs nothing on the GPU, so the counter holds 4 + every replay
    assert len(calls) == 5 and t.repeats == 7 and "cuda graph" in t.method
    assert int(counter.item()) - 4 >= 7 + 1  # the timed replays and at least one warm-up replay
    flush = timing._flush_buffers[torch.cuda.current_device()]
    assert flush.numel() * 4 == timing.L2_FLUSH_BYTES and int(flush.count_nonzero()) == 0
