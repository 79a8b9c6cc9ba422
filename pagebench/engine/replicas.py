"""Data-parallel replicas: one request set split over N independent engines, one process and
one device each (``cuda:i`` for replica ``i``, or the CPU).

The other way to use N GPUs than tensor parallelism: no collective in a step, each GPU holds
the whole model and its own KV cache, and request ``j`` goes to replica ``j % N`` (every N-th
arrival, :func:`split_round_robin`). Each replica is a process started with
``torch.multiprocessing``'s spawn (CUDA cannot be forked), builds its model and engine, warms
up, and then runs its share of each job in step with the others: every job starts at a
barrier, so that the replicas' runs overlap as they would on one host, and the aggregate
throughput is the total tokens over the slowest replica's time.

What a replica runs is a function ``work(engine, items, sync)`` (picklable: defined at module
level) that calls ``sync()`` before each timed job; :func:`timed_generate` is the engine
throughput's, ``pagebench.measure.replica_serving`` the serving benchmark's.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pagebench.errors import ConfigError, PagebenchError, check_positive_int

log = logging.getLogger(__name__)


def split_round_robin(count: int, replicas: int) -> list[list[int]]:
    """Indices ``0..count-1`` dealt to ``replicas`` shares: request ``j`` to share ``j % N``."""
    replicas = check_positive_int("replicas", replicas)
    return [list(range(i, count, replicas)) for i in range(replicas)]


@dataclass(frozen=True)
class ReplicaSetup:
    """How each replica process builds its engine. ``build_model(device=...)`` returns the model
    (picklable: a module-level function or a ``functools.partial`` of one); ``warmup(engine)``
    runs once before the first job; ``threads``: torch threads per replica on the CPU."""

    build_model: Callable
    device: str = "cpu"  # "cpu" or "cuda" (replica i on cuda:i)
    engine_options: dict = field(default_factory=dict)
    warmup: Callable | None = None
    threads: int | None = None


def check_replicas(replicas: int, device: str) -> int:
    """``replicas`` as a positive int that the devices hold (one GPU each); ConfigError else."""
    replicas = check_positive_int("replicas", replicas)
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"replicas: device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and replicas > torch.cuda.device_count():
        raise ConfigError(f"replicas: {replicas} replicas need as many GPUs; "
                          f"{torch.cuda.device_count()} visible")
    return replicas


def run_replicas(setup: ReplicaSetup, work: Callable, shares: list, timeout_s: float = 3600):
    """``work(engine, shares[i], sync)`` in replica process ``i`` for each share; their results,
    in share order. PagebenchError with the failing replica's traceback if any fails (the
    others are released from their barrier and stopped)."""
    replicas = check_replicas(len(shares), setup.device)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(replicas), ctx.Queue()
    procs = [ctx.Process(target=_replica, args=(i, setup, work, share, barrier, results),
                         daemon=True) for i, share in enumerate(shares)]
    for p in procs:
        p.start()
    out, errors, done = [None] * replicas, [], set()
    try:
        deadline = time.monotonic() + timeout_s
        while len(done) < replicas:
            try:
                index, value, error = results.get(timeout=1.0)
            except queue_module.Empty:
                dead = [i for i, p in enumerate(procs) if i not in done and p.exitcode]
                if dead:  # killed before it could report (a signal, the OOM killer)
                    raise PagebenchError(f"replica {dead[0]} exited with status "
                                         f"{procs[dead[0]].exitcode} and no result") from None
                if time.monotonic() > deadline:
                    raise PagebenchError(f"replicas: no result within {timeout_s:g} s") from None
                continue
            done.add(index)
            if error is not None:
                errors.append((index, error))
            out[index] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    if errors:
        index, (summary, trace) = min(errors, key=lambda e: "BrokenBarrier" in e[1][0])
        log.debug("replica %d: %s", index, trace)  # the cause first, not a released barrier
        raise PagebenchError(f"replica {index} failed: {summary}")
    return out


def _replica(index: int, setup: ReplicaSetup, work, share, barrier, results) -> None:
    try:
        if setup.device == "cuda":
            device = torch.device("cuda", index)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
            if setup.threads:
                torch.set_num_threads(setup.threads)
        from pagebench.engine.engine import LLMEngine

        engine = LLMEngine(setup.build_model(device=device), **setup.engine_options)
        if setup.warmup is not None:
            setup.warmup(engine)
        results.put((index, work(engine, share, barrier.wait), None))
    except Exception as e:  # noqa: BLE001 -- any failure goes back to the parent
        barrier.abort()  # the others stop waiting for this one
        results.put((index, None, (f"{type(e).__name__}: {e}", traceback.format_exc())))


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generate(engine, jobs, sync) -> list[dict]:
    """Replica work: each job ``(prompt indices, prompts, SamplingParams)`` generated after a
    barrier; per job its indices, each prompt's token ids, the wall seconds (0: an empty
    share), steps, decode tokens/s and whether the engine has CUDA graphs."""
    device = engine.tp.device
    out = []
    for indices, prompts, params in jobs:
        sync()
        _synchronize(device)
        t0 = time.perf_counter()
        outputs = engine.generate(prompts, params, use_tqdm=False) if prompts else []
        _synchronize(device)
        seconds = time.perf_counter() - t0 if prompts else 0.0
        stats = engine.stats
        out.append(dict(indices=list(indices),
                        token_ids=[list(o.outputs[0].token_ids) for o in outputs],
                        seconds=seconds, num_steps=len(stats.steps) if prompts else 0,
                        cuda_graphs=bool(engine.graphs()["cuda_graphs"]),
                        decode_tokens_per_s=stats.decode_tokens_per_s if prompts else 0.0))
    return out


def in_request_order(per_replica: list[list[dict]], job: int, key: str, count: int) -> list:
    """Each replica's ``key`` values of job ``job`` (one per request of its ``indices``) placed
    in request order; PagebenchError unless each of the ``count`` requests ran exactly once."""
    merged: list = [None] * count
    ran = [False] * count
    for replica in per_replica:
        part = replica[job]
        for i, value in zip(part["indices"], part[key]):
            if ran[i]:
                raise PagebenchError(f"replicas: request {i} ran on two replicas")
            merged[i], ran[i] = value, True
    missing = [i for i, done in enumerate(ran) if not done]
    if missing:
        raise PagebenchError(f"replicas: requests {missing[:5]} ran on no replica")
    return merged


def merge_generations(per_replica: list[list[dict]], job: int, count: int) -> dict:
    """Job ``job`` of every replica merged: token ids in request order (each request exactly
    once, else PagebenchError), the slowest replica's seconds, the replicas' total tokens."""
    token_ids = in_request_order(per_replica, job, "token_ids", count)
    return dict(token_ids=token_ids, seconds=max(r[job]["seconds"] for r in per_replica),
                num_tokens=sum(len(ids) for ids in token_ids),
                num_steps=max(r[job]["num_steps"] for r in per_replica),
                decode_tokens_per_s=sum(r[job]["decode_tokens_per_s"] for r in per_replica),
                cuda_graphs=all(r[job]["cuda_graphs"] for r in per_replica))
