"""H200: the engine on a random-weight Qwen2.5-0.5B (bf16, Triton kernel).

    PYTHONPATH=. python3 scripts/h200_engine.py --out $OUT [--budget-s 270]

1. correctness on the GPU: a tiny fp32 model, engine (triton) vs transformers greedy, batch 1;
2. throughput vs batch size (1..256) for block sizes 8/16/32/128;
3. engine vs padded ``generate`` at equal batch size (mixed prompt lengths);
4. engine vs padded ``generate`` at equal KV memory (paging admits more sequences).
Sections past the time budget are skipped (and say so). CSVs go to --out.
"""

import argparse
import os
import sys
import time

import pandas as pd
import torch

from pagebench.engine import LLMEngine, SamplingParams, bench

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/h200_engine"))
    ap.add_argument("--budget-s", type=float, default=270)
    ap.add_argument("--sections", default="equality,batch,equal_batch,equal_memory",
                    help="comma-separated subset to run")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    left = lambda: args.budget_s - (time.time() - T0)  # noqa: E731
    summary = []

    def save(rows, name):
        df = pd.DataFrame(rows)
        df.to_csv(os.path.join(args.out, name), index=False)
        log(f"wrote {name} ({len(df)} rows)")
        return df

    sections = set(args.sections.split(","))

    # 1. correctness (tiny fp32 model, triton decode on the GPU)
    if "equality" in sections:
        equality(save, summary)
    model = bench.preset_model("qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda")
    log("model ready")
    if "batch" in sections:
        throughput(model, save, summary, left)
    if "equal_batch" in sections:
        equal_batch(model, save, summary, left)
    if "equal_memory" in sections:
        equal_memory(model, save, summary, left)
    print("\n\n".join(summary))
    log("done")


def equality(save, summary):
    tiny = bench.tiny_model(device="cuda")
    prompts = bench.random_prompts(8, 1, 300, tiny.config.vocab_size, seed=3)
    ref = bench.padded_generate(tiny, prompts, 16, batch_size=1)  # unpadded, one by one
    rows = []
    for bs in (1, 16, 128):
        for prefix in (False, True):
            eng = LLMEngine(tiny, block_size=bs, num_blocks=8192 // bs, kernel="triton",
                            enable_prefix_caching=prefix)
            out = [r.outputs[0].token_ids for r in
                   eng.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))]
            rows.append(bench._base(tiny, experiment="gpu_greedy_equality", block_size=bs,
                                    prefix_caching=prefix, kernel="triton",
                                    prefill_kernel=eng.runner.prefill_backend.name,
                                    num_prompts=len(prompts),
                                    prompts_equal=sum(a == b for a, b in zip(out, ref))))
    df = save(rows, "engine_gpu_equality.csv")
    summary.append(df[["block_size", "prefix_caching", "prompts_equal", "num_prompts"]].to_string())


def throughput(model, save, summary, left):
    rows = []
    for bs in (16, 8, 32, 128):
        for b in (1, 4, 16, 64, 256):
            if left() < 150:
                log(f"skip throughput block {bs} batch {b}: budget")
                continue
            rows += bench.throughput_vs_batch(model, batch_sizes=(b,), block_sizes=(bs,),
                                              prompt_len=128, max_tokens=32, kernel="triton")
            log(f"block {bs} batch {b}: {rows[-1]['tokens_per_s']:.0f} tok/s")
    df = save(rows, "engine_throughput_vs_batch.csv")
    summary.append(df.pivot(index="batch_size", columns="block_size",
                            values="tokens_per_s").round(0).to_string())


def equal_batch(model, save, summary, left):
    rows = []
    for b in (16, 64, 256):
        if left() < 90:
            log(f"skip equal-batch {b}: budget")
            continue
        prompts = bench.random_prompts(b, 16, 512, model.config.vocab_size, seed=b)
        rows += bench.compare_with_transformers(
            model, prompts, max_tokens=64, repeat=1, methods=("engine", "padded_generate"),
            block_size=16, kernel="triton", max_num_seqs=b, max_num_batched_tokens=8192)
        log(f"equal batch {b}: " + ", ".join(f"{r['method']} {r['tokens_per_s']:.0f}"
                                            for r in rows[-2:]))
    df = save(rows, "engine_vs_transformers_h200.csv")
    summary.append(df[["num_requests", "method", "tokens_per_s", "outputs_equal_engine"]]
                   .to_string())


def equal_memory(model, save, summary, left):
    # padded generate holds 32 reserved sequences of max prompt + 64
    if left() > 40:
        prompts = bench.random_prompts(256, 16, 512, model.config.vocab_size, seed=7)
        from pagebench.config import KVGeometry
        geo = KVGeometry.from_config(model.config, dtype=torch.bfloat16)
        kv_bytes = 32 * (512 + 64) * geo.bytes_per_token
        rows = bench.equal_memory_comparison(model, kv_bytes, prompts, 64, block_size=16,
                                             kernel="triton")
        df = save(rows, "engine_equal_memory_h200.csv")
        summary.append(df[["method", "concurrent_seqs", "tokens_per_s", "time_s"]].to_string())
    else:
        log("skip equal memory: budget")


if __name__ == "__main__":
    sys.exit(main())
