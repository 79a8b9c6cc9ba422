"""Where a decode step's time goes: wall time, the device's busy time within it, and the host's
share (wall - busy), measured under ``torch.profiler``; for CUDA graphs also a graph's replay
alone, timed with CUDA events.

The engine ends every step with a device sync, so the kernels of a step start inside the step's
window on the host timeline: a step's busy time is the time of the kernels that start between
its start and the next step's.
"""

from __future__ import annotations

import torch

from pagebench.measure.engine_bench import (
    base_row, blocks_for_all, mode_options, with_threads, wrapped_execute)
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.results import datasets

DECODE, OTHER = "decode_step", "other_step"
REPLAYS = 20


@with_threads
def step_breakdown(model, prompts, max_tokens: int = 20, block_size: int = 16,
                   kernel: str = "auto", mode: str | None = None,
                   profile_table: list[str] | None = None) -> dict:
    """One row of the ``engine`` dataset (experiment ``step_breakdown``): a decode step of all
    ``prompts`` at once, after one warm-up ``generate``. ``decode_step_wall_ms`` is the mean of
    the engine's decode step times; ``gpu_busy_ms`` the mean busy time of the steps inside the
    profiled run (the first and last left out: their windows hold the prefill's tail and the
    run's end); ``host_ms`` their difference. ``profile_table``, if given, gets the profiler's
    top operators (by self CPU time) as text."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    engine = LLMEngine(model, block_size=block_size, kernel=kernel, max_num_seqs=len(prompts),
                       max_num_batched_tokens=8192,
                       num_blocks=blocks_for_all(prompts, max_tokens, block_size),
                       **mode_options(mode))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engine.generate(prompts, params)  # warm-up

    def marker(execute):
        def marked(seqs, blocks):
            with record_function(DECODE if all(kv.num_new == 1 for kv in blocks) else OTHER):
                return execute(seqs, blocks)
        return marked

    cuda = next(model.parameters()).device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with wrapped_execute(engine.runner, marker), profile(activities=activities) as prof:
        engine.generate(prompts, params)
    events = list(prof.events())
    marks = sorted((e.time_range.start, e.name) for e in events if e.name in (DECODE, OTHER))
    windows = [(t, marks[i + 1][0] if i + 1 < len(marks) else float("inf"))
               for i, (t, name) in enumerate(marks) if name == DECODE][1:-1]
    busy_us = sum(k.time_range.elapsed_us() for k in events if k.device_type == DeviceType.CUDA
                  and any(a <= k.time_range.start < z for a, z in windows))
    gpu_ms = busy_us / 1e3 / max(1, len(windows))
    stats = engine.stats
    wall_ms = 1e3 * stats.decode_time_s / max(1, stats.num_decode_steps)
    if profile_table is not None:
        profile_table.append(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                       row_limit=15))
    row = dict(experiment="step_breakdown", batch=len(prompts), block_size=block_size,
               kernel=engine.runner.decode_backend.name, max_tokens=max_tokens,
               cuda_graphs=engine.graphs()["cuda_graphs"], decode_step_wall_ms=wall_ms,
               gpu_busy_ms=gpu_ms, host_ms=wall_ms - gpu_ms,
               graph_replay_ms=graph_replay_ms(engine, len(prompts)),
               decode_steps=stats.num_decode_steps)
    if mode is not None:
        row["mode"] = mode
    return base_row(model, datasets.ENGINE, **row)


def graph_replay_ms(engine: LLMEngine, batch: int) -> float | None:
    """Milliseconds one replay of the decode graph serving ``batch`` sequences takes (the
    mean of ``REPLAYS``, CUDA events); None without captured graphs."""
    graphs = engine.runner.decode_graphs
    if graphs is None or not graphs.graphs:
        return None
    graph = graphs.graphs[min(g for g in graphs.graphs if g >= batch)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / REPLAYS
