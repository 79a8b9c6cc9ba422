"""Tensor parallelism, judged: the claims the report's "Past one GPU" section shows, and the
tables it derives from the two-GPU runs (``scripts/gpu2_tp.sh``): the all-reduce against the
CUDA-graph decode step, the sweep's speedup on two GPUs, the choice between tp=2 and two
replicas per model and batch (``tp_choice``), and the step-time model of tp=2 (``tp_step_model``:
one GPU's CUDA-graph step split over the ranks plus the measured all-reduces).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagebench.analysis.claims import Claim, Measured, Part, first, per_machine
from pagebench.analysis.noise import Band, inside
from pagebench.config import PRESETS
from pagebench.results import Results
from pagebench.results.derived import ARITHMETIC_KIND, MEASURED_KIND

SECTION = "parallel"


# what one tp=2 / tp=1 comparison holds fixed, beside the machine
CAPACITY_CASE = ("kv_memory_budget_bytes", "model", "commit")
ATTENTION_CASE = ("backend", "context", "block_size", "dtype", "commit")


def capacity_parts(results: Results) -> Measured | None:
    """tp=2 / tp=1 blocks per GPU on each machine, in each KV budget of one run
    (:data:`CAPACITY_CASE`)."""
    return per_machine(results.get("tp_capacity"), capacity_part, CAPACITY_CASE)


def capacity_part(machine: str, frame: pd.DataFrame) -> Part | None:
    blocks = frame.groupby("tp")["num_blocks_per_gpu"].max()
    if not {1, 2} <= set(blocks.index):
        return None
    ratio = blocks[2] / blocks[1]
    heads = frame.groupby("tp")["kv_heads_per_gpu"].max() if "kv_heads_per_gpu" in frame \
        else None
    budget = first(frame, "kv_memory_budget_bytes")
    within = "" if pd.isna(budget) else f" in {float(budget) / 2**30:g} GiB"
    return Part(ratio, f"{machine}: {int(blocks[1]):,} → {int(blocks[2]):,} blocks per GPU"
                f"{within} ({ratio:.2f}×)" + (f"; KV heads per GPU {int(heads[1])} → "
                                              f"{int(heads[2])}" if heads is not None else ""),
                name=machine)


def attention_parts(results: Results) -> Measured | None:
    """tp=2 / tp=1 attention time per step on each machine, in each case of one run
    (:data:`ATTENTION_CASE`)."""
    return per_machine(results.get("tp_attention"), attention_part, ATTENTION_CASE)


def attention_part(machine: str, frame: pd.DataFrame) -> Part | None:
    """Judged at the largest batch with both tp=1 and tp=2 (None: no such batch)."""
    ratios = attention_ratios(frame)
    if ratios is None or ratios.empty:
        return None
    # medians alone: each of the two times gets ±NO_SPREAD, so the ratio's band spans both
    band = Band.point(ratios.iloc[-1]) / Band.point(1.0)
    return Part(band, f"{machine}: tp=2 / tp=1 per step: " + ", ".join(
        f"batch {int(b)}: {r:.2f}×" for b, r in ratios.items())
        + f" (largest batch {band.text(2)})", name=machine)


def attention_ratios(frame: pd.DataFrame | None) -> pd.Series | None:
    """tp=2 / tp=1 attention time per step, by batch (ascending), of one case."""
    if frame is None:
        return None
    wide = frame.pivot_table(index="batch", columns="tp", values="per_step_us", aggfunc="median")
    if not {1, 2} <= set(wide.columns):
        return None
    return (wide[2] / wide[1]).dropna().sort_index()


# tp_throughput modes compared for the two-GPU choice: everything with CUDA graphs
ONE_GPU, TP2, REPLICAS2 = "tp=1, CUDA graphs", "tp=2, CUDA graphs", "2 replicas, CUDA graphs"
CHOICES = {TP2: "tp=2", REPLICAS2: "2 replicas"}


def choice_frame(results: Results) -> pd.DataFrame | None:
    """Per machine, model and batch: tokens/s of one GPU, tp=2 and two replicas (all with CUDA
    graphs), each over one GPU, and the better way to use the second GPU (``choice``: tp=2, 2
    replicas, or one GPU where neither beats it; empty without the one-GPU baseline).
    ``baseline_alone``: the one-GPU run was made with no other rank measuring."""
    tput = results.get("tp_throughput")
    if tput is None or "mode" not in tput.columns:
        return None
    runs = tput[tput["mode"].isin([ONE_GPU, *CHOICES])]
    if runs.empty:
        return None
    wide = runs.pivot_table(index=["machine", "model", "batch"], columns="mode",
                            values="tokens_per_s", aggfunc="median")
    out = pd.DataFrame(index=wide.index)
    for mode, column in ((ONE_GPU, "one_gpu"), (TP2, "tp2"), (REPLICAS2, "replicas2")):
        out[f"{column}_tokens_per_s"] = wide[mode] if mode in wide else np.nan
    one = out["one_gpu_tokens_per_s"]
    out["tp2_speedup"] = out["tp2_tokens_per_s"] / one
    out["replicas2_speedup"] = out["replicas2_tokens_per_s"] / one
    out["choice"] = [_choice(row) for _, row in out.iterrows()]
    alone = runs[runs["mode"] == ONE_GPU]
    if "baseline_alone" in alone.columns:
        flags = alone.assign(baseline_alone=alone["baseline_alone"].astype("boolean")
                             .fillna(False)).groupby(["machine", "model", "batch"])
        out["baseline_alone"] = flags["baseline_alone"].all().reindex(out.index).fillna(False)
    else:
        out["baseline_alone"] = False
    return out.reset_index()


def _choice(row) -> str:
    if pd.isna(row["one_gpu_tokens_per_s"]):
        return ""
    speedups = {"tp=2": row["tp2_speedup"], "2 replicas": row["replicas2_speedup"]}
    measured = {k: v for k, v in speedups.items() if pd.notna(v)}
    if not measured:
        return ""
    best = max(measured, key=measured.get)
    if measured[best] <= 1:
        return "one GPU"
    missing = [k for k in speedups if k not in measured]
    return best + (f" ({missing[0]} not measured)" if missing else "")


def _preset_layers(model: str) -> float:
    preset = PRESETS.get(str(model).removesuffix("-random"))
    return preset["num_hidden_layers"] if preset else np.nan


def step_model_frame(results: Results) -> pd.DataFrame | None:
    """The tp=2 decode step predicted per machine, model and batch: one GPU's CUDA-graph step
    halved (weights, heads and MLP split over two ranks) plus two all-reduces a layer, each
    timed alone at the step's size (``tp_allreduce_bw``, interpolated in bytes); beside the
    measured tp=2 CUDA-graph step where there is one. A step is batch / decode tokens/s."""
    tput, bw = results.get("tp_throughput"), results.get("tp_allreduce_bw")
    if tput is None or bw is None or "mode" not in tput.columns or \
            "decode_tokens_per_s" not in tput.columns or "hidden" not in bw.columns:
        return None
    steps = tput[tput["mode"].isin([ONE_GPU, TP2])].assign(
        step_ms=lambda f: f["batch"] / f["decode_tokens_per_s"] * 1e3)
    wide = steps.pivot_table(index=["machine", "model", "batch"], columns="mode",
                             values="step_ms", aggfunc="median")
    if ONE_GPU not in wide:
        return None
    rows = []
    for (machine, model, batch), step in wide.iterrows():
        reduce = bw[(bw["machine"] == machine) & (bw["world"] == 2) &
                    (bw["model"].astype(str) == str(model).removesuffix("-random"))]
        layers = _preset_layers(model)
        if reduce.empty or np.isnan(layers):
            continue
        reduce = reduce.sort_values("bytes")
        hidden = int(reduce["hidden"].iloc[0])
        item = int(reduce["bytes"].iloc[0]) // (int(reduce["batch"].iloc[0]) * hidden)
        nbytes = batch * hidden * item
        one_us = float(np.interp(nbytes, reduce["bytes"], reduce["time_us"]))
        compute = step[ONE_GPU] / 2
        allreduce = 2 * layers * one_us / 1e3
        measured = step.get(TP2, np.nan)
        rows.append(dict(machine=machine, model=model, batch=batch,
                         one_gpu_step_ms=step[ONE_GPU], compute_per_rank_ms=compute,
                         allreduce_bytes=nbytes, allreduce_ms_per_step=allreduce,
                         predicted_tp2_step_ms=compute + allreduce,
                         measured_tp2_step_ms=measured,
                         measured_over_predicted=measured / (compute + allreduce)))
    return pd.DataFrame(rows) if rows else None


def tp2_speedup_parts(results: Results) -> Measured | None:
    """tp=2 / one GPU tokens/s (both with CUDA graphs) at the largest batch both ran, per
    machine, on the Llama-3-8B shape."""
    frame = choice_frame(results)
    if frame is None:
        return None
    frame = frame[frame["model"].astype(str).str.startswith("llama-3-8b")]
    return per_machine(frame.dropna(subset=["tp2_speedup"]), tp2_speedup_part)


def tp2_speedup_part(machine: str, frame: pd.DataFrame) -> Part | None:
    if frame.empty:
        return None
    top = frame.sort_values("batch").iloc[-1]
    alone = "" if top["baseline_alone"] else "; one-GPU baseline not run alone"
    return Part(top["tp2_speedup"], f"{machine}: batch {int(top['batch'])}: "
                f"{top['tp2_tokens_per_s']:,.0f} vs {top['one_gpu_tokens_per_s']:,.0f} tokens/s "
                f"({top['tp2_speedup']:.2f}×){alone}", name=machine)


CLAIMS = (
    Claim("tp_kv_capacity", "TP doubles KV capacity per GPU.", "KV blocks per GPU at tp=2 / "
          "tp=1 within 1.9–2.1×, same KV memory per GPU (random-weight Llama-3-8B, bf16, "
          "block 16)", ("tp_capacity",), capacity_parts, lambda r: 1.9 <= r <= 2.1,
          mark_parts=True, kind=ARITHMETIC_KIND),
    Claim("tp_attention_halves", "Attention time per step halves at tp=2.", "paged decode on one "
          "GPU's heads (16 query / 4 KV vs 32 / 8) × 32 layers: tp=2 / tp=1 within 0.4–0.6× at "
          "the largest batch (bandwidth-bound), beyond each time's noise band; every batch "
          "shown", ("tp_attention",),
          attention_parts, lambda band: inside(band, 0.4, 0.6), mark_parts=True,
          kind=MEASURED_KIND),
    Claim("tp2_graphs_beat_one_gpu", "Past one GPU, tp=2 pays at large batch.", "tokens/s of "
          "tp=2 over one GPU, both with CUDA graphs, random-weight Llama-3-8B, at the largest "
          "batch both ran: above 1× (single runs: no noise band)", ("tp_throughput",),
          tp2_speedup_parts, lambda r: r > 1, mark_parts=True, kind=MEASURED_KIND),
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


def with_speedup(wall: pd.DataFrame | None) -> pd.DataFrame | None:
    """The sweep's wall time on one GPU / on each row's GPUs."""
    if wall is None:
        return None
    one = wall.loc[wall["gpus"] == 1, "wall_s"]
    return wall.assign(speedup=float(one.iloc[0]) / wall["wall_s"] if len(one) else None)


# derived tables the section shows: name -> function of the results
TABLES = {"tp_allreduce_step": allreduce_frame, "tp_choice": choice_frame,
          "tp_step_model": step_model_frame,
          "sweep_wall_speedup": lambda results: with_speedup(results.get("sweep_wall"))}
