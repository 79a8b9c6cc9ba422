"""Engine measurements as functions returning tidy rows (one dict per measurement).

Used by ``pagebench engine-bench``, the report, asv and the scripts under ``scripts/``. Every
row carries ``pagebench.timing.environment(device)``. The defaults run in seconds on a CPU with
a tiny random model (``tiny_model()``); pass a real-shaped model for device runs.
"""

from __future__ import annotations

import functools
import time

import torch

from pagebench.config import ceil_div
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.timing import cpu_threads, environment, measure

TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


def tiny_model(seed: int = 0, dtype=torch.float32, device="cpu", **overrides):
    """A random-weight Qwen2 model (2 layers, hidden 128 unless overridden). The wide
    ``initializer_range`` spreads the logits, so greedy decoding has no near-ties."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**(TINY | {"initializer_range": 0.2} | overrides),
                         attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: generate every token asked for
    return model


def preset_model(name: str = "qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda", seed=0):
    """A random-weight model with a published model's shape (``pagebench.config.PRESETS``)."""
    from transformers import AutoModelForCausalLM

    from pagebench.config import preset_config

    torch.manual_seed(seed)
    config = preset_config(name)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval()


def random_prompts(num: int, min_len: int, max_len: int, vocab_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=g).tolist()
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


def _threads(fn):
    """Adds ``threads=1`` (CPU intra-op threads while the measurement runs) to a bench function."""
    @functools.wraps(fn)
    def wrapper(*args, threads: int | None = 1, **kwargs):
        with cpu_threads(threads):
            rows = fn(*args, **kwargs)
        return [r | {"torch_threads": threads or torch.get_num_threads()} for r in rows]
    return wrapper


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _base(model, **fields) -> dict:
    dev = _device(model)
    cfg = model.config
    return environment(dev) | dict(
        model=f"{cfg.model_type}-L{cfg.num_hidden_layers}-H{cfg.hidden_size}",
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."), **fields)


def _timed(fn, device, repeat: int):
    """Median wall time of ``fn()`` in seconds, and the last call's result."""
    box = {}
    timing = measure(lambda: box.__setitem__("out", fn()), device=str(device), warmup=1,
                     repeat=repeat, flush_l2=False)
    return timing.median_us / 1e6, box["out"]


def _wall(fn, device):
    """One cold call of ``fn()``: (wall seconds, result), the device synchronised around it.
    For runs whose state a warm-up would change (a prefix cache, a shared pool)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _engine_row(engine: LLMEngine, seconds: float) -> dict:
    s = engine.stats
    return dict(tokens_per_s=s["num_generated_tokens"] / seconds, time_s=seconds,
                num_generated_tokens=s["num_generated_tokens"], peak_blocks=s["peak_blocks"],
                mean_blocks=s["mean_blocks"], num_blocks=engine.num_blocks,
                token_utilisation=s["token_utilisation"], num_preemptions=s["num_preemptions"],
                fresh_prefill=engine.runner.fresh_prefill,
                prefill_kernel=engine.runner.prefill_backend.name,
                num_steps=len(s["steps"]), max_batch=max((x["batch_size"] for x in s["steps"]),
                                                         default=0))


def run_engine(model, prompts, max_tokens: int, repeat: int = 1, **engine_kwargs):
    """(row, outputs) of ``LLMEngine(model, **engine_kwargs).generate`` timed, greedy."""
    engine = LLMEngine(model, **engine_kwargs)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seconds, outs = _timed(lambda: engine.generate(prompts, params), _device(model), repeat)
    return _engine_row(engine, seconds), [o.outputs[0].token_ids for o in outs]


# ---- baselines: transformers' own generation ---------------------------------------------------

def padded_generate(model, prompts, max_tokens: int, batch_size: int | None = None):
    """transformers ``generate`` on left-padded batches (contiguous cache); greedy outputs."""
    dev = _device(model)
    batch_size = batch_size or len(prompts)
    outs = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, p in enumerate(chunk):
                ids[j, width - len(p):] = torch.tensor(p)
                mask[j, width - len(p):] = 1
            out = model.generate(ids.to(dev), attention_mask=mask.to(dev), do_sample=False,
                                 max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 pad_token_id=0)
            outs.extend(out[:, width:].tolist())
    return outs


def generate_batch(model, prompts, max_tokens: int):
    """transformers' continuous batching (``model.generate_batch``, its paged cache)."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        res = model.generate_batch(prompts, generation_config=config, progress_bar=False)
    by_id = list(res.values())
    if len(by_id) != len(prompts):
        raise RuntimeError(f"generate_batch returned {len(by_id)} results for {len(prompts)}")
    # request ids are "req_<i>": order by the prompt index
    ordered = sorted(res.items(), key=lambda kv: int(str(kv[0]).rsplit("_", 1)[-1]))
    return [list(o.generated_tokens) for _, o in ordered]


@_threads
def compare_with_transformers(model, prompts, max_tokens: int = 64, repeat: int = 3,
                              methods=("engine", "padded_generate", "generate_batch"),
                              **engine_kwargs) -> list[dict]:
    """Tokens/s of the engine and of transformers' generation on the same greedy requests,
    measured interleaved (one repeat of each method in turn), with each method's outputs
    checked token for token against the engine's."""
    dev = _device(model)
    engine = LLMEngine(model, **engine_kwargs)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    runs = {
        "engine": lambda: [o.outputs[0].token_ids for o in engine.generate(prompts, params)],
        "padded_generate": lambda: padded_generate(model, prompts, max_tokens),
        "generate_batch": lambda: generate_batch(model, prompts, max_tokens),
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    outputs = {}
    for m in methods:  # warm-up
        runs[m]()
    for _ in range(repeat):
        for m in methods:
            seconds, outputs[m] = _wall(runs[m], dev)
            times[m].append(seconds)
    reference = outputs.get("engine")
    generated = len(prompts) * max_tokens
    rows = []
    for m in methods:
        t = sorted(times[m])[len(times[m]) // 2]
        same = None if reference is None else sum(a == b for a, b in zip(outputs[m], reference))
        rows.append(_base(model, experiment="compare_with_transformers", method=m,
                          num_requests=len(prompts),
                          prompt_len_min=min(map(len, prompts)),
                          prompt_len_max=max(map(len, prompts)), max_tokens=max_tokens,
                          block_size=engine.block_size if m == "engine" else None,
                          kernel=engine.runner.decode_backend.name if m == "engine" else None,
                          fresh_prefill=engine.runner.fresh_prefill if m == "engine" else None,
                          tokens_per_s=generated / t, time_s=t, repeats=repeat,
                          outputs_equal_engine=same,
                          timing="perf_counter, median of interleaved repeats"))
    return rows


# ---- report-facing measurements ----------------------------------------------------------------

@_threads
def throughput_vs_batch(model=None, batch_sizes=(1, 4, 16, 64), block_sizes=(8, 16, 32, 128),
                        prompt_len: int = 64, max_tokens: int = 32, kernel: str = "auto",
                        repeat: int = 1, num_blocks: int | None = None) -> list[dict]:
    """Decode-heavy throughput of the engine for each (block size, batch size): ``batch_size``
    requests of ``prompt_len`` tokens, ``max_tokens`` each, all admitted at once."""
    model = model or tiny_model()
    rows = []
    for bs in block_sizes:
        for b in batch_sizes:
            prompts = random_prompts(b, prompt_len, prompt_len, model.config.vocab_size, seed=b)
            need = b * ceil_div(prompt_len + max_tokens, bs)
            row, _ = run_engine(model, prompts, max_tokens, repeat, block_size=bs,
                                num_blocks=num_blocks or need, kernel=kernel, max_num_seqs=b,
                                max_num_batched_tokens=max(2048, b * prompt_len))
            rows.append(_base(model, experiment="throughput_vs_batch", block_size=bs,
                              batch_size=b, prompt_len=prompt_len, max_tokens=max_tokens,
                              kernel=kernel, **row))
    return rows


@_threads
def cow_comparison(model=None, prompt_len: int = 512, max_tokens: int = 32, n: int = 4,
                   block_size: int = 16, seed: int = 0) -> list[dict]:
    """Parallel sampling: one request with ``n`` completions sharing its prompt's blocks
    (copy-on-write) against ``n`` independent requests, and one request with ``n = 1``."""
    model = model or tiny_model()
    prompt = random_prompts(1, prompt_len, prompt_len, model.config.vocab_size, seed)[0]
    engine = LLMEngine(model, block_size=block_size,
                       num_blocks=(n + 1) * ceil_div(prompt_len + max_tokens, block_size))
    rows = []
    for label, prompts, k in (("n=1", [prompt], 1), (f"n={n} shared", [prompt], n),
                              (f"{n} separate requests", [prompt] * n, 1)):
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, n=k, seed=seed,
                                ignore_eos=True)
        seconds, _ = _wall(lambda: engine.generate(prompts, params), _device(model))
        rows.append(_base(model, experiment="cow", variant=label, completions=len(prompts) * k,
                          prompt_len=prompt_len, max_tokens=max_tokens, block_size=block_size,
                          **_engine_row(engine, seconds)))
    return rows


@_threads
def prefix_cache_comparison(model=None, system_len: int = 256, num_requests: int = 16,
                            suffix_len: tuple[int, int] = (8, 64), max_tokens: int = 16,
                            block_size: int = 16, seed: int = 0) -> list[dict]:
    """Requests sharing a system prompt, prefix caching off and on, all in one ``generate``
    call: requests admitted in the same step share the blocks it fills."""
    model = model or tiny_model()
    vocab = model.config.vocab_size
    system = random_prompts(1, system_len, system_len, vocab, seed)[0]
    prompts = [system + s for s in random_prompts(num_requests, *suffix_len, vocab, seed + 1)]
    rows = []
    for on in (False, True):
        engine = LLMEngine(model, block_size=block_size, enable_prefix_caching=on,
                           num_blocks=num_requests * ceil_div(system_len + suffix_len[1] + max_tokens,
                                                             block_size))
        seconds, _ = _wall(lambda: engine.generate(
            prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True)), _device(model))
        s = engine.stats
        rows.append(_base(model, experiment="prefix_cache", prefix_caching=on,
                          num_requests=num_requests, system_len=system_len,
                          block_size=block_size, hit_rate=s["prefix_cache_hit_rate"],
                          num_prompt_tokens=s["num_prompt_tokens"],
                          num_computed_prompt_tokens=s["num_computed_prompt_tokens"],
                          **_engine_row(engine, seconds)))
    return rows


@_threads
def pool_size_sweep(model=None, pool_fractions=(0.15, 0.25, 0.4, 0.6, 0.8, 1.0),
                    num_requests: int = 32, prompt_len: tuple[int, int] = (16, 128),
                    max_tokens: int = 64, block_size: int = 16, seed: int = 0) -> list[dict]:
    """Throughput and preemptions as the pool shrinks below what all requests need at once
    (fraction 1.0): the capacity cliff."""
    model = model or tiny_model()
    prompts = random_prompts(num_requests, *prompt_len, model.config.vocab_size, seed)
    per_request = [ceil_div(len(p) + max_tokens - 1, block_size) for p in prompts]
    full, biggest = sum(per_request), max(per_request)
    rows = []
    for frac in pool_fractions:
        blocks = max(biggest, round(full * frac))
        engine = LLMEngine(model, block_size=block_size, num_blocks=blocks)
        seconds, _ = _wall(lambda: engine.generate(
            prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True)), _device(model))
        rows.append(_base(model, experiment="pool_size", pool_fraction=blocks / full,
                          blocks_needed_all=full, num_requests=num_requests,
                          block_size=block_size,
                          recomputed_tokens=engine.stats["num_computed_prompt_tokens"]
                          - engine.stats["num_prompt_tokens"],
                          **_engine_row(engine, seconds)))
    return rows


@_threads
def equal_memory_comparison(model, kv_bytes: int, prompts, max_tokens: int,
                            block_size: int = 16, kernel: str = "auto") -> list[dict]:
    """Same KV memory for both: padded ``generate`` reserves ``max prompt + max_tokens`` slots
    per sequence, so it runs ``kv_bytes // that`` sequences per batch; the engine's pool of the
    same bytes admits as many as their actual tokens allow."""
    from pagebench.config import KVGeometry

    geo = KVGeometry.from_config(model.config, dtype=next(model.parameters()).dtype)
    reserve = max(map(len, prompts)) + max_tokens
    contiguous_batch = max(1, kv_bytes // (reserve * geo.bytes_per_token))
    dev = _device(model)
    rows = []
    padded_generate(model, prompts[:contiguous_batch], 2)  # warm-up
    seconds, _ = _wall(lambda: padded_generate(model, prompts, max_tokens,
                                               batch_size=contiguous_batch), dev)
    generated = len(prompts) * max_tokens
    rows.append(_base(model, experiment="equal_memory", method="padded_generate",
                      kv_bytes=kv_bytes, concurrent_seqs=contiguous_batch,
                      num_requests=len(prompts), max_tokens=max_tokens,
                      tokens_per_s=generated / seconds, time_s=seconds))
    engine = LLMEngine(model, block_size=block_size, kv_cache_memory=kv_bytes, kernel=kernel,
                       max_num_seqs=len(prompts), max_num_batched_tokens=8192)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engine.generate(prompts[:4], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    seconds, _ = _wall(lambda: engine.generate(prompts, params), dev)
    rows.append(_base(model, experiment="equal_memory", method="engine", kv_bytes=kv_bytes,
                      concurrent_seqs=max(x["batch_size"] for x in engine.stats["steps"]),
                      num_requests=len(prompts), max_tokens=max_tokens, block_size=block_size,
                      kernel=engine.runner.decode_backend.name,
                      **_engine_row(engine, seconds)))
    return rows
