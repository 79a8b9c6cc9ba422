"""Tensor parallelism, judged: the claims the report's "Past one GPU" section shows, and the
tables it derives from ``reports/data/h200x2/`` (``scripts/h200x2_tp.sh``): the all-reduce
against the CUDA-graph decode step, the sweep's speedup on two GPUs.
"""

from __future__ import annotations

import pandas as pd

from pagebench.analysis.claims import Claim, Measured, Part, first, per_machine
from pagebench.analysis.noise import Band, inside
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
TABLES = {"tp_allreduce_step": allreduce_frame,
          "sweep_wall_speedup": lambda results: with_speedup(results.get("sweep_wall"))}
