"""The report's "Past one GPU" section: the tensor-parallel engine, data-parallel replicas and
the kernel sweep on two GPUs, read from ``reports/data/<two-GPU machine>/`` (written by
``scripts/gpu2_tp.sh``), beside the capacity planner's arithmetic for tensor parallelism
(``capacity_tp``: :func:`pagebench.sim.capacity.tensor_parallel_rows`, any machine).

It opens with the answer to "tp=2 or two replicas, at which batch, for which model" from the
derived ``tp_choice`` table, or with the runs still missing for it.

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

SOURCE = "reports/data/h200x2/ (scripts/gpu2_tp.sh)"
# what the tp_choice columns need, and the run of scripts/gpu2_tp.sh that makes each
RUNS = (("one_gpu_tokens_per_s", "one GPU with CUDA graphs, run alone (tp-bench throughput)"),
        ("tp2_tokens_per_s", "tp=2 with CUDA graphs (tp-bench throughput under torchrun)"),
        ("replicas2_tokens_per_s", "two replicas with CUDA graphs (tp-bench replicas)"))
MODELS = "the 0.5B and Llama-3-8B shapes"
MODEL_NAMES = ("qwen2.5-0.5b-random", "llama-3-8b-random")  # as tp-bench --preset names them


def answer(choice: pd.DataFrame | None) -> list[str]:
    """Per machine and model: the better use of a second GPU at each batch, from
    ``tp_choice``."""
    if choice is None or choice.empty:
        return []
    lines = []
    for (machine, model), rows in choice.groupby(["machine", "model"], sort=True):
        picks = [f"batch {int(r.batch)}: {r.choice} ({_speedups(r)})"
                 for r in rows.sort_values("batch").itertuples() if r.choice]
        if picks:
            lines.append(f"{model} on {machine}: " + "; ".join(picks) + ".")
    return lines


def _speedups(row) -> str:
    parts = [f"{name} {value:.2f}×" for name, value in
             (("tp=2", row.tp2_speedup), ("2 replicas", row.replicas2_speedup))
             if pd.notna(value)]
    return ", ".join(parts) + " one GPU"


def missing(choice: pd.DataFrame | None, bandwidth: pd.DataFrame | None) -> list[str]:
    """The runs the choice (and the step model's all-reduces) still lack, per model measured
    at all (every run when none is)."""
    out = [] if bandwidth is not None and not bandwidth.empty else [
        "the all-reduce bandwidth at decode-step sizes (tp-bench allreduce-bw under torchrun)"]
    if choice is None or choice.empty:
        return [f"{what}, for {MODELS}" for _, what in RUNS] + out
    out += [f"{model}: {what}" for model in MODEL_NAMES if model not in set(choice["model"])
            for _, what in RUNS]
    for model, rows in choice.groupby("model", sort=True):
        out += [f"{model}: {what}" for column, what in RUNS if rows[column].isna().all()]
        if rows["one_gpu_tokens_per_s"].notna().any() and not rows["baseline_alone"].all():
            out.append(f"{model}: the one-GPU baseline again, alone (it ran beside another "
                       "rank's)")
    return out


def throughput_plot(tput: pd.DataFrame) -> plots.Plot | None:
    """Tokens/s against batch, one line per run; a panel per model where several were run."""
    several = "model" in tput.columns and tput["model"].nunique() > 1
    hue = "mode" if "mode" in tput.columns else "tp"  # mode (optional): tp and eager / graphs
    return plots.lines(tput, "batch", "tokens_per_s", hue, "Engine tokens/s vs batch: one GPU, "
                       "tp=2 and two replicas", "batch size (sequences)", "generated tokens/s",
                       "line chart of tokens per second against batch for one GPU, tp=2 and "
                       "two replicas", legend_title="run" if hue == "mode" else
                       "tensor-parallel GPUs", logx=True, panel="model" if several else None)


MEASURED = (
    View("tp_choice", "The second GPU: tokens/s of one GPU, tp=2 and two independent replicas, "
         "all with CUDA graphs, and the better of them", frame=derived("tp_choice")),
    View("tp_step_model", "The tp=2 decode step, modelled: one GPU's CUDA-graph step split over "
         "two ranks plus 2 × layers all-reduces timed alone at the step's size",
         frame=derived("tp_step_model")),
    View("tp_allreduce_bw", "All-reduce at decode-step sizes ([batch, hidden], bf16; NCCL, "
         "NVLink multicast off): time and bus bandwidth (nccl-tests: bytes / time × 2(n−1)/n)",
         ("machine", "model", "batch", "bytes", "time_us", "algbw_gbps", "busbw_gbps")),
    View("tp_equality", "Greedy tokens at tp=2 equal the single-GPU engine's (tiny fp32 model; "
         "block tables checked on every rank each step)",
         ("machine", "prefix_caching", "prompts_equal", "num_prompts", "ranks_agree")),
    View("tp_capacity", "KV blocks per GPU at the same KV memory per GPU",
         ("machine", "tp", "kv_heads_per_gpu", "kv_memory_budget_bytes",
          "bytes_per_block_per_gpu", "num_blocks_per_gpu")),
    View("tp_throughput", "Engine throughput (random weights, bf16; prompts of 128 tokens, 64 "
         "generated): one GPU (run alone where baseline_alone), tp=2, two replicas",
         ("machine", "model", "tp", "mode", "batch", "tokens_per_s", "decode_tokens_per_s",
          "time_s", "num_steps", "num_blocks_per_gpu", "baseline_alone"),
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
    choice = results.get("tp_choice")
    lines = answer(choice)
    if lines:
        s.text("tp=2 or two replicas? " + " ".join(lines))
    todo = missing(choice, results.get("tp_allreduce_bw"))
    if todo:
        s.text("Runs still to make on two GPUs (scripts/gpu2_tp.sh; docs/parallel.md): "
               + "; ".join(todo) + ".")
    s.table(claims_table(verdicts(results, s.id), "Verdicts"))
    s.show(results, MEASURED, empty=f"two-GPU measurements ({SOURCE})")
    return s.show(results, (PLANNER,))
