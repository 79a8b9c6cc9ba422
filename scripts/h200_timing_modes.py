"""Why does one decode, timed by successive ``measure()`` calls in one process, alternate
between two times about 10% apart? (docs/kernels.md, "Open"). Times the same calls under
several ways of flushing L2 and of capturing the graph, each repeated, in one process:

    PYTHONPATH=. python3 scripts/h200_timing_modes.py OUT_DIR          # on the GPU

Modes (each "round" is 30 replays and gives one median; 8 rounds per mode and case):
  measure       pagebench.timing.measure(call, cuda_graph=True), as the sweeps call it
  g1_zero_new   one graph per case; each round allocates its own 256 MB buffer and zeroes it
  g1_zero       one graph per case; one buffer for the process, zeroed before each replay
  g1_read       one graph per case; one buffer, read (summed) before each replay
  gN_read       a new graph every round; one buffer, read before each replay
  g1_none       one graph per case; no flush
  interleaved   one graph per case; cases replayed in turn, each after a read flush
Then the "transient": for each case, 4 GB taken from the driver and given back (as a sweep does
between points), a new graph captured, and 60 replays timed one by one from the first
(``timing_transient.csv``), and ``measure()`` as it is now. Writes ``timing_modes.csv`` (one
row per round) and prints the rounds' medians last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

from pagebench.cli.options import write_results
from pagebench.defaults import SHAPES
from pagebench.kernels import cuda_fp8_decode, triton_decode
from pagebench.kernels.fixtures import paged_case, quantized_inputs
from pagebench.timing import (L2_FLUSH_BYTES, Timing, capture_graph, environment, measure,
                              summarise)
from pagebench.timing import cuda_event_us as timed

SHAPE = dict(SHAPES)["llama-3-8b"]
SCALE = SHAPE[2] ** -0.5
ROUNDS, REPLAYS = 8, 30


def cases():
    out = {}
    for batch, context in ((64, 4096), (128, 4096), (1, 65536)):
        base = paged_case(batch, context, SHAPE, 16, torch.bfloat16, "cuda", seed=batch)
        fp8 = quantized_inputs(base, torch.float8_e4m3fn, spread=1.0)
        bargs, fargs, sc = base.args(), fp8.args(), (fp8.k_scale, fp8.v_scale)
        out[f"{batch}x{context} bf16 triton"] = (
            lambda a=bargs: triton_decode.triton_paged_decode(*a, SCALE))
        out[f"{batch}x{context} e4m3 cuda"] = (
            lambda a=fargs, s=sc: cuda_fp8_decode.cuda_fp8_paged_decode(*a, SCALE, *s))
    return out


def capture(fn):
    fn()
    graph = capture_graph(fn)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    return graph


PER_REPLAY = "cuda events per replay"


def replays(replay, flush):
    """REPLAYS replays of a graph, each timed alone after ``flush`` (None: none)."""
    return summarise([timed(replay, flush) for _ in range(REPLAYS)], PER_REPLAY)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    env = environment("cuda")
    calls = cases()
    buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    zero, read = buf.zero_, lambda: buf.sum(dtype=torch.int64)
    graphs = {name: capture(fn) for name, fn in calls.items()}
    rows = []

    def record(case, mode, rnd, t: Timing):
        rows.append(dict(case=case, mode=mode, round=rnd, median_us=t.median_us,
                         q20_us=t.q20_us, q80_us=t.q80_us, min_us=t.min_us, **env))

    for name, fn in calls.items():
        g = graphs[name]
        for rnd in range(ROUNDS):
            record(name, "measure", rnd,
                   measure(fn, device="cuda", warmup=3, repeat=REPLAYS, cuda_graph=True))
        for rnd in range(ROUNDS):
            own = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
            record(name, "g1_zero_new", rnd, replays(g.replay, own.zero_))
            del own
        for mode, flush in (("g1_zero", zero), ("g1_read", read), ("g1_none", None)):
            for rnd in range(ROUNDS):
                record(name, mode, rnd, replays(g.replay, flush))
        for rnd in range(ROUNDS):
            gn = capture(fn)
            record(name, "gN_read", rnd, replays(gn.replay, read))
            del gn
        write_results(os.path.join(out_dir, "timing_modes.csv"), rows)
    for rnd in range(ROUNDS):
        samples = {name: [] for name in graphs}
        for _ in range(REPLAYS):
            for name, g in graphs.items():
                samples[name].append(timed(g.replay, read))
        for name, s in samples.items():
            record(name, "interleaved", rnd, summarise(s, PER_REPLAY))
    write_results(os.path.join(out_dir, "timing_modes.csv"), rows)
    transient = []
    for name, fn in calls.items():
        torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda").fill_(1)
        torch.cuda.empty_cache()
        g = capture(fn)
        for i in range(60):
            transient.append(dict(case=name, replay=i, time_us=timed(g.replay, read), **env))
        s = [r["time_us"] for r in transient[-60:]]
        t = measure(fn, device="cuda", repeat=REPLAYS, cuda_graph=True)
        print(f"transient {name:>22s}: replays 0-9 {statistics.median(s[:10]):6.1f}, 10-29 "
              f"{statistics.median(s[10:30]):6.1f}, 30-59 {statistics.median(s[30:]):6.1f} us; "
              f"measure() after it {t.median_us:6.1f}", flush=True)
    write_results(os.path.join(out_dir, "timing_transient.csv"), transient)
    print(f"{'case':>22s} {'mode':>12s}  medians of {ROUNDS} rounds (us)")
    for name in calls:
        for mode in dict.fromkeys(r["mode"] for r in rows):
            meds = [r["median_us"] for r in rows if r["case"] == name and r["mode"] == mode]
            print(f"{name:>22s} {mode:>12s}  " + " ".join(f"{m:6.1f}" for m in meds))


if __name__ == "__main__":
    main()
