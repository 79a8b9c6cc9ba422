"""Decode steps from static buffers (``pagebench.engine.decode_graphs``): buckets, padding,
the incremental block-table store, and (on a GPU) graph replay against eager steps.

On the CPU the static path runs uncaptured on the same padded buffers the graphs use, so the
padding rows, the scratch block and the table updates are all exercised here; the tiny models
have spread-out logits (``initializer_range=0.2``), so greedy equality is a sharp test.
"""

import pytest
import torch

from pagebench.defaults import SHORT_BLOCK_SIZES
from pagebench.engine import LLMEngine, SamplingParams
from pagebench.measure.engine_bench import tiny_model
from pagebench.engine.decode_graphs import MAX_GRAPH_LEN, bucket_for, graph_batch_sizes
from pagebench.errors import ConfigError

transformers = pytest.importorskip("transformers")

VOCAB = 256
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def random_prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def outputs(engine, prompts, **params):
    params = SamplingParams(ignore_eos=True, **({"max_tokens": 10} | params))
    return [[o.token_ids for o in r.outputs] for r in engine.generate(prompts, params)]


def static_engine(model, **kwargs):
    """An engine whose decode steps take the static-buffer path, uncaptured on the CPU."""
    engine = LLMEngine(model, kernel="torch", **kwargs)
    engine.runner.setup_decode_graphs(engine.scheduler.max_num_seqs, engine.max_model_len,
                                      capture=False)
    return engine


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_batch_sizes_and_buckets():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(6) == [1, 2, 4, 6]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_batch_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    sizes = graph_batch_sizes(40)
    assert [bucket_for(n, sizes) for n in (1, 3, 8, 9, 17, 33, 40)] == [1, 4, 8, 16, 32, 40, 40]
    assert bucket_for(41, sizes) is None


@pytest.mark.parametrize("block_size", [1, 16])
def test_static_decode_equals_eager(model, block_size):
    # 5 prompts: bucket 8, three padding rows in every step; the pool grows a block per
    # sequence every block_size steps, which reaches the device as one update per row
    prompts = random_prompts([1, 9, 16, 40, 100])
    eager = LLMEngine(model, kernel="torch", block_size=block_size, num_blocks=4096 // block_size)
    static = static_engine(model, block_size=block_size, num_blocks=4096 // block_size)
    assert static.runner.kv.shape[2] == static.num_blocks + 1  # the scratch block
    assert outputs(static, prompts, max_tokens=20) == outputs(eager, prompts, max_tokens=20)
    graphs = static.runner.decode_graphs
    decode_steps = sum(s.num_batched_tokens == s.batch_size for s in static.stats.steps)
    assert graphs.num_steps == decode_steps > 0
    assert static.stats.decode_tokens_per_s > 0
    assert static.stats.cuda_graphs is False  # built, not captured


def test_static_decode_with_fp8_cache_equals_eager(model):
    # a step of padding rows alone (as the graphs' warm-up and capture run) must not calibrate
    # the scales from the scratch block: the first real step does, in place
    prompts = random_prompts([3, 20, 41])
    kw = dict(block_size=8, num_blocks=512, kv_cache_dtype="fp8_e4m3")
    eager = LLMEngine(model, kernel="torch", **kw)
    static = static_engine(model, **kw)
    scales = static.runner.kv_scales
    static.runner.decode_graphs.warm_up(4)
    assert not any(static.runner.calibrated) and bool((scales == 1).all())
    assert outputs(static, prompts) == outputs(eager, prompts)
    assert all(static.runner.calibrated) and static.runner.kv_scales is scales
    torch.testing.assert_close(scales, eager.runner.kv_scales)
    assert static.runner.decode_graphs.num_steps > 0


def test_static_decode_through_preemption_and_copy_on_write(model):
    # a tight pool preempts and re-admits (new block tables for the same sequence), n=4
    # forks share a partial last block that each copies on its first write
    prompt = random_prompts([60], seed=7)[0]
    params = dict(max_tokens=40, temperature=0.8, seed=5, n=4)
    roomy = LLMEngine(model, kernel="torch", block_size=8, num_blocks=256)
    tight = static_engine(model, block_size=8, num_blocks=20)
    assert outputs(tight, [prompt], **params) == outputs(roomy, [prompt], **params)
    assert tight.stats.num_preemptions > 0
    assert tight.runner.decode_graphs.num_steps > 0


def test_static_decode_reuses_store_rows(model):
    # max_num_seqs=2 keeps a store of 4 rows: ten requests evict the finished ones' rows
    prompts = random_prompts([5, 17, 30, 8, 12, 50, 3, 21, 9, 33], seed=3)
    eager = LLMEngine(model, kernel="torch", block_size=4, num_blocks=1024, max_num_seqs=2)
    static = static_engine(model, block_size=4, num_blocks=1024, max_num_seqs=2)
    assert outputs(static, prompts) == outputs(eager, prompts)
    graphs = static.runner.decode_graphs
    assert graphs.store_rows == 4 and len(graphs.rows) <= 4


def test_prefix_caching_through_static_decode(model):
    system = random_prompts([48], seed=8)[0]
    prompts = [system + s for s in random_prompts([5, 9, 13], seed=9)]
    eager = LLMEngine(model, kernel="torch", block_size=16, num_blocks=256)
    static = static_engine(model, block_size=16, num_blocks=256, enable_prefix_caching=True,
                           max_num_batched_tokens=64)
    assert outputs(static, prompts) == outputs(eager, prompts)
    assert static.stats.prefix_cache_hit_rate > 0


def test_long_context_decodes_eagerly(model, monkeypatch):
    import pagebench.engine.decode_graphs as dg

    monkeypatch.setattr(dg, "MAX_GRAPH_LEN", 32)
    prompts = random_prompts([20])  # outgrows the graphs' 32 tokens half-way
    eager = LLMEngine(model, kernel="torch", block_size=16, num_blocks=64)
    static = static_engine(model, block_size=16, num_blocks=64)
    assert static.runner.decode_graphs.max_len == 32
    assert outputs(static, prompts, max_tokens=16) == outputs(eager, prompts, max_tokens=16)
    decode_steps = sum(s.num_batched_tokens == s.batch_size for s in static.stats.steps)
    assert 0 < static.runner.decode_graphs.num_steps < decode_steps


def test_graphs_refuse_checked_kernel_inputs(model):
    engine = LLMEngine(model, kernel="torch", num_blocks=64, check_kernel_inputs=True)
    with pytest.raises(ConfigError, match="check_kernel_inputs"):
        engine.runner.setup_decode_graphs(4, 512, capture=False)
    assert engine.runner.decode_graphs is None


def test_eager_engine_describes_itself(model):
    engine = LLMEngine(model, kernel="torch", num_blocks=64)
    assert engine.graphs() == {"cuda_graphs": False, "graph_error": None,
                               "compiled_layers": False, "compile_s": 0.0, "compile_error": None}
    assert "eager" in engine.describe()
    assert MAX_GRAPH_LEN >= 4096


# ---- GPU -----------------------------------------------------------------------------------

@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("compiled", [False, True], ids=["graphs", "compiled+graphs"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_graph_replay_equals_eager_steps_gpu(block_size, compiled):
    model = tiny_model(device="cuda")
    prompts = random_prompts([1, 9, 33, 120, 300], seed=4)
    graphs = LLMEngine(model, kernel="triton", block_size=block_size,
                       num_blocks=8192 // block_size, max_num_seqs=8, compile_model=compiled)
    eager = LLMEngine(model, kernel="triton", block_size=block_size,
                      num_blocks=8192 // block_size, max_num_seqs=8, enforce_eager=True)
    assert graphs.graphs()["cuda_graphs"] and not eager.graphs()["cuda_graphs"]
    assert outputs(graphs, prompts, max_tokens=24) == outputs(eager, prompts, max_tokens=24)
    assert graphs.runner.decode_graphs.num_replays > 0


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_graph_replay_equals_eager_steps_gpu(kv_cache_dtype):
    model = tiny_model(device="cuda")
    prompts = random_prompts([1, 9, 33, 120], seed=6)
    kw = dict(kernel="triton", block_size=16, num_blocks=512, max_num_seqs=8,
              kv_cache_dtype=kv_cache_dtype)
    graphs = LLMEngine(model, **kw)
    eager = LLMEngine(model, enforce_eager=True, **kw)
    assert graphs.graphs()["cuda_graphs"], graphs.graphs()
    assert outputs(graphs, prompts, max_tokens=24) == outputs(eager, prompts, max_tokens=24)
    assert graphs.runner.decode_graphs.num_replays > 0
    torch.testing.assert_close(graphs.runner.kv_scales, eager.runner.kv_scales)


@pytest.mark.gpu
@GPU
def test_graph_logits_match_eager_logits_gpu():
    model = tiny_model(device="cuda")
    prompts = random_prompts([7, 50, 130], seed=5)
    engines = [LLMEngine(model, kernel="triton", block_size=16, num_blocks=256, max_num_seqs=4,
                         enforce_eager=eager) for eager in (False, True)]
    logits = []
    for engine in engines:
        captured = []
        execute = engine.runner.execute
        def recording(*args, f=execute, captured=captured):
            captured.append(f(*args))
            return captured[-1]

        engine.runner.execute = recording
        outputs(engine, prompts, max_tokens=6)
        logits.append(torch.cat([out for out, _ in captured[1:]]))  # decode steps
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compiled_layers_serve_only_the_runner(model, monkeypatch):
    # dynamo alone (backend "eager"): the paged attention must be a graph break, outputs
    # unchanged, and the model's own layers untouched for model.generate
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    prompts = random_prompts([1, 9, 40])
    compiled = LLMEngine(model, kernel="torch", block_size=16, num_blocks=256, max_num_seqs=4)
    compiled.runner.setup_decode_graphs(4, compiled.max_model_len, capture=False,
                                        compile_layers=True)
    # an engine built after the compile must not change what the compiled layers call
    eager = LLMEngine(model, kernel="torch", block_size=16, num_blocks=256)
    assert compiled.graphs()["compiled_layers"] and compiled.graphs()["compile_error"] is None
    assert outputs(compiled, prompts) == outputs(eager, prompts)
    assert all(type(layer) is transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer
               for layer in model.model.layers)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
@pytest.mark.parametrize("block_size", SHORT_BLOCK_SIZES)
def test_graphs_equal_model_generate_fp32_gpu(block_size, prefix_caching):
    model = tiny_model(device="cuda")
    prompts = random_prompts([1, 9, 33, 120, 300], seed=6)
    expected = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=16, pad_token_id=0)
            expected.append([out[0, len(p):].tolist()])
    engine = LLMEngine(model, kernel="triton", block_size=block_size,
                       num_blocks=8192 // block_size, max_num_seqs=8,
                       enable_prefix_caching=prefix_caching)
    assert engine.graphs()["cuda_graphs"]
    assert outputs(engine, prompts, max_tokens=16) == expected
    if prefix_caching:  # the blocks the first run filled serve the second
        assert outputs(engine, prompts, max_tokens=16) == expected
        assert engine.stats.prefix_cache_hit_rate > 0
