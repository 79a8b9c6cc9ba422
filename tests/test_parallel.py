"""Tensor parallelism: per-rank KV geometry, configuration errors, and the tp=2 engine under
``torchrun`` with gloo on the CPU (tests/tp_worker.py) against the single-process engine."""

import json
import os
import subprocess
import sys

import pytest
import torch

from pagebench.config import KVGeometry
from pagebench.engine.parallel import step_digest
from pagebench.errors import ConfigError

transformers = pytest.importorskip("transformers")
LLAMA_8B = KVGeometry(32, 8, 128, 32, "bfloat16")


@pytest.mark.parametrize("tp, kv_heads, q_heads, replication",
                         [(1, 8, 32, 1), (2, 4, 16, 1), (8, 1, 4, 1), (16, 1, 2, 2),
                          (32, 1, 1, 4)])
def test_per_rank_geometry_splits_heads_and_replicates_past_the_kv_heads(tp, kv_heads, q_heads,
                                                                        replication):
    rank = LLAMA_8B.per_rank(tp)
    assert (rank.num_kv_heads, rank.num_q_heads) == (kv_heads, q_heads)
    assert rank.bytes_per_token * tp == LLAMA_8B.bytes_per_token * replication
    assert LLAMA_8B.kv_replication(tp) == replication


@pytest.mark.parametrize("tp, match", [(3, "query heads"), (0, "positive"),
                                       (64, "query heads")])
def test_per_rank_geometry_rejects_a_split_that_does_not_divide_the_heads(tp, match):
    with pytest.raises(ConfigError, match=f"tensor_parallel_size.*{match}"):
        LLAMA_8B.per_rank(tp)
    with pytest.raises(ConfigError, match="KV heads"):
        KVGeometry(2, 6, 64, 12).per_rank(4)  # 4 divides 12 query heads, not 6 KV heads


def tiny(kv_heads=2, q_heads=4):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=q_heads, num_key_value_heads=kv_heads)).eval()


def test_engine_rejects_tensor_parallelism_outside_torchrun_before_sharding(monkeypatch):
    from pagebench.engine import LLMEngine

    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    model = tiny()
    before = model.model.layers[0].self_attn.q_proj.weight.shape
    with pytest.raises(ConfigError, match="torchrun --nproc-per-node 2"):
        LLMEngine(model, num_blocks=8, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="does not divide the 4 query heads"):
        LLMEngine(model, num_blocks=8, tensor_parallel_size=3)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == before  # not sharded
    assert not hasattr(model, "pagebench_tensor_parallel")


def test_step_digest_changes_with_any_table_entry():
    class Seq:
        def __init__(self, table):
            self.seq_id, self.num_computed, self.block_table = 0, 4, table

    base = step_digest([Seq([1, 2])], [1], [])
    assert base == step_digest([Seq([1, 2])], [1], [])
    assert base != step_digest([Seq([1, 3])], [1], [])
    assert base != step_digest([Seq([1, 2])], [2], [])
    assert base != step_digest([Seq([1, 2])], [1], [(2, 5)])


@pytest.fixture(scope="module")
def torchrun_results(tmp_path_factory):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("tp")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    # --standalone: a rendezvous on localhost at a free port
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(root, "tests", "tp_worker.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("case", ["kv2", "kv1"])
def test_tp2_engine_equals_the_single_process_engine(torchrun_results, case):
    for rank in torchrun_results:
        single, parallel = rank[case]["single"], rank[case]["parallel"]
        assert parallel["greedy"] == single["greedy"]
        assert parallel["sampled"] == single["sampled"]  # seeded n=2: forks, copy-on-write
        assert parallel["preemptions"] == single["preemptions"] >= 1
        assert parallel["prefix_hit_rate"] == single["prefix_hit_rate"] > 0
        assert parallel["num_blocks"] == single["num_blocks"]


def test_tp2_ranks_return_the_same_outputs_even_unseeded(torchrun_results):
    a, b = torchrun_results
    for case in ("kv2", "kv1"):
        assert a[case]["parallel"] == b[case]["parallel"]


def test_tp2_ranks_hold_half_the_kv_heads_or_a_replica(torchrun_results):
    for rank in torchrun_results:
        assert rank["kv2"]["parallel"]["kv_heads_per_rank"] == 1
        assert rank["kv2"]["parallel"]["cache_heads"] == 1
        assert rank["kv2"]["single"]["cache_heads"] == 2
        assert rank["kv2"]["replication"] == 1
        assert rank["kv1"]["parallel"]["cache_heads"] == 1
        assert rank["kv1"]["replication"] == 2


def test_tp2_errors_name_the_world_and_catch_diverging_tables(torchrun_results):
    for rank in torchrun_results:
        assert "world has 2 process" in rank["too_many_ranks"]
        assert "ranks scheduled different steps" in rank["diverged"]
