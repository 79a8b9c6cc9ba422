"""Tensor parallelism: per-rank KV geometry, configuration errors, and the tp=2 engine under
``torchrun`` with gloo on the CPU (tests/tp_worker.py) against the single-process engine."""

import json
import os
import subprocess
import sys

import pytest
import torch

from pagebench.config import KVGeometry
from pagebench.engine.block_manager import KVBlocks
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
        seq_id = 0

    def kv(table=(1, 2), num_computed=4, num_new=1):
        return KVBlocks(table, num_computed, tuple(range(num_new)))

    seqs = [Seq()]
    base = step_digest(seqs, [kv()], [])
    assert base == step_digest(seqs, [kv()], [])
    assert base != step_digest(seqs, [kv(table=(1, 3))], [])
    assert base != step_digest(seqs, [kv(num_new=2)], [])
    assert base != step_digest(seqs, [kv(num_computed=5)], [])
    assert base != step_digest(seqs, [kv()], [(2, 5)])


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


@pytest.mark.slow  # torchrun: two processes
@pytest.mark.parametrize("case", ["kv2", "kv1"])
def test_tp2_engine_equals_the_single_process_engine(torchrun_results, case):
    for rank in torchrun_results:
        single, parallel = rank[case]["single"], rank[case]["parallel"]
        assert parallel["greedy"] == single["greedy"]
        assert parallel["sampled"] == single["sampled"]  # seeded n=2: forks, copy-on-write
        assert parallel["preemptions"] == single["preemptions"] >= 1
        assert parallel["prefix_hit_rate"] == single["prefix_hit_rate"] > 0
        assert parallel["num_blocks"] == single["num_blocks"]


@pytest.mark.slow  # torchrun: two processes
def test_tp2_ranks_return_the_same_outputs_even_unseeded(torchrun_results):
    a, b = torchrun_results
    for case in ("kv2", "kv1"):
        assert a[case]["parallel"] == b[case]["parallel"]


@pytest.mark.slow  # torchrun: two processes
def test_tp2_ranks_hold_half_the_kv_heads_or_a_replica(torchrun_results):
    for rank in torchrun_results:
        assert rank["kv2"]["parallel"]["kv_heads_per_rank"] == 1
        assert rank["kv2"]["parallel"]["cache_heads"] == 1
        assert rank["kv2"]["single"]["cache_heads"] == 2
        assert rank["kv2"]["replication"] == 1
        assert rank["kv1"]["parallel"]["cache_heads"] == 1
        assert rank["kv1"]["replication"] == 2


@pytest.mark.slow  # torchrun: two processes
def test_tp2_errors_name_the_world_and_catch_diverging_tables(torchrun_results):
    for rank in torchrun_results:
        assert "world has 2 process" in rank["too_many_ranks"]
        assert "ranks scheduled different steps" in rank["diverged"]


def test_take_share_partitions_the_work_units():
    from pagebench.measure.distributed import take_share

    for world in (1, 2, 3):
        owners = [[r for r in range(world) if take_share(i, (r, world))] for i in range(10)]
        assert all(len(o) == 1 for o in owners)
        assert {o[0] for o in owners} == set(range(world))


@pytest.mark.slow  # torchrun: two processes
def test_bench_under_torchrun_splits_points_and_merges_one_csv(tmp_path):
    import pandas as pd

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "pagebench", "bench", "--device", "cpu", "--shape", "tiny=4/2/16",
           "--batches", "1,2", "--contexts", "32,64", "--block-sizes", "16", "--repeat", "1",
           "--backends", "torch,sdpa", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    df = pd.read_csv(out)
    points = df.groupby(["batch", "context"])["rank"].unique()
    assert len(points) == 4 and all(len(r) == 1 for r in points)  # each point on one rank
    assert set(df["rank"]) == {0, 1} and set(df["gpu"]) == {"cpu"}
    assert len(df) == 4 * 2 and not df.duplicated(["batch", "context", "backend"]).any()


def test_check_shardable_names_what_does_not_split():
    from pagebench.engine.parallel import check_shardable

    check_shardable(tiny(), 2)
    with pytest.raises(ConfigError, match="intermediate_size 96"):
        check_shardable(tiny(), 5)
    qwen_moe_like = tiny()
    del qwen_moe_like.model.layers[0].mlp.gate_proj
    with pytest.raises(ConfigError, match="layer 0 has no mlp.gate_proj"):
        check_shardable(qwen_moe_like, 2)


def test_shards_sum_to_the_whole_layer():
    """Rank 0's and rank 1's halves of the MLP add up to the unsharded MLP (the all-reduce's
    job), and each rank keeps its own heads' rows of q/k/v."""
    from pagebench.engine.parallel import TensorParallel, shard_model

    full = tiny(kv_heads=2, q_heads=4)
    geometry = KVGeometry.from_config(full.config, dtype=torch.float32)
    x = torch.randn(3, 64)
    with torch.no_grad():
        want = full.model.layers[0].mlp(x)
        parts = []
        for rank in (0, 1):
            model = tiny(kv_heads=2, q_heads=4)
            shard_model(model, TensorParallel(2, rank, geometry.per_rank(2), torch.device("cpu")),
                        geometry)
            for handle in model.pagebench_reduce_hooks:  # no process group here: sum by hand
                handle.remove()
            parts.append(model.model.layers[0].mlp(x))
            attn, whole = model.model.layers[0].self_attn, full.model.layers[0].self_attn
            assert torch.equal(attn.q_proj.weight, whole.q_proj.weight[rank * 32:(rank + 1) * 32])
            assert torch.equal(attn.k_proj.weight, whole.k_proj.weight[rank * 16:(rank + 1) * 16])
            columns = whole.o_proj.weight[:, rank * 32:(rank + 1) * 32]
            assert torch.equal(attn.o_proj.weight, columns)
    torch.testing.assert_close(parts[0] + parts[1], want)


# ---- pagebench tp-bench: the measurements of scripts/h200x2_tp.sh -------------------------

def torchrun_env():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root, dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                      PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))


def rows_of(dataset, path):
    """A written file checked against its dataset's schema."""
    import pandas as pd

    from pagebench.results import DATASETS

    return DATASETS[dataset].validate(pd.read_csv(path), str(path))


@pytest.fixture(scope="module")
def tp_bench_files(tmp_path_factory):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("tp_bench")
    root, env = torchrun_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(root, "tests", "tp_bench_worker.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.slow  # torchrun: two processes
def test_tp_bench_equality_and_capacity_under_torchrun(tp_bench_files):
    equality = rows_of("tp_equality", tp_bench_files / "equality.csv")
    assert list(equality["prefix_caching"]) == [False, True]
    assert (equality["prompts_equal"] == equality["num_prompts"]).all()
    assert equality["ranks_agree"].all() and (equality["tp"] == 2).all()
    capacity = rows_of("tp_capacity", tp_bench_files / "capacity.csv").set_index("tp")
    assert capacity.loc[2, "num_blocks_per_gpu"] == 2 * capacity.loc[1, "num_blocks_per_gpu"]
    assert list(capacity["kv_heads_per_gpu"]) == [2, 1]  # the tiny model's 2 KV heads, split
    assert (capacity["kv_memory_budget_bytes"] == 2**20).all()


@pytest.mark.slow  # torchrun: two processes
def test_tp_bench_throughput_and_allreduce_under_torchrun(tp_bench_files):
    tput = rows_of("tp_throughput", tp_bench_files / "throughput.csv")
    assert sorted(tput["mode"].unique()) == ["tp=1, default (no graphs)", "tp=1, eager",
                                             "tp=2, default (no graphs)", "tp=2, eager"]
    assert list(tput["batch"]) == [1, 2] * 4 and (tput["tokens_per_s"] > 0).all()
    assert not tput["cuda_graphs"].any()
    assert list(tput["baseline_alone"].fillna(False)) == [True] * 4 + [False] * 4
    reduce = rows_of("tp_allreduce", tp_bench_files / "allreduce.csv")
    assert list(reduce["batch"]) == [1, 2] and (reduce["tp"] == 2).all()
    assert (reduce["allreduce_calls_per_step"] == 4).all()  # 2 layers x (o_proj, down_proj)
    assert ((reduce["allreduce_share"] > 0) & (reduce["allreduce_share"] < 1)).all()
    assert (reduce["isolated_allreduce_us"] > 0).all()


@pytest.mark.slow  # torchrun: two processes
def test_tp_bench_allreduce_bandwidth_rows_under_torchrun(tp_bench_files):
    bw = rows_of("tp_allreduce_bw", tp_bench_files / "allreduce-bw.csv")
    assert list(bw["batch"]) == [1, 2, 8]  # ascending, whatever the order asked
    assert list(bw["bytes"]) == [b * 128 * 2 for b in (1, 2, 8)]  # hidden 128, bf16
    assert bw["bytes"].is_monotonic_increasing
    assert (bw["world"] == 2).all() and (bw["backend"] == "gloo").all()
    assert (bw["time_us"] > 0).all()
    # nccl-tests' bus bandwidth at n=2: the algorithm bandwidth itself
    assert bw["busbw_gbps"].tolist() == pytest.approx(bw["algbw_gbps"].tolist())
    assert bw["algbw_gbps"].tolist() == pytest.approx(
        (bw["bytes"] / bw["time_us"] / 1e3).tolist())


def test_bus_bandwidth_is_nccl_tests_definition():
    from pagebench.measure.tp_bench import bus_bandwidth

    assert bus_bandwidth(1000, 1e-6, 2) == pytest.approx(1e9)
    assert bus_bandwidth(1000, 1e-6, 4) == pytest.approx(1.5e9)
    assert bus_bandwidth(1000, 1e-6, 8) == pytest.approx(1.75e9)


def test_mode_labels_name_the_way_the_gpus_were_used():
    from pagebench.measure.tp_bench import mode_label

    assert mode_label(2, False, True) == "tp=2, CUDA graphs"
    assert mode_label(1, True, False) == "tp=1, eager"
    assert mode_label(1, False, True, replicas=2) == "2 replicas, CUDA graphs"
    assert mode_label(2, False, False) == "tp=2, default (no graphs)"
    assert mode_label(2, False, True, compiled=True) == "tp=2, CUDA graphs, compiled"
    assert mode_label(1, False, False, compiled=True) == "tp=1, default (no graphs)"  # a CPU


# ---- data-parallel replicas ----------------------------------------------------------------

def test_round_robin_split_gives_every_request_to_one_replica():
    from pagebench.engine.replicas import split_round_robin

    assert split_round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert split_round_robin(1, 3) == [[0], [], []]
    shares = split_round_robin(17, 4)
    assert sorted(i for share in shares for i in share) == list(range(17))
    with pytest.raises(ConfigError, match="replicas"):
        split_round_robin(4, 0)


def test_merge_generations_refuses_a_request_run_twice_or_never():
    from pagebench.engine.replicas import merge_generations
    from pagebench.errors import PagebenchError

    def part(indices, seconds):
        return [dict(indices=indices, token_ids=[[i] for i in indices], seconds=seconds,
                     num_steps=1, decode_tokens_per_s=1.0, cuda_graphs=False)]

    merged = merge_generations([part([0, 2], 0.5), part([1], 0.75)], 0, 3)
    assert merged["token_ids"] == [[0], [1], [2]] and merged["seconds"] == 0.75
    assert merged["num_tokens"] == 3
    with pytest.raises(PagebenchError, match="request 0 ran on two replicas"):
        merge_generations([part([0], 1), part([0, 1], 1)], 0, 2)
    with pytest.raises(PagebenchError, match=r"requests \[1\] ran on no replica"):
        merge_generations([part([0], 1), part([], 1)], 0, 2)


def test_replicas_refuse_more_gpus_than_visible_and_a_torchrun_world(one_process, monkeypatch):
    from pagebench.measure.tp_bench import replica_throughput
    from pagebench.engine.replicas import check_replicas

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="2 replicas need as many GPUs; 1 visible"):
        check_replicas(2, "cuda")
    assert check_replicas(3, "cpu") == 3
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="run as one process"):
        replica_throughput(None, "1MiB", 2)


@pytest.mark.slow  # spawns two processes
def test_two_replicas_split_the_requests_and_equal_one_engine(one_process):
    from functools import partial

    from pagebench.engine import LLMEngine
    from pagebench.engine import replicas as dp
    from pagebench.measure.engine_bench import greedy_tokens, random_prompts, tiny_model
    from pagebench.engine.sampling import SamplingParams

    prompts = random_prompts(7, 2, 20, 1024, seed=2)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    shares = dp.split_round_robin(len(prompts), 2)
    setup = dp.ReplicaSetup(partial(tiny_model), "cpu", dict(num_blocks=64), threads=1)
    out = dp.run_replicas(setup, dp.timed_generate,
                          [[(share, [prompts[j] for j in share], params)] for share in shares])
    assert [part[0]["indices"] for part in out] == [[0, 2, 4, 6], [1, 3, 5]]
    run = dp.merge_generations(out, 0, len(prompts))
    assert run["token_ids"] == greedy_tokens(LLMEngine(tiny_model(), num_blocks=64), prompts, 5)
    assert run["num_tokens"] == 7 * 5 and run["seconds"] > 0


@pytest.mark.slow  # spawns two processes
def test_tp_bench_replicas_writes_aggregate_rows(one_process, tmp_path):
    code, out, err = run_cli("tp-bench", "replicas", "--device", "cpu", "--kv-memory", "1MiB",
                             "--batch-sizes", "1,3", "--prompt-len", "4", "--max-tokens", "2",
                             "--out", str(tmp_path / "replicas.csv"))
    assert code == 0, err
    rows = rows_of("tp_throughput", tmp_path / "replicas.csv")
    assert list(rows["batch"]) == [1, 3] and (rows["replicas"] == 2).all()
    assert (rows["mode"] == "2 replicas, default (no graphs)").all()
    assert (rows["tokens_per_s"] == rows["batch"] * 2 / rows["time_s"]).all()
    assert "2 replicas" in out


@pytest.mark.slow  # spawns a process
def test_a_failing_replica_is_an_error_naming_it(one_process):
    from functools import partial

    from pagebench.engine import replicas as dp
    from pagebench.measure.engine_bench import tiny_model
    from pagebench.errors import PagebenchError

    setup = dp.ReplicaSetup(partial(tiny_model), "cpu", dict(num_blocks=-1), threads=1)
    with pytest.raises(PagebenchError, match="^replica 0 failed: ConfigError: num_blocks: must "
                       "be a positive integer, got -1$"):
        dp.run_replicas(setup, dp.timed_generate, [[]])


def run_cli(*argv):
    import contextlib
    import io

    from pagebench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def one_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


def test_tp_bench_outside_torchrun_runs_tp1_and_refuses_what_needs_two_ranks(one_process,
                                                                              tmp_path):
    code, _, err = run_cli("tp-bench", "capacity", "--device", "cpu", "--kv-memory", "1MiB",
                           "--out", str(tmp_path / "capacity.csv"))
    assert code == 0, err
    capacity = rows_of("tp_capacity", tmp_path / "capacity.csv")
    assert list(capacity["tp"]) == [1] and list(capacity["num_blocks_per_gpu"]) == [128]
    for experiment in ("equality", "allreduce"):
        code, _, err = run_cli("tp-bench", experiment, "--device", "cpu")
        assert code == 2 and "torchrun --nproc-per-node 2" in err


def test_tp_bench_refuses_options_its_experiment_ignores(one_process):
    code, _, err = run_cli("tp-bench", "equality", "--context", "8")
    assert code == 2 and "--context: not used by tp-bench equality" in err
    code, _, err = run_cli("tp-bench", "sweep-wall", "--bench-args", "--device cpu --out x.csv")
    assert code == 2 and "--bench-args: leave out --out" in err
    code, _, err = run_cli("tp-bench", "capacity", "--device", "cpu", "--kv-memory", "1000TB")
    assert code == 2 and "--kv-memory: the KV cache of one device needs about 1.0 PB" in err
    code, _, err = run_cli("tp-bench", "throughput", "--kv-memory", "lots")
    assert code == 2 and "--kv-memory: bytes: cannot parse 'lots'" in err


def test_tp_bench_attention_times_one_device_share_of_the_heads(one_process, tmp_path):
    code, _, err = run_cli("tp-bench", "attention", "--device", "cpu", "--batch-sizes", "2",
                           "--context", "40", "--repeat", "2", "--out", str(tmp_path / "a.csv"))
    assert code == 0, err
    rows = rows_of("tp_attention", tmp_path / "a.csv").set_index("tp")
    assert list(rows["num_q_heads"]) == [4, 2] and list(rows["num_kv_heads"]) == [2, 1]
    assert (rows["per_step_us"] == rows["time_us"] * 2).all()  # the tiny model's 2 layers
    assert set(rows["context"]) == {40} and set(rows["batch"]) == {2}


@pytest.mark.slow  # torchrun: a start-up probe and one two-process sweep
def test_sweep_wall_times_the_kernel_sweep_under_torchrun(one_process, tmp_path, monkeypatch):
    from pagebench.measure.distributed import sweep_wall

    _, env = torchrun_env()
    for name in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"):
        monkeypatch.setenv(name, env[name])
    walls, rows = sweep_wall([2], ["--device", "cpu", "--shape", "tiny=4/2/16", "--batches",
                                   "1,2", "--contexts", "32", "--block-sizes", "16",
                                   "--repeat", "1", "--backends", "torch,sdpa"])
    import pandas as pd

    from pagebench.results import DATASETS

    wall = DATASETS["sweep_wall"].validate(pd.DataFrame(walls), "sweep_wall")
    assert list(wall["gpus"]) == [2] and list(wall["points"]) == [2] and list(wall["rows"]) == [4]
    assert 0 < wall["startup_s"].iloc[0] and 0 < wall["wall_s"].iloc[0]
    assert {r["rank"] for r in rows} == {"0", "1"} and {r["gpus"] for r in rows} == {2}


@pytest.mark.slow  # torchrun: one process that fails at once
def test_a_failed_torchrun_job_is_an_error_with_its_output(one_process, monkeypatch):
    from pagebench.measure.distributed import time_torchrun
    from pagebench.errors import PagebenchError

    _, env = torchrun_env()
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    with pytest.raises(PagebenchError, match="exit status 1.*--backends: not available here"):
        time_torchrun(1, ["-m", "pagebench", "bench", "--backends", "nope"])


# ---- the collectives' path on one device: a process group of one -------------------------

@pytest.fixture
def world_of_one(tmp_path, monkeypatch):
    """A default process group of one rank (gloo on the CPU, NCCL on CUDA), torn down after."""
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")

    def start(backend):
        options = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=f"file://{tmp_path}/store", rank=0,
                                world_size=1, **options)
    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def counted_all_reduces(engine):
    """Count the all-reduces ``engine``'s hooks issue from Python (a replayed graph issues its
    own without calling back)."""
    calls = []
    original = engine.tp.all_reduce
    engine.tp.all_reduce = lambda x: (calls.append(x.shape), original(x))[1]
    from pagebench.engine.parallel import _add_reduce_hooks
    _add_reduce_hooks(engine.model, engine.tp)
    return calls


def test_always_all_reduce_needs_a_group_and_leaves_the_outputs_alike(world_of_one, monkeypatch):
    from pagebench.engine import LLMEngine
    from pagebench.measure.engine_bench import greedy_tokens, random_prompts, tiny_model

    model = tiny_model()
    with pytest.raises(ConfigError, match="no process group"):
        LLMEngine(model, num_blocks=64, always_all_reduce=True)
    assert getattr(model, "pagebench_reduce_hooks", []) == []
    world_of_one("gloo")
    prompts = random_prompts(3, 2, 9, 64, seed=1)
    want = greedy_tokens(LLMEngine(model, num_blocks=64), prompts, 5)
    reducing = LLMEngine(model, num_blocks=64, always_all_reduce=True)
    calls = counted_all_reduces(reducing)
    assert greedy_tokens(reducing, prompts, 5) == want
    layers = model.config.num_hidden_layers
    assert len(calls) == 2 * layers * len(reducing.stats.steps)  # o_proj, down_proj per layer
    plain = LLMEngine(model, num_blocks=64)  # a plain engine removes the hooks again
    assert model.pagebench_reduce_hooks == [] and plain.tp.group is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True], ids=["graphs", "compiled+graphs"])
def test_graphs_capture_nccl_all_reduces_and_equal_eager_gpu(world_of_one, compiled):
    """tp=1 under an NCCL world of one with the all-reduces on: the decode graphs hold them
    (no all-reduce is called from Python during a replayed step) and the tokens equal eager."""
    from pagebench.engine import LLMEngine
    from pagebench.measure.engine_bench import greedy_tokens, random_prompts, tiny_model

    world_of_one("nccl")
    prompts = random_prompts(5, 1, 120, 64, seed=4)
    kw = dict(kernel="triton", block_size=16, num_blocks=512, max_num_seqs=8,
              always_all_reduce=True)
    eager = LLMEngine(tiny_model(device="cuda"), enforce_eager=True, **kw)
    want = greedy_tokens(eager, prompts, 24)
    graphs = LLMEngine(tiny_model(device="cuda"), compile_model=compiled, **kw)
    assert graphs.graphs()["cuda_graphs"], graphs.graphs()
    calls = counted_all_reduces(graphs)
    assert greedy_tokens(graphs, prompts, 24) == want
    replays = graphs.runner.decode_graphs.num_replays
    eager_steps = len(graphs.stats.steps) - replays
    assert replays > 0
    assert len(calls) == 2 * graphs.model.config.num_hidden_layers * eager_steps


# ---- serve-bench over replicas ---------------------------------------------------------------

def test_merge_runs_keeps_request_order_and_the_longest_duration():
    from pagebench.errors import PagebenchError
    from pagebench.measure.replica_serving import merge_runs

    def part(indices, duration):
        return [dict(indices=indices, timings=[f"t{i}" for i in indices], duration_s=duration,
                     num_steps=len(indices))]

    timings, duration, steps = merge_runs([part([0, 2], 1.5), part([1], 2.0)], 0, 3)
    assert timings == ["t0", "t1", "t2"] and duration == 2.0 and steps == 3
    with pytest.raises(PagebenchError, match="request 1 ran on two replicas"):
        merge_runs([part([0, 1], 1), part([1], 1)], 0, 2)
    with pytest.raises(PagebenchError, match=r"requests \[1\] ran on no replica"):
        merge_runs([part([0], 1), part([], 1)], 0, 2)


def test_serve_bench_replicas_refuses_what_one_engine_runs(one_process):
    common = ("serve-bench", "--replicas", "2", "--device", "cpu", "--num-requests", "4")
    code, _, err = run_cli(*common, "--block-sizes", "8,16")
    assert code == 2 and "one configuration" in err and "not 2" in err
    code, _, err = run_cli(*common, "--find-max-rate", "--rates", "1", "--slo-ttft", "100")
    assert code == 2 and "max-rate search runs on one engine" in err


@pytest.mark.slow  # spawns two processes
def test_serve_bench_replicas_merges_every_request_into_one_run(one_process, tmp_path):
    code, _, err = run_cli("serve-bench", "--replicas", "2", "--device", "cpu",
                           "--num-requests", "5", "--max-model-len", "64",
                           "--max-output-len", "3", "--rates", "inf,40", "--slo-ttft", "60000",
                           "--out", str(tmp_path / "serve.csv"))
    assert code == 0, err
    rows = rows_of("serve_bench", tmp_path / "serve.csv")
    assert list(rows["request_rate"]) == [float("inf"), 40.0]
    assert (rows["replicas"] == 2).all() and (rows["num_requests"] == 5).all()
    assert (rows["num_good_requests"] == 5).all()  # a minute's TTFT SLO: every request
    assert (rows["ttft_p99_ms"] >= rows["ttft_p50_ms"]).all()
    assert (rows["output_throughput"] * rows["duration_s"]).round().tolist() == \
        rows["num_output_tokens"].astype(float).tolist()


def test_runbook_files_are_classified_by_their_prefix():
    from pagebench.results import classify

    assert classify("tp_allreduce_bw_llama-3-8b.csv") == "tp_allreduce_bw"
    assert classify("tp_allreduce.csv") == "tp_allreduce"
    assert classify("tp_throughput_replicas_qwen2.5-0.5b.csv") == "tp_throughput"
    assert classify("tp_equality_qwen2.5-0.5b.csv") == "tp_equality"
    assert classify("tp_serve_replicas2.csv") is None  # serve_bench rows, not read yet
