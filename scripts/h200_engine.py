"""H200: the engine (CUDA-graph decode) on a random-weight Qwen2.5-0.5B, bf16, Triton kernels.

    PYTHONPATH=. python3 scripts/h200_engine.py --out $OUT [--budget-s 450] [--sections ...]

Sections (each skipped, and logged, once the time budget is short):
- ``bandwidth``: device-to-device copy bandwidth (the ceiling for bytes per decode step);
- ``equality``: greedy equality on the GPU: tiny fp32 model (several block sizes, prefix
  caching), the Qwen2.5-0.5B shape in fp32 (engine with graphs == ``model.generate``), graphs ==
  eager, and the bf16 agreement rate -> engine_gpu_equality.csv;
- ``breakdown``: one decode step's wall, GPU-busy and host time (torch.profiler) at batch 1 and
  256 -> engine_step_breakdown.csv;
- ``batch``: throughput vs batch (1, 16, 64, 256) x block size (1, 8, 16, 32, 128) with graphs,
  and eager rows at block 16 -> engine_throughput_vs_batch.csv;
- ``peers``: engine vs transformers ``generate`` (padded), ``generate_batch`` (its continuous
  batching), and at batch 1 ``generate`` with a static cache + ``torch.compile`` ->
  engine_vs_transformers_h200.csv;
- ``equal_memory``: engine vs padded ``generate`` at equal KV memory ->
  engine_equal_memory_h200.csv.
Prompts 16-400 tokens, 128 new tokens, ignore_eos, >= 3 repeats (median, min, max). A short
table is printed last.
"""

import argparse
import logging
import os
import signal
import sys
import time

import pandas as pd
import torch

from pagebench.defaults import SHORT_BLOCK_SIZES
from pagebench.engine import LLMEngine, SamplingParams, bench
from pagebench.results import datasets

T0 = time.time()
PROMPTS = (16, 400)
NEW_TOKENS = 128
BATCHES = (1, 16, 64, 256)
BLOCKS = (16, 1, 8, 32, 128)  # block 16 first: the headline numbers
SECTIONS = "bandwidth,equality,batch,breakdown,equal_memory,peers,static_compile"


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/h200_engine"))
    ap.add_argument("--budget-s", type=float, default=450)
    ap.add_argument("--sections", default=SECTIONS, help="comma-separated subset to run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer-batches", default=",".join(map(str, BATCHES)),
                    help="batch sizes of the peers section")
    ap.add_argument("--quick", action="store_true", help="smoke run: few points, 1 repeat")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ctx = Context(args)
    sections = args.sections.split(",")
    for name in SECTIONS.split(","):
        if name in sections:
            try:
                globals()[f"section_{name}"](ctx)
            except Exception as e:  # noqa: BLE001 -- report and go on to the next section
                import traceback
                traceback.print_exc()
                ctx.summary.append(f"{name}: FAILED {type(e).__name__}: {e}")
    print("\n\n".join(ctx.summary))
    log("done")


class Context:
    def __init__(self, args):
        self.args, self.out, self.summary = args, args.out, []
        self.bandwidth = None
        self._model = None

    def left(self) -> float:
        return self.args.budget_s - (time.time() - T0)

    @property
    def model(self):
        if self._model is None:
            self._model = bench.preset_model("qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda")
            log("model ready")
        return self._model

    def prompts(self, n, seed=0):
        return bench.random_prompts(n, *PROMPTS, self.model.config.vocab_size, seed=seed)

    def save(self, rows, name):
        df = pd.DataFrame(rows)
        df.to_csv(os.path.join(self.out, name), index=False)
        log(f"wrote {name} ({len(df)} rows)")
        return df


def section_bandwidth(ctx):
    from pagebench.kernels.sweep import measure_copy_gbps

    ctx.bandwidth = measure_copy_gbps("cuda", 2**30) * 1e9  # bytes/s, 1 GiB each way
    ctx.summary.append(f"copy bandwidth (read + write): {ctx.bandwidth / 1e12:.2f} TB/s")
    log(ctx.summary[-1])


def _outputs(engine, prompts, tokens):
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    return [r.outputs[0].token_ids for r in engine.generate(prompts, params)]


def _agreement(a, b):
    """Fraction of tokens before the first difference, over all sequences."""
    same = total = 0
    for x, y in zip(a, b):
        k = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        same, total = same + k, total + len(y)
    return same / max(1, total)


def section_equality(ctx):
    rows = []

    def row(model, what, engine, out, ref, **extra):
        rows.append(bench.base_row(model, datasets.ENGINE, experiment="gpu_greedy_equality",
                                check=what, block_size=engine.block_size, kernel="triton",
                                prefill_kernel=engine.runner.prefill_backend.name,
                                cuda_graphs=engine.graphs()["cuda_graphs"],
                                num_prompts=len(ref),
                                prompts_equal=sum(a == b for a, b in zip(out, ref)),
                                token_agreement=_agreement(out, ref), **extra))

    tiny = bench.tiny_model(device="cuda")
    prompts = bench.random_prompts(8, 1, 300, tiny.config.vocab_size, seed=3)
    ref = bench.padded_generate(tiny, prompts, 16, batch_size=1)  # unpadded, one by one
    for bs in SHORT_BLOCK_SIZES:
        for prefix in (False, True):
            eng = LLMEngine(tiny, block_size=bs, num_blocks=8192 // bs, kernel="triton",
                            enable_prefix_caching=prefix, max_num_seqs=8)
            row(tiny, "engine vs model.generate", eng, _outputs(eng, prompts, 16), ref,
                enable_prefix_caching=prefix)
    for bs in (1, 16):
        eager = LLMEngine(tiny, block_size=bs, num_blocks=8192 // bs, kernel="triton",
                          max_num_seqs=8, enforce_eager=True)
        expected = _outputs(eager, prompts, 32)
        for compiled in (False, True):
            graphs = LLMEngine(tiny, block_size=bs, num_blocks=8192 // bs, kernel="triton",
                               max_num_seqs=8, compile_model=compiled)
            row(tiny, "graphs vs eager", graphs, _outputs(graphs, prompts, 32), expected,
                enable_prefix_caching=False, compiled_layers=compiled)
    del tiny
    # the real shape in fp32, and in bf16 (agreement only: near-ties flip the argmax)
    for dtype in (torch.float32, torch.bfloat16):
        model = bench.preset_model("qwen2.5-0.5b", dtype=dtype, device="cuda")
        prompts = bench.random_prompts(4, *PROMPTS, model.config.vocab_size, seed=5)
        ref = bench.padded_generate(model, prompts, 24, batch_size=1)
        eng = LLMEngine(model, block_size=16, kernel="triton", max_num_seqs=4,
                        kv_cache_memory="4GiB")
        row(model, "engine vs model.generate", eng, _outputs(eng, prompts, 24), ref,
            enable_prefix_caching=False)
        del model, eng
        torch.cuda.empty_cache()
    df = ctx.save(rows, "engine_gpu_equality.csv")
    ctx.summary.append(df[["model", "dtype", "check", "block_size", "enable_prefix_caching",
                           "compiled_layers", "prompts_equal", "num_prompts",
                           "token_agreement"]].to_string())


def section_breakdown(ctx):
    """One decode step: wall time (the engine's step times), the GPU's busy time within it
    (kernels of a torch.profiler trace that start inside the step's window: each step ends
    with a device sync, so its kernels run inside it), host = wall - GPU; and for graphs the
    replay alone timed with CUDA events."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    rows = []
    for b, eager in ((1, False), (256, False), (256, True)):
        if ctx.left() < 130:
            log(f"skip breakdown batch {b}: budget")
            continue
        prompts = ctx.prompts(b, seed=11)
        engine = LLMEngine(ctx.model, block_size=16, kernel="triton", max_num_seqs=b,
                           max_num_batched_tokens=8192, enforce_eager=eager,
                           num_blocks=sum(len(p) // 16 + 4 for p in prompts))
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        engine.generate(prompts, params)  # warm-up
        run = engine.runner.execute

        def traced(seqs, blocks, run=run):
            decode = all(kv.num_new == 1 for kv in blocks)
            with record_function("decode_step" if decode else "other"):
                return run(seqs, blocks)

        engine.runner.execute = traced
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.generate(prompts, params)
        engine.runner.execute = run
        events = list(prof.events())
        marks = sorted((e.time_range.start, e.name) for e in events
                       if e.name in ("decode_step", "other"))
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        windows = [(t, marks[i + 1][0] if i + 1 < len(marks) else float("inf"))
                   for i, (t, name) in enumerate(marks) if name == "decode_step"]
        busy = sum(k.time_range.elapsed_us() for k in kernels
                   if any(a <= k.time_range.start < z for a, z in windows[1:-1]))
        gpu_ms = busy / 1e3 / max(1, len(windows) - 2)
        decode = [s for s in engine.stats["steps"] if s["num_batched_tokens"] == s["batch_size"]]
        wall_ms = 1e3 * sum(s["time_s"] for s in decode) / len(decode)
        replay_ms = None
        graphs = engine.runner.decode_graphs
        if graphs is not None and graphs.graphs:
            graph = graphs.graphs[min(g for g in graphs.graphs if g >= b)]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                graph.replay()
            end.record()
            end.synchronize()
            replay_ms = start.elapsed_time(end) / 20
        rows.append(bench.base_row(ctx.model, datasets.ENGINE, experiment="step_breakdown", batch=b,
                                block_size=16, cuda_graphs=engine.graphs()["cuda_graphs"],
                                decode_step_wall_ms=wall_ms, gpu_busy_ms=gpu_ms,
                                host_ms=wall_ms - gpu_ms, graph_replay_ms=replay_ms,
                                decode_steps=len(decode)))
        top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        with open(os.path.join(ctx.out, "engine_step_profile.txt"), "a") as f:
            f.write(f"\n=== batch {b}, eager={eager} ===\n{top}\n")
        log(f"breakdown b={b} eager={eager}: decode step {wall_ms:.2f} ms wall, GPU busy "
            f"{gpu_ms:.2f} ms, graph replay {replay_ms}")
        del engine
    df = ctx.save(rows, "engine_step_breakdown.csv")
    ctx.summary.append(df[["batch", "cuda_graphs", "decode_step_wall_ms", "gpu_busy_ms",
                           "host_ms", "graph_replay_ms"]].round(3).to_string())


def section_batch(ctx):
    quick = ctx.args.quick
    repeat = 1 if quick else ctx.args.repeat
    # (block size, batch, mode): "graphs" (compiled layers + CUDA graphs, the default),
    # "graphs_uncompiled" (graphs of the plain layers), "eager" (enforce_eager)
    points = [(16, b, "graphs") for b in BATCHES] + [(16, b, "eager") for b in (1, 256)]
    points += [(16, b, "graphs_uncompiled") for b in (1, 256)]
    points += [(bs, b, "graphs") for bs in BLOCKS[1:] for b in BATCHES]
    if quick:
        points = [(16, 1, "graphs"), (16, 256, "graphs"), (16, 1, "graphs_uncompiled")]
    rows = []
    for bs, b, mode in points:
        eager = mode == "eager"
        if ctx.left() < 170:
            log(f"skip throughput block {bs} batch {b} eager={eager}: budget")
            continue
        prompts = ctx.prompts(b, seed=b)
        r = bench.throughput_vs_batch(ctx.model, batch_sizes=(b,), block_sizes=(bs,),
                                      prompt_len=PROMPTS, max_tokens=NEW_TOKENS,
                                      kernel="triton", repeat=repeat, enforce_eager=eager,
                                      compile_model=mode == "graphs", seed=b)[0]
        step_bytes = bench.decode_bytes_per_step(ctx.model, prompts, NEW_TOKENS)
        r |= dict(mode=mode, decode_bytes_per_step=step_bytes,
                  copy_bandwidth_bytes_per_s=ctx.bandwidth)
        if ctx.bandwidth:
            r["bandwidth_fraction"] = step_bytes / (r["decode_step_ms"] / 1e3) / ctx.bandwidth
        rows.append(r)
        log(f"block {bs} batch {b} {mode}: decode {r['decode_tokens_per_s']:.0f} "
            f"tok/s ({r['decode_tokens_per_s_min']:.0f}-{r['decode_tokens_per_s_max']:.0f}), "
            f"end to end {r['tokens_per_s']:.0f}, step {r['decode_step_ms']:.2f} ms, "
            f"capture {r['graph_capture_s'] or 0:.1f} s, compile {r['compile_s']:.1f} s")
    df = ctx.save(rows, "engine_throughput_vs_batch.csv")
    g = df[df["mode"] == "graphs"]
    ctx.summary.append("decode tokens/s (graphs), block x batch\n" + g.pivot(
        index="batch", columns="block_size", values="decode_tokens_per_s").round(0)
        .to_string())
    ctx.summary.append(df[df.block_size == 16][[
        "batch", "mode", "decode_tokens_per_s", "decode_tokens_per_s_min",
        "decode_tokens_per_s_max", "tokens_per_s", "decode_step_ms",
        "bandwidth_fraction" if "bandwidth_fraction" in df else "decode_step_ms"]]
        .round(3).to_string())


def section_peers(ctx):
    quick = ctx.args.quick
    rows = []
    for b in ((1, 16) if quick else map(int, ctx.args.peer_batches.split(","))):
        if ctx.left() < 45:
            log(f"skip peers batch {b}: budget")
            continue
        repeat = 1 if quick else (ctx.args.repeat if b <= 16 else 2)
        r = bench.compare_with_transformers(
            ctx.model, ctx.prompts(b, seed=100 + b), max_tokens=NEW_TOKENS, repeat=repeat,
            methods=("engine", "padded_generate", "generate_batch"), block_size=16,
            kernel="triton", max_num_seqs=b, max_num_batched_tokens=8192)
        rows += r
        log(f"peers batch {b}: " + ", ".join(
            f"{x['method']} {x.get('tokens_per_s', float('nan')):.0f}" for x in r))
        ctx.peers = rows
        _save_peers(ctx)  # after each batch size: a run cut short keeps what it measured


def section_static_compile(ctx):
    """transformers' fastest single stream: a static cache, the forward torch.compile'd
    ("reduce-overhead", the default, segfaulted in its CUDA-graph path before; so "default",
    then "max-autotune-no-cudagraphs" if that fails and time allows)."""
    rows = []
    for mode in ("default", "max-autotune-no-cudagraphs"):
        if ctx.left() < 50:
            log(f"skip static compile ({mode}): budget")
            rows.append(dict(method="generate_static_compile", batch=1, compile_mode=mode,
                             error="not run: out of the run's time budget"))
            break
        limit = int(ctx.left() - 15)
        signal.signal(signal.SIGALRM, _out_of_time)
        signal.alarm(limit)  # a compile that outlasts the budget is a result too
        try:
            r = bench.compare_with_transformers(
                ctx.model, ctx.prompts(1, seed=101), max_tokens=NEW_TOKENS,
                repeat=ctx.args.repeat, methods=("generate_static_compile",),
                compile_mode=mode, block_size=16, kernel="triton", max_num_seqs=1)
        except TimeoutError:
            r = [dict(method="generate_static_compile", batch=1, compile_mode=mode,
                      error=f"not finished within the run's remaining {limit} s")]
        finally:
            signal.alarm(0)
        rows += r
        log(f"static compile ({mode}): {r[-1].get('tokens_per_s')} {r[-1]['error']}")
        if not r[-1]["error"]:
            break
    ctx.peers = getattr(ctx, "peers", []) + rows
    _save_peers(ctx)


def _out_of_time(signum, frame):
    raise TimeoutError("time budget")


def _save_peers(ctx):
    df = ctx.save(ctx.peers, "engine_vs_transformers_h200.csv")
    cols = [c for c in ("batch", "method", "compile_mode", "tokens_per_s", "repeats",
                        "outputs_equal_engine", "error") if c in df]
    ctx.summary = [x for x in ctx.summary if not x.startswith("peers:")]
    ctx.summary.append("peers:\n" + df[cols].to_string())


def section_equal_memory(ctx):
    if ctx.left() < 60:
        log("skip equal memory: budget")
        return
    from pagebench.config import KVGeometry

    n = 64 if ctx.args.quick else 128
    prompts = bench.random_prompts(n, 16, 512, ctx.model.config.vocab_size, seed=7)
    geo = KVGeometry.from_config(ctx.model.config, dtype=torch.bfloat16)
    kv_bytes = 32 * (512 + 64) * geo.bytes_per_token  # padded generate: 32 sequences at once
    rows = bench.equal_memory_comparison(ctx.model, kv_bytes, prompts, 64, block_size=16,
                                         kernel="triton")
    df = ctx.save(rows, "engine_equal_memory_h200.csv")
    ctx.summary.append(df[["method", "concurrent_seqs", "tokens_per_s", "time_s",
                           "cuda_graphs" if "cuda_graphs" in df else "method"]].to_string())


if __name__ == "__main__":
    sys.exit(main())
