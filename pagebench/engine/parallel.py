"""Tensor parallelism for the reference engine: SPMD over ``torch.distributed``.

Run one process per rank (``torchrun --nproc-per-node N script.py``); every rank builds the
same engine with ``tensor_parallel_size=N`` and calls ``generate`` with the same prompts.

- Weights: the usual Megatron split of a Llama / Qwen2 / Mistral decoder layer. ``q/k/v_proj``
  and ``gate/up_proj`` keep the output rows of the rank's heads (or MLP columns), ``o_proj`` and
  ``down_proj`` the matching input columns, followed by one all-reduce each. Embeddings, norms
  and the LM head stay whole on every rank.
- KV cache: each rank holds ``num_kv_heads / N`` heads of every block (one replicated head
  when N exceeds the KV heads; see ``KVGeometry.per_rank``).
- Decisions: the scheduler and block manager run on every rank and decide the same thing,
  because they are deterministic functions of the same inputs (prompts, sampled tokens;
  prefix hashes are hashes of int tuples, which Python does not randomise). The one input that
  could differ, the sampled token, is broadcast from rank 0 every step. ``check_tables = True``
  all-gathers a digest of every step's batch and block tables and raises if ranks disagree.

CUDA graphs: on CUDA a tp=N engine captures its decode steps as a tp=1 engine does, each rank
the same buckets in the same order, with the all-reduces inside the graphs (NCCL collectives
are capturable once the group's communicator exists, which the engine's first collective
makes; the machines measured here run with ``NCCL_NVLS_ENABLE=0``). The all-reduce itself is
left out of ``torch.compile`` (a graph break), so compiled layers call the same collective.
``always_all_reduce`` (tp=1 only) runs the all-reduces over a group of one, so that one GPU
exercises the captured-collective path.

Backends: NCCL when the model is on CUDA, gloo on the CPU. An already initialised default
process group is used as it is; otherwise one is initialised from torchrun's environment.
A world larger than N is split into consecutive groups of N ranks (one engine per group).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pagebench.config import KVGeometry
from pagebench.errors import ConfigError, PagebenchError, check_positive_int

# (attention, MLP) projections split by output rows, then by input columns + all-reduce
ROW_SPLIT = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
             ("mlp", "gate_proj"), ("mlp", "up_proj"))
REDUCED = (("self_attn", "o_proj"), ("mlp", "down_proj"))


def world_from_environment() -> tuple[int, int]:
    """(rank, world size) of the default process group, or of torchrun's environment."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


@dataclass
class TensorParallel:
    """One rank's place in a tensor-parallel group (``size == 1``: no group, no collectives).

    ``geometry`` is the rank's share of the KV cache. ``collective_times`` (a list, or None to
    not record) collects the seconds of every all-reduce, for measurements.
    """
    size: int
    rank: int
    geometry: KVGeometry
    device: torch.device
    group: object = None
    src: int = 0  # global rank of the group's rank 0
    kv_replication: int = 1  # ranks holding a copy of each KV head
    check_tables: bool = False
    collective_times: list | None = field(default=None, repr=False)

    def all_reduce(self, x: torch.Tensor) -> None:
        if self.collective_times is None:
            dist.all_reduce(x, group=self.group)
            return
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(x, group=self.group)
            end.record()
            self.collective_times.append((start, end))
        else:
            t0 = time.perf_counter()
            dist.all_reduce(x, group=self.group)
            self.collective_times.append(time.perf_counter() - t0)

    def collective_seconds(self) -> float:
        """Seconds spent in all-reduces since the list was last emptied (empties it)."""
        times, self.collective_times = self.collective_times or [], []
        if times and not isinstance(times[0], float):
            torch.cuda.synchronize(self.device)
            return sum(s.elapsed_time(e) for s, e in times) / 1e3
        return float(sum(times))

    def broadcast_tokens(self, tokens: list[int]) -> list[int]:
        """Rank 0's sampled tokens on every rank (seedless sampling differs between ranks)."""
        if self.size == 1:
            return tokens
        t = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=self.src, group=self.group)
        return t.tolist()

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's ``value`` (e.g. blocks that fit in each GPU's memory)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def check_step(self, seqs, blocks, copies) -> None:
        """With ``check_tables``: raise unless every rank scheduled the same step (``blocks``:
        each sequence's ``KVBlocks``)."""
        if self.size == 1 or not self.check_tables:
            return
        mine = step_digest(seqs, blocks, copies)
        t = torch.tensor([mine], dtype=torch.int64, device=self.device)
        every = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(every, t, group=self.group)
        digests = [int(x.item()) for x in every]
        if len(set(digests)) > 1:
            raise PagebenchError(f"tensor parallel: ranks scheduled different steps "
                                 f"(table digests {digests}); rank {self.rank} ran "
                                 f"{[s.seq_id for s in seqs]}")


def step_digest(seqs, blocks, copies) -> int:
    """A 63-bit digest of a step: sequences, tokens to compute, block tables, block copies."""
    h = hashlib.blake2b(digest_size=8)
    for seq, kv in zip(seqs, blocks):
        h.update(repr((seq.seq_id, kv.num_computed, kv.num_new, kv.block_ids)).encode())
    h.update(repr(sorted(copies)).encode())
    return int.from_bytes(h.digest(), "little") >> 1


def setup_tensor_parallel(model, geometry: KVGeometry, size: int,
                          always_all_reduce: bool = False) -> TensorParallel:
    """Validate ``size`` against the world, the model's heads and layers; join the group; shard
    ``model`` in place (see :func:`shard_model`). ``always_all_reduce``: at ``size`` 1 too,
    join a group (of one rank) and all-reduce after ``o_proj`` and ``down_proj`` (an identity
    that runs the collectives' code path, e.g. inside CUDA graphs, on one device).

    Every check runs before any collective or allocation, so a bad configuration fails alike
    on every rank with a ConfigError and leaves the model as it was.
    """
    size = check_positive_int("tensor_parallel_size", size)
    device = next(model.parameters()).device
    rank_geometry = geometry.per_rank(size)
    done = getattr(model, "pagebench_tensor_parallel", None)
    if done is not None and done[1] != size:
        raise ConfigError(f"model: already sharded as rank {done[0]} of {done[1]}; load it again")
    if size == 1 and not always_all_reduce:
        _remove_reduce_hooks(model)  # left by an earlier always_all_reduce engine
        return TensorParallel(1, 0, rank_geometry, device)
    rank, world = world_from_environment()
    if size > world:
        raise ConfigError(f"tensor_parallel_size: {size} ranks asked for, the world has {world} "
                          f"process(es); run under `torchrun --nproc-per-node {size}`")
    if world % size:
        raise ConfigError(f"tensor_parallel_size: {size} does not divide the world of "
                          f"{world} processes")
    check_shardable(model, size)
    if world == 1 and not dist.is_initialized():
        raise ConfigError("always_all_reduce: no process group to reduce over; call "
                          "torch.distributed.init_process_group first or run under torchrun")
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        # a group left to the interpreter's exit can abort the process (gloo, NCCL warnings)
        atexit.register(_destroy_group)
    elif device.type == "cuda" and dist.get_backend() == "gloo":
        raise ConfigError("tensor_parallel_size: the process group uses gloo, the model is on "
                          "CUDA; initialise it with backend='nccl'")
    group = None  # the default group
    if world > size:  # every rank creates every group, in the same order
        groups = [dist.new_group(list(range(g, g + size))) for g in range(0, world, size)]
        group = groups[rank // size]
    tp = TensorParallel(size, rank % size, rank_geometry, device, group, rank - rank % size,
                        geometry.kv_replication(size))
    if size == 1:  # always_all_reduce: nothing to split, the collectives alone
        _add_reduce_hooks(model, tp)
    else:
        shard_model(model, tp, geometry)
    return tp


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ConfigError(f"model: {type(model).__name__} has no decoder.layers to shard")
    return layers


def check_shardable(model, size: int) -> None:
    """ConfigError unless ``model`` can be split ``size`` ways (heads are checked by
    ``KVGeometry.per_rank``): Llama-style layers and an MLP width divisible by ``size``."""
    inter = getattr(model.config, "intermediate_size", None)
    if not inter or inter % size:
        raise ConfigError(f"tensor_parallel_size: {size} does not divide the MLP's "
                          f"intermediate_size {inter}")
    for i, layer in enumerate(decoder_layers(model)):
        for parent, name in ROW_SPLIT + REDUCED:
            if not isinstance(getattr(getattr(layer, parent, None), name, None), torch.nn.Linear):
                raise ConfigError(f"model: layer {i} has no {parent}.{name} linear layer; "
                                  "tensor parallelism supports Llama/Qwen2/Mistral-style layers")


def shard_model(model, tp: TensorParallel, geometry: KVGeometry) -> None:
    """Keep this rank's heads and MLP columns of every layer, in place; all-reduce after
    ``o_proj`` and ``down_proj``. A model already sharded the same way is left as it is."""
    if tp.size == 1:
        return
    mark = (tp.rank, tp.size)
    if getattr(model, "pagebench_tensor_parallel", None) == mark:
        _add_reduce_hooks(model, tp)  # sharded already: the newest engine's group reduces
        return
    check_shardable(model, tp.size)
    layers = decoder_layers(model)
    inter = model.config.intermediate_size
    d, r = geometry.head_dim, tp.rank
    q = tp.geometry.num_q_heads * d
    kv = tp.geometry.num_kv_heads * d
    kv_start = r * geometry.num_kv_heads // tp.size * d  # replicated heads: r // (tp / kv)
    mlp = inter // tp.size
    spans = {"q_proj": (r * q, q), "k_proj": (kv_start, kv), "v_proj": (kv_start, kv),
             "gate_proj": (r * mlp, mlp), "up_proj": (r * mlp, mlp),
             "o_proj": (r * q, q), "down_proj": (r * mlp, mlp)}
    with torch.no_grad():
        for layer in layers:
            for parent, name in ROW_SPLIT:
                _keep_rows(getattr(getattr(layer, parent), name), *spans[name])
            for parent, name in REDUCED:
                _keep_columns(getattr(getattr(layer, parent), name), *spans[name], r == 0)
    model.pagebench_tensor_parallel = mark
    _add_reduce_hooks(model, tp)


def _keep_rows(linear: torch.nn.Linear, start: int, count: int) -> None:
    linear.weight = torch.nn.Parameter(linear.weight[start:start + count].clone(),
                                       requires_grad=False)
    if linear.bias is not None:
        linear.bias = torch.nn.Parameter(linear.bias[start:start + count].clone(),
                                         requires_grad=False)
    linear.out_features = count


def _keep_columns(linear: torch.nn.Linear, start: int, count: int, keep_bias: bool) -> None:
    linear.weight = torch.nn.Parameter(linear.weight[:, start:start + count].contiguous(),
                                       requires_grad=False)
    if linear.bias is not None and not keep_bias:
        linear.bias = None  # the all-reduce sums the ranks' outputs: add the bias once
    linear.in_features = count


def _remove_reduce_hooks(model) -> None:
    for handle in getattr(model, "pagebench_reduce_hooks", []):
        handle.remove()
    model.pagebench_reduce_hooks = []


def _add_reduce_hooks(model, tp: TensorParallel) -> None:
    """The all-reduce after each split projection, on behalf of the newest engine's group.
    Left out of ``torch.compile`` (a graph break): compiled layers call the eager collective,
    which a CUDA graph captures as it is."""
    _remove_reduce_hooks(model)
    reduce = torch.compiler.disable(tp.all_reduce)
    handles = []
    for layer in decoder_layers(model):
        for parent, name in REDUCED:
            module = getattr(getattr(layer, parent), name)
            handles.append(module.register_forward_hook(
                lambda _module, _inputs, out: reduce(out)))
    model.pagebench_reduce_hooks = handles
