"""CPU: LLMEngine against transformers' generation, and engine throughput vs batch size.

    .venv/bin/python scripts/cpu_engine_compare.py [--out reports/data/cpu] [--repeat 3]

Writes engine_vs_transformers.csv (64 requests, prompts 16-256 tokens, 64 new tokens each;
engine vs padded ``generate`` vs ``generate_batch``, greedy outputs compared token for token),
engine_throughput_vs_batch.csv, and the report's engine tables (copy-on-write, prefix caching,
pool size). Tiny random Qwen2 model: 2 layers, hidden 128, fp32.
"""

import argparse
import os
import sys
import time

import pandas as pd

from pagebench.engine import bench


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/data/cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["compare", "batch", "tables"], nargs="*")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only or ["compare", "batch", "tables"])
    model = bench.tiny_model()
    extra = dict(cpu_count=os.cpu_count(),
                 note="shared 2-core machine, other jobs running")

    def save(rows, name):
        df = pd.DataFrame(rows).assign(**extra)
        df.to_csv(os.path.join(args.out, name), index=False)
        print(f"wrote {name} ({len(df)} rows)", file=sys.stderr)
        return df

    if "compare" in only:
        prompts = bench.random_prompts(64, 16, 256, model.config.vocab_size, seed=1)
        t0 = time.time()
        df = save(bench.compare_with_transformers(model, prompts, max_tokens=64,
                                                  repeat=args.repeat, block_size=16,
                                                  kernel="torch"),
                  "engine_vs_transformers.csv")
        print(df[["method", "tokens_per_s", "time_s", "outputs_equal_engine"]].to_string())
        eng = df.set_index("method").tokens_per_s
        print(f"engine / padded generate = {eng['engine'] / eng['padded_generate']:.2f}x, "
              f"engine / generate_batch = {eng['engine'] / eng['generate_batch']:.1f}x "
              f"({time.time() - t0:.0f} s)")
    if "batch" in only:
        df = save(bench.throughput_vs_batch(model, batch_sizes=(1, 4, 16, 64, 256),
                                            block_sizes=(8, 16, 32, 128), prompt_len=64,
                                            max_tokens=32, kernel="torch", repeat=args.repeat),
                  "engine_throughput_vs_batch.csv")
        print(df.pivot(index="batch", columns="block_size", values="tokens_per_s").round(0))
    if "tables" in only:
        for name, fn in (("engine_cow.csv", bench.cow_comparison),
                         ("engine_prefix_cache.csv", bench.prefix_cache_comparison),
                         ("engine_pool_size.csv", bench.pool_size_sweep)):
            df = save(fn(model), name)
            print(df.drop(columns=[c for c in df.columns if c.endswith("_version")
                                   or c in ("device", "device_name", "commit", "note")]).to_string())


if __name__ == "__main__":
    main()
