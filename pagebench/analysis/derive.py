"""Derived tables: the curves the report plots and the claims judge, computed from the datasets
of :mod:`pagebench.results.datasets` (kernel rows: ``backend`` = ``<kernel>-<layout>``,
``layout`` paged or contiguous, ``block_size`` empty when contiguous), and the recommended
block size. Their schemas are :data:`pagebench.results.datasets.DERIVED`.
"""

from __future__ import annotations

import pandas as pd

from pagebench.results import devices
from pagebench.results.commits import measured_at, newest_first

PRIMARY_BLOCK_SIZE = 16
# the columns of kernel_rows that say which run a row came from: times are compared within one
RUN = ["dtype", "commit"]
UNIFORM = "uniform"  # a batch of equal lengths (kernels rows' ``lengths``; empty: the same)
# a decode point of versus_fastest: every backend timed there is compared with the fastest
POINT = ["device_label", "shape", "kv_dtype", "lengths", "batch", "context"]
# paged kernel family -> (its paged backends, the contiguous ones it is judged against)
FAMILIES = {"triton": (("triton-paged",), ("triton-contiguous",)),
            "flashinfer": (("flashinfer-paged", "flashinfer-tc-paged"), None)}


def row_labels(df: pd.DataFrame) -> pd.Series:
    """Each row's device label, never empty: the ``machine`` column, which
    :meth:`pagebench.results.Results.add` fills with labels
    (:func:`pagebench.results.devices.frame_labels`); labelled here for a frame without one."""
    labels = df["machine"] if "machine" in df.columns else devices.frame_labels(df)
    return labels.fillna("unknown device").astype(str)


def kernel_rows(kernels: pd.DataFrame | None) -> pd.DataFrame | None:
    """Timed kernel rows with a ``paged`` flag, ``device_label``, ``shape`` and the :data:`RUN`
    columns (``commit`` empty where not recorded); only rows whose K/V cache is of the model's
    ``dtype`` (an fp8 cache is the fp8 section's) and whose batch has one length (a ragged
    batch is :func:`versus_fastest`'s)."""
    if kernels is None or len(kernels) == 0:
        return None
    df = kernels.dropna(subset=["batch", "context", "time_us"])
    if "lengths" in df.columns:
        df = df[df["lengths"].fillna(UNIFORM) == UNIFORM]
    df = df[df["time_us"] > 0]
    if "kv_dtype" in df.columns:
        df = df[df["kv_dtype"].fillna(df["dtype"]) == df["dtype"]]
    df = df.assign(commit=df["commit"].fillna("").astype(str) if "commit" in df.columns else "")
    df["paged"] = df["layout"].astype(str).str.lower().eq("paged")
    df["device_label"] = row_labels(df)
    df["gpu"] = df["device"].astype(str).str.startswith("cuda")
    df["shape"] = df["model_shape"].astype(str)
    df["timed_as"] = timed_as(df)
    return df if len(df) else None


INTERPRETED = "Triton interpreted on a CPU: checks the kernel, does not time it"
CPU_GRAPH = "CPU: no CUDA graph, an eager call"


def timed_as(df: pd.DataFrame) -> pd.Series:
    """What a timed row can carry: an interpreted Triton kernel on a CPU (numpy executes the
    kernel's program; its time says nothing about the kernel), a CPU row marked as graph
    replay (a CPU has no CUDA graph), or "" (a timing)."""
    cpu = ~df["gpu"]
    kernel = df["kernel"].astype(str) if "kernel" in df else df["backend"].astype(str)
    graphs = df["cuda_graphs"].astype(str).eq("True") if "cuda_graphs" in df else False
    out = pd.Series("", index=df.index, dtype=object)
    out[cpu & graphs] = CPU_GRAPH
    out[cpu & kernel.str.startswith("triton")] = INTERPRETED
    return out


def prefill_summary(prefill: pd.DataFrame | None) -> pd.DataFrame:
    """One row per prefill point of one commit per device and shape (the newest): each
    variant's time (us; " graph" = replayed from a CUDA graph), Triton / SDPA and torch /
    Triton ratios, Triton's TFLOP/s."""
    if prefill is None or len(prefill) == 0:
        return pd.DataFrame()
    df = prefill.dropna(subset=["batch", "query_len", "cached", "time_us"])
    if "lengths" in df.columns:  # mixed steps are prefill_versus_fastest's
        df = df[df["lengths"].fillna(UNIFORM) == UNIFORM]
    if len(df) == 0:
        return pd.DataFrame()
    df = df.copy()
    df["variant"] = df["backend"].astype(str) + df["cuda_graphs"].map({True: " graph",
                                                                         False: ""})
    df["device_label"] = row_labels(df)
    df["shape"] = df["model_shape"].astype(str)
    df["commit"] = df["commit"].fillna("").astype(str) if "commit" in df.columns else ""
    df = newest_run(df, ["device_label", "shape"])
    keys = ["device_label", "shape", "commit", "batch", "query_len", "cached"]
    out = df.pivot_table(index=keys, columns="variant", values="time_us", aggfunc="median")
    out.columns = [str(c) for c in out.columns]

    def ratio(name, num, den):
        if num in out.columns and den in out.columns:
            out[name] = out[num] / out[den]
    ratio("triton / sdpa", "triton-paged", "sdpa-contiguous")
    ratio("triton / sdpa (graph)", "triton-paged graph", "sdpa-contiguous graph")
    ratio("torch / triton", "torch-paged", "triton-paged")
    if "tflops" in df.columns:
        best = df[df["backend"] == "triton-paged"].groupby(keys)["tflops"].max()
        if len(best):
            out["triton TFLOP/s (best)"] = best
    return out.reset_index()


def relative_to_fastest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``df`` with ``relative_time`` (time / the fastest row's at the same ``keys``: 1.0 is
    the fastest backend there) and ``fastest`` (that row's backend)."""
    if len(df) == 0:
        return df.assign(relative_time=pd.Series(dtype=float), fastest=pd.Series(dtype=str))
    groups = df.groupby(keys, dropna=False)["time_us"]
    best = df.loc[groups.idxmin().dropna(), keys + ["backend"]].rename(
        columns={"backend": "fastest"})
    out = df.assign(relative_time=df["time_us"] / groups.transform("min"))
    return out.merge(best, on=keys, how="left")


def versus_fastest(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """Every backend (and block size) at every decode point beside the fastest one there:
    ``relative_time`` = its time / the fastest's (1.0: it is the fastest), and
    ``read_fraction`` = its K/V GB/s / the device's read-only bandwidth (``read_gbps``), for
    one commit per device, shape and lengths, the newest; uniform and ragged batches, bf16 and fp8
    caches are separate points. Only points where two or more kernels were timed."""
    if kernels is None or len(kernels) == 0:
        return pd.DataFrame()
    df = kernels.dropna(subset=["batch", "context", "time_us"])
    df = df[df["time_us"] > 0].copy()
    if df.empty:
        return pd.DataFrame()
    df["lengths"] = df["lengths"].fillna(UNIFORM) if "lengths" in df.columns else UNIFORM
    df["kv_dtype"] = (df["kv_dtype"].fillna(df["dtype"]) if "kv_dtype" in df.columns
                      else df["dtype"])
    df["device_label"] = row_labels(df)
    df["shape"] = df["model_shape"].astype(str)
    df["commit"] = df["commit"].fillna("").astype(str) if "commit" in df.columns else ""
    df = newest_run(df, ["device_label", "shape", "lengths"])  # a ragged sweep is its own run
    df["block_size"] = df["block_size"].fillna(0)  # 0: contiguous, kept in the groupby
    df = _best(df, POINT + ["backend", "block_size"])
    kernels_at = df.groupby(POINT)["kernel"].transform("nunique")
    df = df[kernels_at >= 2]
    if df.empty:
        return pd.DataFrame()
    out = relative_to_fastest(df, POINT)
    out["block_size"] = out["block_size"].where(out["block_size"] > 0)
    if "read_gbps" in out.columns and "gbps" in out.columns:
        out["read_fraction"] = out["gbps"] / out["read_gbps"]
    columns = POINT + ["backend", "block_size", "time_us", "relative_time", "fastest", "gbps",
                       "read_fraction", "commit"]
    return out[[c for c in columns if c in out.columns]].sort_values(
        POINT + ["relative_time"]).reset_index(drop=True)


PREFILL_POINT = ["device_label", "shape", "kv_dtype", "lengths", "batch", "query_len",
                 "cached"]


def prefill_versus_fastest(prefill: pd.DataFrame | None) -> pd.DataFrame:
    """Every prefill backend at every point beside the fastest there (``relative_time``), as
    :func:`versus_fastest` does for decode; mixed steps (``lengths`` mixed:...) included."""
    if prefill is None or len(prefill) == 0:
        return pd.DataFrame()
    df = prefill.dropna(subset=["batch", "query_len", "cached", "time_us"]).copy()
    if df.empty:
        return pd.DataFrame()
    df["lengths"] = df["lengths"].fillna(UNIFORM) if "lengths" in df.columns else UNIFORM
    dtype = df["dtype"] if "dtype" in df.columns else pd.Series("", index=df.index)
    df["kv_dtype"] = df["kv_dtype"].fillna(dtype) if "kv_dtype" in df.columns else dtype
    df["device_label"] = row_labels(df)
    df["shape"] = df["model_shape"].astype(str)
    df["commit"] = df["commit"].fillna("").astype(str) if "commit" in df.columns else ""
    df = newest_run(df, ["device_label", "shape", "lengths"])  # mixed steps: their own run
    df = _best(df, PREFILL_POINT + ["backend"])
    df = df[df.groupby(PREFILL_POINT)["backend"].transform("nunique") >= 2]
    if df.empty:
        return pd.DataFrame()
    out = relative_to_fastest(df, PREFILL_POINT)
    columns = PREFILL_POINT + ["backend", "time_us", "relative_time", "fastest", "tflops",
                               "commit"]
    return out[[c for c in columns if c in out.columns]].sort_values(
        PREFILL_POINT + ["relative_time"]).reset_index(drop=True)


def family_batch1(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """Batch 1 per paged-kernel family (:data:`FAMILIES`): the family's fastest paged time
    over its contiguous baseline (Triton: its own kernel on a contiguous cache; FlashInfer:
    the fastest contiguous kernel timed), per device, shape, context and block size, with the
    spread of the repeats: ``ratio_low`` = paged q20 / contiguous q80 and ``ratio_high`` =
    paged q80 / contiguous q20. ``paging`` says whether paging is slower beyond that noise
    (``slower``), faster beyond it (``faster``), or neither (``within noise``)."""
    df = kernel_rows(kernels)
    if df is None or "q20_us" not in df.columns:
        return pd.DataFrame()
    df = newest_run(df[df["batch"] == 1].dropna(subset=["q20_us", "q80_us"]),
                    ["device_label", "shape"])
    keys = ["device_label", "shape", "context", "commit"]
    out = []
    for family, (paged, contiguous) in FAMILIES.items():
        p = df[df["backend"].isin(paged)].dropna(subset=["block_size"])
        c = df[~df["paged"]] if contiguous is None else df[df["backend"].isin(contiguous)]
        if p.empty or c.empty:
            continue
        p = _best(p, keys + ["block_size"])[keys + ["block_size", "backend", "time_us",
                                                    "q20_us", "q80_us"]]
        c = _best(c, keys)[keys + ["backend", "time_us", "q20_us", "q80_us"]]
        pairs = p.merge(c, on=keys, suffixes=("_paged", "_contiguous"))
        pairs["family"] = family
        out.append(pairs)
    if not out:
        return pd.DataFrame()
    pairs = pd.concat(out, ignore_index=True)
    pairs["ratio"] = pairs["time_us_paged"] / pairs["time_us_contiguous"]
    pairs["ratio_low"] = pairs["q20_us_paged"] / pairs["q80_us_contiguous"]
    pairs["ratio_high"] = pairs["q80_us_paged"] / pairs["q20_us_contiguous"]
    pairs["paging"] = "within noise"
    pairs.loc[pairs["ratio_low"] > 1.0, "paging"] = "slower"
    pairs.loc[pairs["ratio_high"] < 1.0, "paging"] = "faster"
    pairs["block_size"] = pairs["block_size"].astype(int)
    return pairs.rename(columns={"backend_paged": "paged_backend",
                                 "backend_contiguous": "contiguous_backend"}).sort_values(
        ["device_label", "shape", "family", "context", "block_size"]).reset_index(drop=True)


def _best(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Fastest backend per key (over backends and CUDA-graph variants)."""
    idx = df.groupby(keys, dropna=False)["time_us"].idxmin()
    return df.loc[idx]


def fastest_pairs(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per ``keys``, run (:data:`RUN`) and paged block size (rows of ``kernel_rows``): the
    fastest paged backend beside the fastest contiguous one of the same run, and ``ratio``,
    paged time / contiguous time (keys where either side is missing are dropped)."""
    keys = keys + RUN
    paged = _best(df[df["paged"]].dropna(subset=["block_size"]), keys + ["block_size"])
    contig = _best(df[~df["paged"]], keys)
    pairs = paged[keys + ["block_size", "backend", "time_us"]].merge(
        contig[keys + ["backend", "time_us"]], on=keys, suffixes=("_paged", "_contiguous"))
    pairs["ratio"] = pairs["time_us_paged"] / pairs["time_us_contiguous"]
    return pairs


def paged_over_contiguous(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """The ``ratio`` of :func:`fastest_pairs` at the primary block size, indexed by ``keys``."""
    pairs = fastest_pairs(df, keys)
    return pairs[pairs["block_size"] == PRIMARY_BLOCK_SIZE].set_index(keys)["ratio"]


def batch1_ratio(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """Batch 1: fastest paged time / fastest contiguous time, per device, shape, context, block."""
    df = kernel_rows(kernels)
    keys = ["device_label", "shape", "context"]
    pairs = pd.DataFrame() if df is None else fastest_pairs(df[df["batch"] == 1], keys)
    if pairs.empty:
        return pd.DataFrame()
    pairs["block_size"] = pairs["block_size"].astype(int)
    pairs["context"] = pairs["context"].astype(int)
    return pairs.rename(columns={"backend_paged": "paged_backend",
                                 "backend_contiguous": "contiguous_backend"}) \
        .sort_values(keys + ["block_size"]).reset_index(drop=True)


def newest_run(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Each ``by`` group's rows of one commit, its newest
    (:func:`pagebench.results.commits.newest_first`): a table or claim that summarises over
    points then never blends an older commit's kernel with a newer one's."""
    keep = [g[g["commit"] == newest_first(g["commit"], measured_at(g))[0]]
            for _, g in df.groupby(by)]
    return pd.concat(keep) if keep else df.iloc[:0]


def at_swept_context(df: pd.DataFrame):
    """Each (device, shape)'s rows of one commit at the context where its batch size was
    swept: the newest commit (:func:`pagebench.results.commits.newest_first`) with a context
    of two or more batch sizes, at its context with the most. One commit, so that a table
    never shows an older commit's faster rows beside (or instead of) a newer one's."""
    for _, g in df.groupby(["device_label", "shape"]):
        for commit in newest_first(g["commit"], measured_at(g)):
            run = g[g["commit"] == commit]
            counts = run.groupby("context")["batch"].nunique()
            if counts.max() >= 2:
                yield run[run["context"] == counts.idxmax()]
                break


def primary_paged_backend(df: pd.DataFrame) -> str | None:
    """The paged backend that is fastest most often at block 16 (else at any block size)."""
    paged = df[df["paged"]]
    if paged.empty:
        return None
    at16 = paged[paged["block_size"] == PRIMARY_BLOCK_SIZE]
    paged = at16 if len(at16) else paged
    winners = _best(paged, ["device_label", "shape", "batch", "context", "block_size"])
    return str(winners["backend"].value_counts().idxmax())


def with_dtype(labels: pd.Series, rows: pd.DataFrame) -> pd.Series:
    """``labels`` of ``rows``, each followed by its row's ``dtype`` where the rows hold more
    than one (one commit's sweeps in two dtypes are two series, never one best of both)."""
    return labels + " " + rows["dtype"].astype(str) if rows["dtype"].nunique() > 1 else labels


def throughput(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """Decode throughput (sequences x steps per second) versus batch size, per backend and block.

    tokens_per_s = batch / step time: each sequence decodes one token per step.
    """
    df = kernel_rows(kernels)
    if df is None:
        return pd.DataFrame()
    out = []
    for g in at_swept_context(df):
        g = g.copy()
        block = " bs=" + g["block_size"].fillna(0).astype(int).astype(str)
        interpreted = pd.Series("", index=g.index).where(g["timed_as"] != INTERPRETED,
                                                          " (interpreted)")
        g["series"] = with_dtype(g["backend"].astype(str) + block.where(g["paged"], "")
                                 + interpreted, g)
        g = _best(g, ["series", "batch"])
        g["tokens_per_s"] = g["batch"] / g["time_us"] * 1e6
        g["primary"] = ~g["paged"] | (g["backend"] == primary_paged_backend(g))
        out.append(g)
    if not out:
        return pd.DataFrame()
    return pd.concat(out, ignore_index=True).sort_values(["device_label", "shape", "series",
                                                          "batch"]).reset_index(drop=True)


def bandwidth(kernels: pd.DataFrame | None) -> pd.DataFrame:
    """Achieved GB/s (K/V bytes read / time) against the copy ceiling, block 16 and contiguous:
    the fastest row per ``series`` (backend) and batch."""
    df = kernel_rows(kernels)
    if df is None or "gbps" not in df.columns:
        return pd.DataFrame()
    df = df.dropna(subset=["gbps"])
    df = df[(~df["paged"]) | (df["block_size"] == PRIMARY_BLOCK_SIZE)]
    rows = [_best(g.assign(series=with_dtype(g["backend"].astype(str), g)), ["series", "batch"])
            for g in at_swept_context(df)]
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True)


def gpu_labels(kernels) -> set[str]:
    """Device labels of kernel rows measured on a GPU."""
    df = kernel_rows(kernels)
    return set() if df is None else set(df.loc[df["gpu"], "device_label"])


def judged_labels(labels, kernels) -> set[str]:
    """Which devices a kernel claim is judged on: the GPUs when any GPU measured it (the
    article's claims are about GPU kernels), else every device."""
    labels = set(labels)
    gpus = labels & gpu_labels(kernels)
    return gpus or labels


def kernel_cost_per_block(kernels) -> pd.DataFrame:
    """Median relative paged kernel time per block size, per device (1.0 = the best block).

    Each (device, shape, batch, context) case measured at more than one block size gives every
    block size's fastest paged time relative to the case's best; a block size's kernel cost is
    the median of its relative times over those cases, of one commit per device (the newest
    with such cases).
    """
    df = kernel_rows(kernels)
    if df is None:
        return pd.DataFrame()
    keys = ["device_label", "shape", "batch", "context", *RUN]
    best = _best(df[df["paged"]].dropna(subset=["block_size"]), keys + ["block_size"])
    best = best[keys + ["block_size", "backend", "time_us"]].copy()
    best["relative_time"] = best["time_us"] / best.groupby(keys)["time_us"].transform("min")
    rel = best[best.groupby(keys)["block_size"].transform("nunique") > 1]
    if rel.empty:
        return rel.reset_index(drop=True)
    rel = newest_run(rel, ["device_label"])
    out = rel.groupby(["device_label", "commit", "block_size"], as_index=False)[
        "relative_time"].median()
    out["gpu"] = out["device_label"].isin(set(df.loc[df["gpu"], "device_label"]))
    out["block_size"] = out["block_size"].astype(int)
    return out


def block_cost_per_kernel(kernels) -> pd.DataFrame:
    """:func:`kernel_cost_per_block` per paged kernel (``kernel``: triton, flashinfer,
    flashinfer-tc, ...), so a block size's cost is judged on every backend that takes it:
    each case's time at a block size over that kernel's best block there, the median over the
    cases (``relative_time``) and their range (``relative_low``, ``relative_high``), of one
    commit per device (the newest with such cases)."""
    df = kernel_rows(kernels)
    if df is None:
        return pd.DataFrame()
    keys = ["device_label", "kernel", "shape", "batch", "context", *RUN]
    paged = df[df["paged"]].dropna(subset=["block_size", "kernel"])
    best = _best(paged, keys + ["block_size"])[keys + ["block_size", "time_us"]].copy()
    best["relative_time"] = best["time_us"] / best.groupby(keys)["time_us"].transform("min")
    rel = best[best.groupby(keys)["block_size"].transform("nunique") > 1]
    if rel.empty:
        return pd.DataFrame()
    rel = newest_run(rel, ["device_label"])
    out = rel.groupby(["device_label", "commit", "kernel", "block_size"])["relative_time"].agg(
        relative_time="median", relative_low="min", relative_high="max",
        cases="size").reset_index()
    out["block_size"] = out["block_size"].astype(int)
    return out


# the kernel tables the report shows, the claims judge and the report saves: name -> function
# of dataset "kernels"
KERNEL_TABLES = {"kernels_timed": kernel_rows, "kernels_batch1_ratio": batch1_ratio,
                 "kernels_throughput": throughput, "kernels_bandwidth": bandwidth,
                 "kernels_block_cost": kernel_cost_per_block,
                 "kernels_vs_fastest": versus_fastest, "kernels_batch1_family": family_batch1,
                 "kernels_block_cost_kernel": block_cost_per_kernel}


def table(results, name: str, compute=None) -> pd.DataFrame:
    """The derived table ``name`` of ``results``, computed once by ``compute(results)`` (default:
    the kernel table of :data:`KERNEL_TABLES`) and kept in ``results.derived`` (empty, with a
    warning naming it, where the data defeats it)."""
    if name not in results.derived:
        compute = compute or (lambda r: KERNEL_TABLES[name](r.get("kernels")))
        try:
            frame = compute(results)
            results.add_derived(name, pd.DataFrame() if frame is None else frame)
        except Exception as e:  # noqa: BLE001 -- odd data: warn, keep the rest
            results.warn(f"{name}: could not be derived ({type(e).__name__}: {e})")
            results.add_derived(name, pd.DataFrame())
    return results.derived[name]
