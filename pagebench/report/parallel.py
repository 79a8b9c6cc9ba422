"""The report's "Past one GPU" section: the tensor-parallel engine and the kernel sweep on two
GPUs, read from ``reports/data/h200x2/`` (written by ``scripts/h200x2_tp.sh``), beside the
capacity planner's arithmetic for tensor parallelism (``capacity_tp``:
:func:`pagebench.sim.capacity.tensor_parallel_rows`, any machine).

Datasets (one CSV each, named by the script): ``tp_equality`` (greedy tp=2 vs one GPU),
``tp_capacity`` (KV blocks per GPU at equal per-GPU KV memory), ``tp_throughput`` (tokens/s vs
batch), ``tp_allreduce`` (all-reduce share of a step), ``tp_attention`` (paged decode per step
on one GPU's heads), ``sweep_wall`` (the kernel sweep's wall time on 1 and 2 GPUs).
"""

from __future__ import annotations

import pandas as pd

from pagebench.report import plots
from pagebench.report.sections import Section, View, claims_table, derived, verdicts
from pagebench.results import Results

SOURCE = "reports/data/h200x2/ (scripts/h200x2_tp.sh)"


def throughput_plot(tput: pd.DataFrame) -> plots.Plot | None:
    hue = "mode" if "mode" in tput.columns else "tp"  # mode (optional): tp and eager / graphs
    return plots.lines(tput, "batch", "tokens_per_s", hue, "Engine tokens/s vs batch: tp=1 (one "
                       "GPU) and tp=2 (two GPUs)", "batch size (sequences)", "generated tokens/s",
                       "line chart of tokens per second against batch for tp 1 and 2",
                       legend_title="run" if hue == "mode" else "tensor-parallel GPUs",
                       logx=True)


MEASURED = (
    View("tp_equality", "Greedy tokens at tp=2 equal the single-GPU engine's (tiny fp32 model; "
         "block tables checked on every rank each step)",
         ("machine", "prefix_caching", "prompts_equal", "num_prompts", "ranks_agree")),
    View("tp_capacity", "KV blocks per GPU at the same KV memory per GPU",
         ("machine", "tp", "kv_heads_per_gpu", "kv_memory_budget_bytes",
          "bytes_per_block_per_gpu", "num_blocks_per_gpu")),
    View("tp_throughput", "Engine throughput (random-weight Llama-3-8B, bf16; prompts of 128 "
         "tokens, 64 generated)", ("machine", "tp", "mode", "batch", "tokens_per_s",
         "decode_tokens_per_s", "time_s", "num_steps", "num_blocks_per_gpu"),
         plot=throughput_plot, missing=f"engine throughput at tp=1 and tp=2 ({SOURCE})"),
    View("tp_allreduce", "All-reduce per step at tp=2. Eager run: CUDA events around every "
         "all-reduce (steps of a whole generate call, mostly decode); 'isolated': one "
         "all-reduce of a decode step's hidden states timed alone × calls per step, also "
         "against the decode step replayed from a CUDA graph where the engine has them",
         ("machine", "batch", "step_ms", "allreduce_calls_per_step", "allreduce_ms_per_step",
          "allreduce_share", "isolated_allreduce_us", "isolated_allreduce_share",
          "graph_decode_step_ms", "isolated_share_of_graph_step"),
         frame=derived("tp_allreduce_step")),
    View("tp_attention", "Paged decode attention per step (× 32 layers) on one GPU's heads",
         ("machine", "backend", "tp", "num_q_heads", "num_kv_heads", "batch", "context",
          "time_us", "per_step_us")),
    View("sweep_wall", "Kernel sweep (`pagebench bench --device cuda` under torchrun, cold "
         "Triton cache) on 1 and 2 GPUs; startup_s: starting torchrun and pagebench alone, a "
         "fixed cost in both", ("machine", "gpus", "wall_s", "speedup", "startup_s", "points",
         "rows"), frame=derived("sweep_wall_speedup")),
)

PLANNER = View("capacity_tp", "Capacity planner per GPU (141 GB, 0.9 utilisation, 4 GiB overhead, "
               "block 16, bf16): weights and KV heads split over tp GPUs",
               missing="capacity planner per GPU (pagebench.sim.capacity.tensor_parallel_rows)")


def section(results: Results) -> Section:
    s = Section("parallel", "Past one GPU")
    s.text("Tensor parallelism shards attention by KV head: each GPU holds num_kv_heads / tp "
           "heads of every block (one replicated head when tp exceeds the KV heads), the block "
           "tables are the same on every GPU, and each layer adds two all-reduces (after o_proj "
           "and down_proj). `LLMEngine(..., tensor_parallel_size=N)` under `torchrun "
           "--nproc-per-node N`; `pagebench bench` under torchrun splits its points over the "
           "GPUs.")
    s.table(claims_table(verdicts(results, s.id), "Verdicts"))
    s.show(results, MEASURED, empty=f"two-GPU measurements ({SOURCE})")
    return s.show(results, (PLANNER,))
