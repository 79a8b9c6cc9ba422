"""Two H200s of one host: the tensor-parallel engine (tp=1 vs tp=2) and the kernel sweep on
1 vs 2 GPUs. One command; it starts the torchrun jobs itself:

    PYTHONPATH=. python3 scripts/h200x2_tp.py --out $OUT

1. greedy equality: a tiny fp32 model, engine tp=2 vs the single-GPU engine (Triton kernels,
   tables checked on both ranks every step);
2. random-weight Llama-3-8B (bf16), 16 GiB of KV cache per GPU: KV blocks per GPU, tokens/s vs
   batch at tp=1 and tp=2, and the share of each step in all-reduce (CUDA events around every
   all-reduce of an eager run; plus all-reduce alone, timed per call at each batch);
3. attention per decode step: the paged decode kernel on one GPU's heads (32 query / 8 KV at
   tp=1, 16 / 4 at tp=2) times 32 layers;
4. ``pagebench bench --device cuda`` (a reduced grid) under torchrun on 1 and on 2 GPUs, each
   with a cold Triton cache: wall time and the merged rows.

CSVs go to --out (7 files, for reports/data/h200x2/); a short table is printed last. NVLink
multicast stays off (NCCL_NVLS_ENABLE=0). Sections past --budget-s are skipped and say so.
``--smoke`` runs every step on the CPU (gloo, tiny models and sizes) to check the script.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

T0 = time.time()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
GPU = dict(device="cuda", batches=(1, 16, 64, 256), kv_memory="16GiB",  # KV per GPU
           prompt_len=128, max_tokens=64, context=2048, kernel="triton",
           heads={1: (32, 8), 2: (16, 4)},
           sweep=["--batches", "1,4,16,64,256", "--contexts", "4096",
                  "--block-sizes", "8,16,32,128", "--backends", "triton,sdpa", "--repeat", "20"])
SMOKE = dict(device="cpu", batches=(1, 4), kv_memory="2MiB", prompt_len=16, max_tokens=6,
             context=64, kernel="torch", heads={1: (4, 2), 2: (2, 1)},
             sweep=["--shape", "tiny=4/2/16", "--batches", "1,2", "--contexts", "32",
                    "--block-sizes", "16", "--repeat", "1"])


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def env_for_children():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.update(NO_MULTICAST)
    return env


def torchrun(nproc, args, timeout, extra_env=None):
    """(returncode, stdout, wall seconds) of a torchrun job; past ``timeout`` the whole job
    (torchrun and its workers, one process group) is killed and its returncode is -9."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env_for_children() | (extra_env or {}), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = -9
        out += f"\n(killed after {timeout:.0f} s)"
    wall = time.perf_counter() - t0
    if rc:
        print(out[-6000:], flush=True)
    return rc, out, wall


# ---- launcher ----------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/h200x2_tp"))
    ap.add_argument("--budget-s", type=float, default=340)
    ap.add_argument("--smoke", action="store_true", help="CPU check of the script (gloo)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cfg = SMOKE if args.smoke else GPU
    os.makedirs(args.out, exist_ok=True)
    if args.worker:
        return worker(args)
    import torch

    if not args.smoke and torch.cuda.device_count() < 2:
        print(f"h200x2_tp: needs 2 GPUs, {torch.cuda.device_count()} visible", file=sys.stderr)
        return 2
    if not args.smoke:
        log(f"torch {torch.__version__}, {torch.cuda.device_count()} x "
            f"{torch.cuda.get_device_name(0)}")
    rc, out, wall = torchrun(2, [os.path.abspath(__file__), "--worker", "--out", args.out,
                                 "--budget-s", str(args.budget_s - 115)]
                             + (["--smoke"] if args.smoke else []),
                             timeout=max(60, args.budget_s - 95))
    if rc == 0:
        print(out[-6000:], flush=True)
    log(f"engine worker: rc {rc}, {wall:.0f} s")
    sweeps(args)
    summary(args.out)
    return 0


def sweeps(args):
    import pandas as pd

    walls, frames = [], []
    # the fixed cost in each wall time: starting torchrun, python and pagebench
    rc, _, startup = torchrun(1, ["-m", "pagebench", "bench", "--list-backends"], timeout=60)
    log(f"startup (pagebench bench --list-backends under torchrun): {startup:.1f} s")
    for gpus in (1, 2):
        left = args.budget_s - (time.time() - T0)
        if left < 40:
            log(f"skip sweep on {gpus} GPU(s): budget")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            csv = os.path.join(tmp, "sweep.csv")
            # a cold Triton cache for each run: both pay their compiles
            rc, _, wall = torchrun(gpus, ["-m", "pagebench", "bench", "--device",
                                          args.cfg["device"], *args.cfg["sweep"], "--out", csv],
                                   timeout=left - 10,
                                   extra_env={"TRITON_CACHE_DIR": os.path.join(tmp, "triton")})
            if rc == 0 and os.path.exists(csv):
                frames.append(pd.read_csv(csv).assign(gpus=gpus))
                walls.append(dict(gpus=gpus, wall_s=wall, startup_s=startup,
                                  rows=len(frames[-1]),
                                  points=frames[-1].groupby(["model_shape", "batch",
                                                             "context"]).ngroups))
        log(f"sweep on {gpus} GPU(s): rc {rc}, {wall:.1f} s")
    if walls:
        pd.DataFrame(walls).to_csv(os.path.join(args.out, "sweep_wall.csv"), index=False)
        pd.concat(frames).to_csv(os.path.join(args.out, "sweep_rows.csv"), index=False)


def summary(out):
    import pandas as pd

    for name, cols in (("tp_equality.csv", ["prefix_caching", "prompts_equal", "num_prompts",
                                            "ranks_agree"]),
                       ("tp_capacity.csv", ["tp", "kv_heads_per_gpu", "kv_cache_bytes_per_gpu",
                                            "num_blocks_per_gpu"]),
                       ("tp_throughput.csv", ["mode", "batch", "tokens_per_s",
                                              "decode_tokens_per_s", "time_s"]),
                       ("tp_allreduce.csv", ["batch", "step_ms", "allreduce_ms_per_step",
                                             "allreduce_share", "isolated_allreduce_share"]),
                       ("tp_attention.csv", ["tp", "batch", "context", "per_step_us"]),
                       ("sweep_wall.csv", ["gpus", "wall_s", "startup_s", "rows", "points"])):
        path = os.path.join(out, name)
        if os.path.exists(path):
            df = pd.read_csv(path)
            print(f"\n{name}\n" + df[[c for c in cols if c in df]].to_string(
                index=False, float_format=lambda x: f"{x:.3g}"))
        else:
            print(f"\n{name}: missing")


# ---- worker (one process per GPU, under torchrun) ----------------------------------------
def worker(args):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if args.smoke:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    budget = Budget(args.budget_s)
    # the engine runs that could hang (a collective in a captured graph) come last
    sections = [("equality", equality), ("attention", attention), ("llama", llama)]
    for name, fn in sections:
        if not budget.agreed(30):
            log(f"rank {rank}: skip {name}: budget")
            continue
        try:
            fn(args, rank, device, budget)
        except Exception as e:  # noqa: BLE001 -- one failing section must not lose the others
            log(f"rank {rank}: {name} failed: {type(e).__name__}: {e}")
        dist.barrier()
    dist.destroy_process_group()
    return 0


class Budget:
    """Seconds left to this worker. ``agreed`` is rank 0's answer on every rank: a rank that
    skipped a tp=2 run alone would leave the other waiting in its collectives."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.time() - T0)

    def agreed(self, need_s: float) -> bool:
        import torch.distributed as dist

        box = [self.left() >= need_s]
        dist.broadcast_object_list(box, src=0)
        return bool(box[0])


def save(args, rank, rows, name):
    import pandas as pd

    if rank == 0 and rows:
        pd.DataFrame(rows).to_csv(os.path.join(args.out, name), index=False)
        log(f"wrote {name} ({len(rows)} rows)")


def has_eager() -> bool:
    """Whether this engine has ``enforce_eager`` (CUDA-graph decode it can turn off)."""
    import inspect

    from pagebench.engine import LLMEngine

    return "enforce_eager" in inspect.signature(LLMEngine).parameters


def engine_kwargs(**kw):
    """The options this engine has. torch.compile of the layers is left out (where the engine
    would do it): it costs a minute per 8B engine, and the 8B decode step is weight-bound."""
    import inspect

    from pagebench.engine import LLMEngine

    known = inspect.signature(LLMEngine).parameters
    return {k: v for k, v in (kw | {"compile_model": False}).items() if k in known}


def equality(args, rank, device, budget):
    import torch.distributed as dist

    from pagebench.engine import LLMEngine, SamplingParams, bench
    from pagebench.timing import environment

    kernel = args.cfg["kernel"]
    prompts = bench.random_prompts(16, 1, 200 if kernel == "triton" else 40, 1024, seed=3)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    rows = []
    for prefix in (False, True):
        kw = dict(block_size=16, num_blocks=512, kernel=kernel, enable_prefix_caching=prefix,
                  max_num_seqs=16, **engine_kwargs())
        single = LLMEngine(bench.tiny_model(device=device), **kw)
        ref = [r.outputs[0].token_ids for r in single.generate(prompts, params)]
        engine = LLMEngine(bench.tiny_model(device=device), tensor_parallel_size=2, **kw)
        engine.tp.check_tables = True
        out = [r.outputs[0].token_ids for r in engine.generate(prompts, params)]
        every = [None, None]
        dist.all_gather_object(every, out)
        rows.append(environment(device) | dict(
            experiment="tp_greedy_equality", model="tiny-qwen2-fp32", dtype="float32", tp=2,
            prefix_caching=prefix, kernel=kernel, num_prompts=len(prompts),
            prompts_equal=sum(a == b for a, b in zip(out, ref)),
            ranks_agree=every[0] == every[1], kv_heads_per_gpu=engine.kv_heads_per_rank))
    save(args, rank, rows, "tp_equality.csv")


def llama(args, rank, device, budget):
    import gc

    import torch

    from pagebench.config import KVGeometry, parse_bytes
    from pagebench.engine import LLMEngine, SamplingParams, bench
    from pagebench.timing import environment

    cfg = args.cfg
    if args.smoke:
        model, name = bench.tiny_model(dtype=torch.bfloat16), "tiny-qwen2-random"
    else:
        model = bench.preset_model("llama-3-8b", dtype=torch.bfloat16, device=device)
        name = "llama-3-8b-random"
    geometry = KVGeometry.from_config(model.config, dtype=torch.bfloat16)
    log(f"rank {rank}: {name} ready")
    prompt_len, max_tokens, batches = cfg["prompt_len"], cfg["max_tokens"], cfg["batches"]
    base = environment(device) | dict(model=name, dtype="bfloat16", block_size=16,
                                      prompt_len=prompt_len, max_tokens=max_tokens)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompts = {b: bench.random_prompts(b, prompt_len, prompt_len, model.config.vocab_size,
                                       seed=b) for b in batches + (16,)}
    capacity, throughput, shares = [], [], []

    def timed(engine, batch):
        sync(device)
        t0 = time.perf_counter()
        engine.generate(prompts[batch], params)
        sync(device)
        return time.perf_counter() - t0

    def engine_for(tp, eager):
        return LLMEngine(model, block_size=16, kv_cache_memory=cfg["kv_memory"],
                         max_num_seqs=256, max_num_batched_tokens=8192, tensor_parallel_size=tp,
                         **engine_kwargs(enforce_eager=eager))

    # tp=1 first: tp=2 shards the same model in place. Eager runs beside the default (CUDA
    # graphs for decode where the engine has them), so both modes compare tp=1 with tp=2; the
    # files are rewritten after every engine, so a later failure keeps what was measured.
    for tp in (1, 2):
        for eager in (True, False) if has_eager() else (False,):
            engine = engine_for(tp, eager)
            graphs = bool(engine.stats.get("cuda_graphs", False))
            mode = f"tp={tp}, " + ("eager" if eager else "CUDA graphs" if graphs
                                   else "default (no graphs)")
            if not capacity or capacity[-1]["tp"] != tp:
                capacity.append(base | dict(
                    tp=tp, kv_heads_per_gpu=engine.kv_heads_per_rank,
                    kv_cache_bytes_per_gpu=engine.runner.kv_cache_bytes,
                    kv_memory_budget_bytes=parse_bytes(cfg["kv_memory"]),
                    bytes_per_block_per_gpu=geometry.per_rank(tp).bytes_per_block(16),
                    num_blocks_per_gpu=engine.num_blocks))
            timed(engine, 16)  # warm-up: kernels compiled, allocator grown
            for b in batches:
                if not budget.agreed(60):
                    log(f"rank {rank}: skip {mode} batch {b}: budget")
                    continue
                seconds = timed(engine, b)
                stats = engine.stats
                throughput.append(base | dict(
                    tp=tp, mode=mode, cuda_graphs=graphs, batch=b, time_s=seconds,
                    num_steps=len(stats["steps"]), tokens_per_s=b * max_tokens / seconds,
                    decode_tokens_per_s=stats.get("decode_tokens_per_s"),
                    num_blocks_per_gpu=engine.num_blocks,
                    num_preemptions=stats["num_preemptions"]))
                log(f"rank {rank}: {mode} batch {b}: {b * max_tokens / seconds:.0f} tok/s")
            if tp == 2 and (eager or not has_eager()) and budget.agreed(60):
                shares = allreduce_share(engine, timed, base, model, batches, budget)
            del engine
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            save(args, rank, capacity, "tp_capacity.csv")
            save(args, rank, throughput, "tp_throughput.csv")
            save(args, rank, shares, "tp_allreduce.csv")


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_share(engine, timed, base, model, batches, budget):
    """All-reduce time per step: CUDA events around every all-reduce of an eager run, and
    one all-reduce of a decode step's hidden states [batch, hidden] timed alone."""
    import torch
    import torch.distributed as dist

    from pagebench.timing import measure

    timed(engine, 16)
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    rows = []
    for b in batches:
        if not budget.agreed(45):
            break
        engine.tp.collective_times = []
        seconds = timed(engine, b)
        reduce_s = engine.tp.collective_seconds()
        engine.tp.collective_times = None
        steps = len(engine.stats["steps"])
        x = torch.randn(b, hidden, dtype=torch.bfloat16, device=engine.tp.device)
        alone = measure(lambda: dist.all_reduce(x), device=engine.tp.device.type, warmup=5,
                        repeat=50, flush_l2=False)
        step_us = seconds / steps * 1e6
        rows.append(base | dict(tp=2, batch=b, eager=True, time_s=seconds, num_steps=steps,
                                step_ms=step_us / 1e3,
                                allreduce_calls_per_step=2 * layers,
                                allreduce_ms_per_step=reduce_s / steps * 1e3,
                                allreduce_share=reduce_s / seconds,
                                isolated_allreduce_us=alone.median_us,
                                isolated_allreduce_share=2 * layers * alone.median_us / step_us))
    return rows


def attention(args, rank, device, budget):
    import torch

    from pagebench.kernels import resolve
    from pagebench.timing import environment, measure

    rows, cfg = [], args.cfg
    if rank == 0:
        backend = resolve("decode", "auto", device, torch.bfloat16, 16, 128)
        context, layers = cfg["context"], 32
        for b in cfg["batches"]:
            for tp, (hq, hkv) in cfg["heads"].items():
                if budget.left() < 20:  # rank 0 alone: no collective here
                    break
                per_seq = context // 16
                k = torch.randn(b * per_seq, 16, hkv, 128, dtype=torch.bfloat16, device=device)
                v = torch.randn_like(k)
                q = torch.randn(b, hq, 128, dtype=torch.bfloat16, device=device)
                tables = torch.arange(b * per_seq, dtype=torch.int32,
                                      device=device).view(b, per_seq)
                lens = torch.full((b,), context, dtype=torch.int32, device=device)
                t = measure(lambda: backend.decode(q, k, v, tables, lens, 128 ** -0.5),
                            device=device.type, repeat=30, cuda_graph=device.type == "cuda")
                rows.append(environment(device) | dict(
                    backend=backend.name, dtype="bfloat16", tp=tp, num_q_heads=hq,
                    num_kv_heads=hkv, head_dim=128, batch=b, context=context, block_size=16,
                    time_us=t.median_us, layers=layers, per_step_us=t.median_us * layers))
    save(args, rank, rows, "tp_attention.csv")


if __name__ == "__main__":
    sys.exit(main())
