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
from pagebench.report.claims import Claim, Measured, Part, evaluate
from pagebench.results import Results
from pagebench.results.devices import frame_devices
from pagebench.report.sections import Section, View, claims_table

SOURCE = "reports/data/h200x2/ (scripts/h200x2_tp.sh)"


def capacity_parts(results: Results) -> Measured | None:
    frame = results.get("tp_capacity")
    blocks = None if frame is None else frame.groupby("tp")["num_blocks_per_gpu"].max()
    if blocks is None or not {1, 2} <= set(blocks.index):
        return None
    ratio = blocks[2] / blocks[1]
    heads = frame.groupby("tp")["kv_heads_per_gpu"].max() if "kv_heads_per_gpu" in frame \
        else None
    return Measured([Part(ratio, f"{int(blocks[1]):,} → {int(blocks[2]):,} blocks per GPU "
                          f"({ratio:.2f}×)" + (f"; KV heads per GPU {int(heads[1])} → "
                                               f"{int(heads[2])}" if heads is not None else ""))],
                    frame_devices(frame))


def attention_parts(results: Results) -> Measured | None:
    ratios = attention_ratios(results.get("tp_attention"))
    if ratios is None or ratios.empty:
        return None
    return Measured([Part(ratios.iloc[-1], "tp=2 / tp=1 per step: " + ", ".join(
        f"batch {int(b)}: {r:.2f}×" for b, r in ratios.items()))],
        frame_devices(results.get("tp_attention")))


def attention_ratios(frame: pd.DataFrame | None) -> pd.Series | None:
    """tp=2 / tp=1 attention time per step, by batch (ascending)."""
    if frame is None:
        return None
    wide = frame.pivot_table(index="batch", columns="tp", values="per_step_us", aggfunc="median")
    if not {1, 2} <= set(wide.columns):
        return None
    return (wide[2] / wide[1]).dropna().sort_index()


CLAIMS = (
    Claim("tp_kv_capacity", "TP doubles KV capacity per GPU.", "KV blocks per GPU at tp=2 / "
          "tp=1 within 1.9–2.1×, same KV memory per GPU (random-weight Llama-3-8B, bf16, "
          "block 16)", ("tp_capacity",), capacity_parts, lambda r: 1.9 <= r <= 2.1),
    Claim("tp_attention_halves", "Attention time per step halves at tp=2.", "paged decode on one "
          "GPU's heads (16 query / 4 KV vs 32 / 8) × 32 layers: tp=2 / tp=1 within 0.4–0.6× at "
          "the largest batch (bandwidth-bound); every batch shown", ("tp_attention",),
          attention_parts, lambda r: 0.4 <= r <= 0.6),
)


def allreduce_frame(results: Results) -> pd.DataFrame | None:
    """``tp_allreduce`` with the isolated all-reduce time set against the decode step of the
    tp=2 CUDA-graph run (``tp_throughput``'s decode_tokens_per_s), where there is one."""
    frame, tput = results.get("tp_allreduce"), results.get("tp_throughput")
    if frame is None or tput is None or not {"mode", "decode_tokens_per_s"} <= set(tput.columns):
        return frame
    graphs = tput[(tput["tp"] == 2) & tput["mode"].astype(str).str.endswith("CUDA graphs")]
    if graphs.empty:
        return frame
    rate = graphs.groupby("batch")["decode_tokens_per_s"].median()
    out = frame.assign(graph_decode_step_ms=frame["batch"].map(rate.index.to_series() / rate
                                                                * 1e3))
    if "isolated_allreduce_us" in frame and "allreduce_calls_per_step" in frame:
        out["isolated_share_of_graph_step"] = (frame["isolated_allreduce_us"] / 1e3
                                               * frame["allreduce_calls_per_step"]
                                               / out["graph_decode_step_ms"])
    return out


def with_speedup(wall: pd.DataFrame) -> pd.DataFrame:
    """The sweep's wall time on one GPU / on each row's GPUs."""
    one = wall.loc[wall["gpus"] == 1, "wall_s"]
    return wall.assign(speedup=float(one.iloc[0]) / wall["wall_s"] if len(one) else None)


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
          "graph_decode_step_ms", "isolated_share_of_graph_step"), frame=allreduce_frame),
    View("tp_attention", "Paged decode attention per step (× 32 layers) on one GPU's heads",
         ("machine", "backend", "tp", "num_q_heads", "num_kv_heads", "batch", "context",
          "time_us", "per_step_us")),
    View("sweep_wall", "Kernel sweep (`pagebench bench --device cuda` under torchrun, cold "
         "Triton cache) on 1 and 2 GPUs; startup_s: starting torchrun and pagebench alone, a "
         "fixed cost in both", ("machine", "gpus", "wall_s", "speedup", "startup_s", "points",
         "rows"), table=with_speedup),
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
    s.table(claims_table(evaluate(results, CLAIMS), "Verdicts"))
    s.show(results, MEASURED, empty=f"two-GPU measurements ({SOURCE})")
    return s.show(results, (PLANNER,))
