"""Engine measurements as functions returning tidy rows (one dict per measurement).

Used by ``pagebench engine-bench``, the report, asv and the scripts under ``scripts/``. Every
row carries ``pagebench.measure.timing.environment(device)``. The defaults run in seconds on a CPU with
a tiny random model (``tiny_model()``); pass a real-shaped model for device runs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import statistics
import time

import torch

from pagebench.config import ceil_div, dtype_name
from pagebench.defaults import ENGINE_BLOCK_SIZES, TINY_MODEL
from pagebench.engine.block_manager import blocks_needed
from pagebench.engine.engine import LLMEngine
from pagebench.engine.sampling import SamplingParams
from pagebench.results import datasets
from pagebench.results.schema import Schema
from pagebench.measure.timing import cpu_threads, environment


# model family -> transformers' (config, model) class names
TINY_FAMILIES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                 "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                 "llama": ("LlamaConfig", "LlamaForCausalLM"),
                 "mistral": ("MistralConfig", "MistralForCausalLM")}


def tiny_model(seed: int = 0, dtype=torch.float32, device="cpu", family: str = "qwen2",
               **overrides):
    """A random-weight model of ``family`` (``TINY_FAMILIES``; 2 layers, hidden 128 unless
    overridden). The wide ``initializer_range`` spreads the logits, so greedy decoding has no
    near-ties."""
    import transformers

    config_cls, model_cls = (getattr(transformers, name) for name in TINY_FAMILIES[family])
    torch.manual_seed(seed)
    config = config_cls(**(TINY_MODEL | {"initializer_range": 0.2} | overrides),
                        attn_implementation="sdpa")
    model = model_cls(config).to(device=device, dtype=dtype).eval()
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


def blocks_for_all(prompts, max_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` that hold every prompt with its ``max_tokens`` at once: a pool
    that never preempts."""
    return sum(blocks_needed(len(p) + max_tokens, block_size) for p in prompts)


def random_prompts(num: int, min_len: int, max_len: int, vocab_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=g).tolist()
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


def with_threads(fn):
    """Adds ``threads=1`` (CPU intra-op threads while the measurement runs; None: torch's
    current setting) to a bench function returning a row or a list of rows, and names the
    count in each row's ``torch_threads``."""
    @functools.wraps(fn)
    def wrapper(*args, threads: int | None = 1, **kwargs):
        with cpu_threads(threads):
            result = fn(*args, **kwargs)
        used = {"torch_threads": threads or torch.get_num_threads()}
        return result | used if isinstance(result, dict) else [r | used for r in result]
    return wrapper


def _device(model) -> torch.device:
    return next(model.parameters()).device


def base_row(model, dataset: Schema, **fields) -> dict:
    """A row of ``dataset`` (one of :mod:`pagebench.results.datasets`' engine datasets): the
    environment (device, versions, commit; on a CPU its logical core count, which the report's
    device label names), model, dtype, ``experiment`` (the dataset's name unless ``fields``
    names it: the catch-all ``engine`` dataset's rows do) and ``fields``."""
    dev = _device(model)
    cfg = model.config
    cores = {"cpu_count": os.cpu_count()} if dev.type == "cpu" else {}
    return dataset.row(**environment(dev) | cores | dict(
        model=f"{cfg.model_type}-L{cfg.num_hidden_layers}-H{cfg.hidden_size}",
        dtype=dtype_name(next(model.parameters()).dtype),
        experiment=dataset.name) | fields)


def wall(fn, device):
    """One cold call of ``fn()``: (wall seconds, result), ``device`` synchronised around it
    (a CUDA device; nothing to wait for on a CPU). For runs whose state a warm-up would change
    (a prefix cache, a shared pool)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, out


def release_memory(device) -> None:
    """Free a dropped engine's cache before the next one allocates its own: collect what only
    a reference cycle still holds and, on CUDA, hand the allocator's cached blocks back."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _engine_row(engine: LLMEngine, seconds: float) -> dict:
    s = engine.stats
    return dict(tokens_per_s=s.num_generated_tokens / seconds, time_s=seconds,
                decode_tokens_per_s=s.decode_tokens_per_s,
                decode_step_ms=1e3 * s.decode_time_s / max(1, s.num_decode_steps),
                num_generated_tokens=s.num_generated_tokens, peak_blocks=s.peak_blocks,
                mean_blocks=s.mean_blocks, num_blocks=engine.num_blocks,
                token_utilisation=s.token_utilisation, num_preemptions=s.num_preemptions,
                fresh_prefill=engine.runner.fresh_prefill,
                prefill_kernel=engine.runner.prefill_backend.name,
                num_steps=len(s.steps), max_batch=max((x.batch_size for x in s.steps),
                                                         default=0),
                cuda_graphs=s.cuda_graphs, graph_capture_s=s.graphs.get("graph_capture_s"),
                graph_memory_bytes=s.graphs.get("graph_memory_bytes"),
                compiled_layers=s.compiled_layers, compile_s=s.graphs["compile_s"])


def _spread(name: str, values: list[float]) -> dict:
    """The median (the mean of the middle two of an even count), min and max of one measure
    over repeats: the spread a verdict's noise band is read from."""
    return {name: statistics.median(values), f"{name}_min": min(values),
            f"{name}_max": max(values)}


def run_engine(model, prompts, max_tokens: int, repeat: int = 1, **engine_kwargs):
    """(row, outputs) of ``LLMEngine(model, **engine_kwargs).generate`` timed, greedy: one
    warm-up, then ``repeat`` calls; tokens/s end to end and in decode steps as the median over
    the calls, with their min and max (``*_min``, ``*_max``)."""
    engine = LLMEngine(model, **engine_kwargs)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    dev = _device(model)
    engine.generate(prompts, params)
    times, decode, outs = [], [], None
    for _ in range(repeat):
        seconds, outs = wall(lambda: engine.generate(prompts, params), dev)
        times.append(seconds)
        decode.append(engine.stats.decode_tokens_per_s)
    seconds = statistics.median(times)
    generated = engine.stats.num_generated_tokens
    row = _engine_row(engine, seconds) | _spread("tokens_per_s", [generated / t for t in times]) \
        | _spread("decode_tokens_per_s", decode) \
        | dict(repeats=repeat, kernel=engine.runner.decode_backend.name)  # "auto" resolved
    return row, [o.outputs[0].token_ids for o in outs]


def decode_bytes_per_step(model, prompts, max_tokens: int) -> float:
    """Bytes a decode step of all ``prompts`` must read at least, on average over the
    ``max_tokens`` steps: every weight once (tied ones once) plus every sequence's K/V (its
    context half-way through generation)."""
    from pagebench.config import KVGeometry

    dtype = next(model.parameters()).dtype
    params = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    kv = KVGeometry.from_config(model.config, dtype=dtype).bytes_per_token
    return sum(params.values()) + kv * sum(len(p) + max_tokens / 2 for p in prompts)


# ---- baselines: transformers' own generation ---------------------------------------------------

def padded_generate(model, prompts, max_tokens: int, batch_size: int | None = None,
                    compile_mode: str | None = None):
    """transformers ``generate`` on left-padded batches (contiguous cache); greedy outputs.
    ``compile_mode``: a static cache (``cache_implementation="static"``) with the forward
    compiled by ``torch.compile(mode=compile_mode)``, transformers' fastest single stream."""
    dev = _device(model)
    batch_size = batch_size or len(prompts)
    extra = {}
    if compile_mode is not None:
        from transformers import CompileConfig

        extra = dict(cache_implementation="static",
                     compile_config=CompileConfig(mode=compile_mode))
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
                                 pad_token_id=0, **extra)
            outs.extend(out[:, width:].tolist())
    return outs


def generate_batch(model, prompts, max_tokens: int):
    """transformers' continuous batching (``model.generate_batch``, its paged cache). Under
    ``torch.no_grad``: transformers 5.17 fails under ``inference_mode`` ("Inplace update to
    inference tensor outside InferenceMode")."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        res = model.generate_batch(prompts, generation_config=config, progress_bar=False)
    by_id = list(res.values())
    if len(by_id) != len(prompts):
        raise RuntimeError(f"generate_batch returned {len(by_id)} results for {len(prompts)}")
    # request ids are "req_<i>": order by the prompt index
    ordered = sorted(res.items(), key=lambda kv: int(str(kv[0]).rsplit("_", 1)[-1]))
    return [list(o.generated_tokens) for _, o in ordered]


TRANSFORMERS_METHODS = ("padded_generate", "generate_batch", "generate_static_compile")


@with_threads
def compare_with_transformers(model, prompts, max_tokens: int = 64, repeat: int = 3,
                              methods=("engine", "padded_generate", "generate_batch"),
                              compile_mode: str = "default", **engine_kwargs) -> list[dict]:
    """Tokens/s of the engine and of transformers' generation on the same greedy requests,
    measured interleaved (one repeat of each method in turn, after one warm-up call each),
    with each method's outputs checked token for token against the engine's.
    ``generate_static_compile`` is ``padded_generate(compile_mode=compile_mode)``. A method
    that raises gets a row with its ``error`` and no timing."""
    dev = _device(model)
    engine = LLMEngine(model, **engine_kwargs)
    runs = {
        "engine": lambda p=prompts, n=max_tokens: [
            o.outputs[0].token_ids for o in engine.generate(p, SamplingParams(
                max_tokens=n, ignore_eos=True))],
        "padded_generate": lambda p=prompts, n=max_tokens: padded_generate(model, p, n),
        "generate_batch": lambda p=prompts, n=max_tokens: generate_batch(model, p, n),
        "generate_static_compile": lambda p=prompts, n=max_tokens: padded_generate(
            model, p, n, compile_mode=compile_mode),
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    decode: list[float] = []
    outputs, errors = {}, {}
    for m in methods:  # warm-up (and compilation): every method on the same, real requests
        try:
            runs[m]()
        except Exception as e:  # noqa: BLE001 -- a peer that fails is a result, not a crash
            errors[m] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    for _ in range(repeat):
        for m in methods:
            if m in errors:
                continue
            seconds, outputs[m] = wall(runs[m], dev)
            times[m].append(seconds)
            if m == "engine":
                decode.append(engine.stats.decode_tokens_per_s)
    reference = outputs.get("engine")
    generated = len(prompts) * max_tokens
    rows = []
    for m in methods:
        is_engine = m == "engine"
        row = dict(method=m, batch=len(prompts), num_requests=len(prompts),
                   prompt_len_min=min(map(len, prompts)),
                   prompt_len_max=max(map(len, prompts)), max_tokens=max_tokens,
                   block_size=engine.block_size if is_engine else None,
                   kernel=engine.runner.decode_backend.name if is_engine else None,
                   fresh_prefill=engine.runner.fresh_prefill if is_engine else None,
                   cuda_graphs=engine.stats.cuda_graphs if is_engine else None,
                   compiled_layers=engine.stats.compiled_layers if is_engine else None,
                   compile_mode=compile_mode if m == "generate_static_compile" else None,
                   repeats=len(times[m]), error=errors.get(m), tokens_per_s=None,
                   timing="perf_counter, median of interleaved repeats")
        if times[m]:
            t = statistics.median(times[m])
            same = None if reference is None else \
                sum(a == b for a, b in zip(outputs[m], reference))
            row |= _spread("tokens_per_s", [generated / x for x in times[m]]) | dict(
                time_s=t, outputs_equal_engine=same)
            if is_engine:
                row |= _spread("decode_tokens_per_s", decode)
        rows.append(base_row(model, datasets.ENGINE_COMPARE, **row))
    return rows


# ---- report-facing measurements ----------------------------------------------------------------

@with_threads
def throughput_vs_batch(model=None, batch_sizes=(1, 4, 16, 64), block_sizes=ENGINE_BLOCK_SIZES,
                        prompt_len: int | tuple[int, int] = 64, max_tokens: int = 32,
                        kernel: str = "auto", repeat: int = 1, num_blocks: int | None = None,
                        mode: str | None = None, copy_bandwidth: float | None = None,
                        seed: int | None = None) -> list[dict]:
    """Decode-heavy throughput of the engine for each (block size, batch size): ``batch``
    requests of ``prompt_len`` tokens (or lengths drawn from ``(min, max)``), ``max_tokens``
    each, all admitted at once. ``mode``: how decode steps run (one of ``MODES``, named in a
    ``mode`` column; None: the engine's default, no column); ``kernel`` is the decode backend
    the engine resolved (``"auto"`` named as what it chose). ``copy_bandwidth`` (bytes/s, e.g.
    :func:`copy_bandwidth`): each row also gets the bytes a decode step must read
    (:func:`decode_bytes_per_step`) and the share of that bandwidth they reach. A row's
    ``prompt_len`` is the mean length of the prompts it drew (``prompt_len_min/max``: the
    range asked for)."""
    model = model or tiny_model()
    engine_mode = mode_options(mode)
    lo, hi = prompt_len if isinstance(prompt_len, tuple) else (prompt_len, prompt_len)
    rows = []
    for bs in block_sizes:
        for b in batch_sizes:
            prompts = random_prompts(b, lo, hi, model.config.vocab_size,
                                     seed=b if seed is None else seed)
            need = blocks_for_all(prompts, max_tokens, bs)
            row, _ = run_engine(model, prompts, max_tokens, repeat, block_size=bs,
                                num_blocks=num_blocks or need, kernel=kernel, max_num_seqs=b,
                                max_num_batched_tokens=max(2048, min(8192, b * hi)),
                                **engine_mode)
            if mode is not None:
                row["mode"] = mode
            if copy_bandwidth is not None:
                step_bytes = decode_bytes_per_step(model, prompts, max_tokens)
                row |= dict(decode_bytes_per_step=step_bytes,
                            copy_bandwidth_bytes_per_s=copy_bandwidth,
                            bandwidth_fraction=step_bytes / (row["decode_step_ms"] / 1e3)
                            / copy_bandwidth)
            rows.append(base_row(model, datasets.ENGINE_BATCH, block_size=bs,
                              batch=b, prompt_len=sum(map(len, prompts)) / len(prompts),
                              prompt_len_min=lo, prompt_len_max=hi, max_tokens=max_tokens,
                              **row))
    return rows


@with_threads
def cow_comparison(model=None, prompt_len: int = 512, max_tokens: int = 32, n: int = 4,
                   block_size: int = 16, seed: int = 0) -> list[dict]:
    """Parallel sampling: one request with ``n`` completions sharing its prompt's blocks
    (copy-on-write) against ``n`` independent requests, and one request with ``n = 1``."""
    model = model or tiny_model()
    prompt = random_prompts(1, prompt_len, prompt_len, model.config.vocab_size, seed)[0]
    engine = LLMEngine(model, block_size=block_size,
                       num_blocks=(n + 1) * ceil_div(prompt_len + max_tokens, block_size))
    rows = []
    for label, prompts, k, shared in (("n=1", [prompt], 1, 1), (f"n={n} shared", [prompt], n, n),
                                      (f"{n} separate requests", [prompt] * n, 1, None)):
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, n=k, seed=seed,
                                ignore_eos=True)
        seconds, _ = wall(lambda: engine.generate(prompts, params), _device(model))
        rows.append(base_row(model, datasets.ENGINE_COW, variant=label, n=shared,
                             completions=len(prompts) * k,
                          prompt_len=prompt_len, max_tokens=max_tokens, block_size=block_size,
                          **_engine_row(engine, seconds)))
    return rows


@with_threads
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
        seconds, _ = wall(lambda: engine.generate(
            prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True)), _device(model))
        s = engine.stats
        rows.append(base_row(model, datasets.ENGINE_PREFIX, enable_prefix_caching=on,
                          num_requests=num_requests, system_len=system_len,
                          block_size=block_size, prefix_cache_hit_rate=s.prefix_cache_hit_rate,
                          num_prompt_tokens=s.num_prompt_tokens,
                          num_computed_prompt_tokens=s.num_computed_prompt_tokens,
                          **_engine_row(engine, seconds)))
    return rows


@with_threads
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
        seconds, _ = wall(lambda: engine.generate(
            prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True)), _device(model))
        rows.append(base_row(model, datasets.ENGINE_POOL, pool_fraction=blocks / full,
                          blocks_needed_all=full, num_requests=num_requests,
                          block_size=block_size,
                          recomputed_tokens=engine.stats.num_computed_prompt_tokens
                          - engine.stats.num_prompt_tokens,
                          **_engine_row(engine, seconds)))
    return rows


@with_threads
def equal_memory_comparison(model, kv_bytes: int, prompts, max_tokens: int,
                            block_size: int = 16, kernel: str = "auto",
                            repeat: int = 3) -> list[dict]:
    """Same KV memory for all three methods: padded ``generate`` reserves ``max prompt +
    max_tokens`` slots per sequence, so it runs ``kv_bytes // that`` sequences per batch; the
    engine's pool of the same bytes admits as many as their actual tokens allow; and the
    control, the same engine with ``max_num_seqs`` capped at padded generate's batch, isolates
    what the bigger batch buys from what the engine's own speed does.

    Each method is warmed up on the same requests, then timed in ``repeat`` interleaved rounds;
    each row has the median tokens/s with the min and max (``tokens_per_s_min``/``_max``)."""
    from pagebench.config import KVGeometry

    geo = KVGeometry.from_config(model.config, dtype=next(model.parameters()).dtype)
    reserve = max(map(len, prompts)) + max_tokens
    contiguous_batch = max(1, kv_bytes // (reserve * geo.bytes_per_token))
    dev = _device(model)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engines = {name: LLMEngine(model, block_size=block_size, kv_cache_memory=kv_bytes,
                               kernel=kernel, max_num_seqs=seqs, max_num_batched_tokens=8192)
               for name, seqs in (("engine", len(prompts)),
                                  (datasets.EQUAL_MEMORY_CONTROL, contiguous_batch))}
    runs = {"padded_generate": lambda: padded_generate(model, prompts, max_tokens,
                                                       batch_size=contiguous_batch),
            **{name: functools.partial(e.generate, prompts, params)
               for name, e in engines.items()}}
    for run in runs.values():  # warm-up (and graph capture) on the requests timed
        run()
    times: dict[str, list[float]] = {m: [] for m in runs}
    peak: dict[str, int] = {}
    for _ in range(repeat):
        for m, run in runs.items():
            times[m].append(wall(run, dev)[0])
            if m in engines:
                peak[m] = max(x.batch_size for x in engines[m].stats.steps)
    generated = len(prompts) * max_tokens
    rows = []
    for m, t in times.items():
        engine = engines.get(m)
        extra = {} if engine is None else dict(
            block_size=block_size, kernel=engine.runner.decode_backend.name,
            max_num_seqs=engine.scheduler.max_num_seqs,
            **_engine_row(engine, statistics.median(t)))
        rows.append(base_row(model, datasets.ENGINE_EQUAL_MEMORY, method=m, kv_bytes=kv_bytes,
                             concurrent_seqs=peak.get(m, contiguous_batch),
                             num_requests=len(prompts), max_tokens=max_tokens, repeats=repeat,
                             timing="perf_counter, median of interleaved repeats",
                             **extra | dict(time_s=statistics.median(t))
                             | _spread("tokens_per_s", [generated / x for x in t])))
    return rows


# ---- device runs: decode modes, copy bandwidth, greedy equality ------------------------------

# how decode steps run -> LLMEngine options. "graphs": the default (on a GPU, CUDA graphs of
# the compiled decoder layers; on a CPU, eager steps); "graphs_uncompiled": graphs of the plain
# layers; "eager": every step from Python
MODES = {"graphs": {}, "graphs_uncompiled": dict(compile_model=False),
         "eager": dict(enforce_eager=True)}


def mode_options(mode: str | None) -> dict:
    """The ``LLMEngine`` options of a decode ``mode`` (None: the engine's defaults)."""
    if mode is None:
        return {}
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    return MODES[mode]


def copy_bandwidth(device) -> float:
    """The device's copy bandwidth, bytes read + written per second: the ceiling a decode
    step's bytes are held against (1 GiB copied on a GPU, 64 MiB on a CPU)."""
    from pagebench.measure.kernel_sweep import measure_copy_gbps

    nbytes = 2**30 if torch.device(device).type == "cuda" else 2**26
    return measure_copy_gbps(str(device), nbytes) * 1e9


def padded_reservation_bytes(model, batch: int, max_len: int) -> int:
    """KV bytes padded ``generate`` reserves for ``batch`` sequences of up to ``max_len``
    tokens: the memory :func:`equal_memory_comparison` gives both sides."""
    from pagebench.config import KVGeometry

    geo = KVGeometry.from_config(model.config, dtype=next(model.parameters()).dtype)
    return batch * max_len * geo.bytes_per_token


def agreement(outputs, reference) -> tuple[int, float]:
    """(sequences equal, fraction of the reference's tokens before each first difference)."""
    same = total = 0
    for out, ref in zip(outputs, reference, strict=True):
        k = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        same, total = same + k, total + len(ref)
    return sum(a == b for a, b in zip(outputs, reference)), same / max(1, total)


def greedy_tokens(engine: LLMEngine, prompts, max_tokens: int) -> list[list[int]]:
    """Each prompt's tokens from ``engine``, greedy, ``max_tokens`` each (no stop at EOS)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [r.outputs[0].token_ids for r in engine.generate(prompts, params)]


# the experiment name the committed H200 rows carry (engine dataset, any device)
GREEDY_EQUALITY = "gpu_greedy_equality"


@with_threads
def greedy_equality(model, prompts, max_tokens: int, block_sizes=(16,),
                    kernel: str = "auto") -> list[dict]:
    """Greedy outputs of the engine, per block size: against ``model.generate`` one prompt at a
    time (no padding), prefix caching off and on; and against the engine's eager steps, decode
    graphs of the compiled and of the plain layers. One row per check (``prompts_equal`` of
    ``num_prompts``, ``token_agreement``), of the ``engine`` dataset. "graphs vs eager" rows
    come only from an engine that captured graphs or compiled its layers (on a CPU neither:
    its default steps are the eager ones, and the row would compare them with themselves); in
    bf16 near-ties on random weights flip the argmax, hence an agreement rate rather than a
    pass/fail."""
    reference = padded_generate(model, prompts, max_tokens, batch_size=1)
    rows = []
    for bs in block_sizes:
        kw = dict(block_size=bs, kernel=kernel, max_num_seqs=len(prompts),
                  num_blocks=blocks_for_all(prompts, max_tokens, bs))

        def check(what, engine, outputs, expected, prefix=False):
            equal, tokens = agreement(outputs, expected)
            g = engine.graphs()
            rows.append(base_row(model, datasets.ENGINE, experiment=GREEDY_EQUALITY, check=what,
                                 block_size=bs, kernel=engine.runner.decode_backend.name,
                                 prefill_kernel=engine.runner.prefill_backend.name,
                                 cuda_graphs=g["cuda_graphs"], num_prompts=len(prompts),
                                 prompts_equal=equal, token_agreement=tokens,
                                 enable_prefix_caching=prefix,
                                 compiled_layers=g["compiled_layers"], max_tokens=max_tokens))

        default = LLMEngine(model, **kw)
        default_out = greedy_tokens(default, prompts, max_tokens)
        check("engine vs model.generate", default, default_out, reference)
        cached = LLMEngine(model, enable_prefix_caching=True, **kw)
        check("engine vs model.generate", cached, greedy_tokens(cached, prompts, max_tokens),
              reference, prefix=True)
        plain = LLMEngine(model, **MODES["graphs_uncompiled"], **kw)
        runs = [(plain, greedy_tokens(plain, prompts, max_tokens)), (default, default_out)]
        runs = [(e, out) for e, out in runs  # after generating: graphs are captured then
                if e.graphs()["cuda_graphs"] or e.graphs()["compiled_layers"]]
        if runs:
            eager = greedy_tokens(LLMEngine(model, **MODES["eager"], **kw), prompts, max_tokens)
        for engine, out in runs:
            check("graphs vs eager", engine, out, eager)
    return rows


@contextlib.contextmanager
def wrapped_execute(runner, wrapper):
    """Within the block, ``runner.execute`` is ``wrapper(execute)`` (to record or mark the model
    steps); after it, the runner's own ``execute`` again. Restored by deleting the instance
    attribute, not by storing the bound method back: a runner holding its own bound method is a
    reference cycle, which keeps the runner and its KV cache until a garbage collection."""
    had_own = "execute" in vars(runner)
    own = vars(runner).get("execute")
    runner.execute = wrapper(runner.execute)
    try:
        yield
    finally:
        if had_own:
            runner.execute = own
        else:
            del runner.execute


@contextlib.contextmanager
def record_logits(engine: LLMEngine, steps: int):
    """Within the block, a list that fills with the logits of ``engine``'s first ``steps`` model
    steps as it runs (its runner's ``execute`` wrapped)."""
    logits: list[torch.Tensor] = []

    def recorder(execute):
        def recording(seqs, blocks):
            out, rows = execute(seqs, blocks)
            if len(logits) < steps:
                logits.append(out.clone())
            return out, rows
        return recording

    with wrapped_execute(engine.runner, recorder):
        yield logits


@with_threads
def fp8_comparison(model, prompts, max_tokens: int = 32, kv_cache_memory="4GiB",
                   logit_steps: int = 4, **engine_kwargs) -> list[dict]:
    """The engine with a cache in the model's dtype and an fp8_e4m3 one in the same
    ``kv_cache_memory``: each pool's blocks (one byte an element: twice a bf16 pool's), the
    greedy agreement of the fp8 run with the other (:func:`agreement`'s token fraction; and of
    the first tokens alone), and the largest relative error of its logits over the first
    ``logit_steps`` steps. Both eager: this compares cache dtypes, not graph capture (tests/test_decode_graphs.py
    checks that fp8 replay equals eager steps)."""
    from pagebench.measure.kernel_cases import relative_error

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    runs = {}
    for kv_dtype in ("auto", "fp8_e4m3"):
        engine = LLMEngine(model, kv_cache_memory=kv_cache_memory, kv_cache_dtype=kv_dtype,
                           **MODES["eager"], **engine_kwargs)
        with record_logits(engine, logit_steps) as logits:
            seconds, outs = wall(functools.partial(engine.generate, prompts, params),
                                 _device(model))
        runs[kv_dtype] = dict(blocks=engine.num_blocks, seconds=seconds, logits=logits,
                              tokens=[o.outputs[0].token_ids for o in outs])
        del engine, outs  # its pool is freed before the next run allocates one
        release_memory(_device(model))
    base, fp8 = runs["auto"], runs["fp8_e4m3"]
    errors = [relative_error(b, a) for a, b in zip(base["logits"], fp8["logits"])
              if a.shape == b.shape]
    first = sum(a[:1] == b[:1] for a, b in zip(base["tokens"], fp8["tokens"])) / len(prompts)
    return [base_row(model, datasets.FP8_ENGINE, kv_cache_memory=str(kv_cache_memory),
                     blocks_bf16=base["blocks"], blocks_fp8=fp8["blocks"],
                     blocks_ratio=fp8["blocks"] / base["blocks"], num_prompts=len(prompts),
                     max_tokens=max_tokens,
                     greedy_agreement=agreement(fp8["tokens"], base["tokens"])[1],
                     first_token_agreement=first,
                     logit_rel_err_first_steps=max(errors, default=float("nan")),
                     seconds_bf16=base["seconds"], seconds_fp8=fp8["seconds"])]
