"""One rank of the tensor-parallel engine test (run by tests/test_parallel.py under torchrun).

Each rank runs the single-process engine and the tp=2 engine on the same tiny random model
(greedy with preemption and prefix caching; seeded n=2 sampling, which forks and copies on
write) and writes what it saw to ``<out>/rank<R>.json``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from engine_models import VOCAB, small_model

from pagebench.engine import LLMEngine, SamplingParams
from pagebench.errors import ConfigError, PagebenchError


def tiny_model(kv_heads: int):
    return small_model("llama", num_key_value_heads=kv_heads)


def prompts():
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, VOCAB, (12,), generator=g).tolist()
    own = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 3, 11)]
    return [shared + p if i % 2 else p for i, p in enumerate(own)]  # some share a prefix


def run(engine, check: bool):
    engine.tp.check_tables = check
    greedy = engine.generate(prompts(), SamplingParams(max_tokens=12, ignore_eos=True))
    stats = engine.stats
    sampled = engine.generate(prompts()[:3], SamplingParams(max_tokens=8, temperature=0.8,
                                                            n=2, seed=7, ignore_eos=True))
    unseeded = engine.generate(prompts()[:2], SamplingParams(max_tokens=6, temperature=1.0,
                                                             ignore_eos=True))

    def outs(res):
        return [[o.token_ids for o in r.outputs] for r in res]

    return dict(greedy=outs(greedy), sampled=outs(sampled), unseeded=outs(unseeded),
                preemptions=stats.num_preemptions,
                prefix_hit_rate=stats.prefix_cache_hit_rate,
                kv_heads_per_rank=engine.kv_heads_per_rank,
                cache_heads=engine.runner.kv.shape[-2], num_blocks=engine.num_blocks)


def main(out_dir):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {"rank": rank}
    for kv_heads in (2, 1):  # 1: tp exceeds the KV heads, the head is replicated
        kwargs = dict(block_size=4, num_blocks=24, enable_prefix_caching=True, kernel="torch")
        single = LLMEngine(tiny_model(kv_heads), **kwargs)
        parallel = LLMEngine(tiny_model(kv_heads), tensor_parallel_size=2, **kwargs)
        result[f"kv{kv_heads}"] = dict(single=run(single, False), parallel=run(parallel, True),
                                       replication=parallel.tp.kv_replication)
    try:
        LLMEngine(tiny_model(2), tensor_parallel_size=4, num_blocks=8)
    except ConfigError as e:
        result["too_many_ranks"] = str(e)
    diverging = LLMEngine(tiny_model(2), tensor_parallel_size=2, num_blocks=24, block_size=4)
    diverging.tp.check_tables = True
    try:  # rank 1 asks for a longer prompt: its tables differ at the first step
        diverging.generate([prompts()[0] * (1 + rank)], SamplingParams(max_tokens=2))
    except PagebenchError as e:
        result["diverged"] = str(e)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
