"""Matplotlib figures embedded as PNG data URIs: the page needs no JavaScript and no network.

Every function takes tidy DataFrames and returns a :class:`Plot` (or ``None`` when the frame
holds nothing to draw). Labels come from data; matplotlib draws them as text, never as markup.
"""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pagebench.config import ceil_div  # noqa: E402

STYLE = {
    "figure.dpi": 100, "savefig.dpi": 110, "font.size": 9, "axes.grid": True,
    "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "legend.fontsize": 8, "legend.frameon": False,
}


def label(value) -> str:
    """Text from data as a matplotlib label: '$' escaped so it never starts mathtext."""
    return str(value).replace("$", r"\$")


def styled(fn):
    """Draw under the report's style without changing matplotlib's global settings."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with plt.rc_context(STYLE):
            return fn(*args, **kwargs)
    return wrapper


@dataclass(frozen=True, slots=True)
class Plot:
    title: str
    data_uri: str
    alt: str


def log2_axis(ax, values, axis: str = "x") -> None:
    """Log-2 scale labelled with the measured values as plain integers (1, 16, 4096...)."""
    ticks = sorted({int(v) for v in values if v == v and v > 0})
    if axis == "x":
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    else:
        ax.set_yscale("log", base=2)
        ax.set_yticks(ticks, [f"{t:,}" for t in ticks])


def to_plot(fig, title: str, alt: str, tight: bool = True) -> Plot:
    buf = io.BytesIO()
    if tight:
        fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return Plot(title, uri, alt)


def _empty(df) -> bool:
    return df is None or len(df) == 0


@styled
def utilisation_bars(static: pd.DataFrame) -> Plot | None:
    """Utilisation per allocator (paged: per block size) on one workload."""
    if _empty(static):
        return None
    labels = [label(a) if pd.isna(b) else f"paged {int(b)}" for a, b in
              zip(static["allocator"], static["block_size"])]
    util = static["utilisation"].astype(float) * 100
    colors = ["#c0504d" if lab.startswith(("naive", "pow2")) else "#4f81bd" for lab in labels]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(range(len(labels)), util, color=colors)
    for i, u in enumerate(util):
        ax.text(i, u + 1, f"{u:.1f}", ha="center", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel("KV slots holding tokens (%)")
    ax.set_ylim(0, 110)
    return to_plot(fig, "Utilisation per allocator and block size",
                   "bar chart of KV utilisation per allocator")


@styled
def max_len_lines(sweep: pd.DataFrame) -> Plot | None:
    """Utilisation versus max_model_len for each allocator (paged at each block size)."""
    if _empty(sweep):
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, g in sweep.groupby("label", sort=False):
        g = g.sort_values("max_len")
        ax.plot(g["max_len"], g["utilisation"].astype(float) * 100, marker="o", label=label(name))
    log2_axis(ax, sweep["max_len"])
    ax.set_xlabel("max_model_len (tokens)")
    ax.set_ylabel("utilisation (%)")
    ax.set_ylim(0, 105)
    ax.legend(ncol=3)
    return to_plot(fig, "Utilisation versus max_model_len",
                   "line chart of utilisation versus max model length")


# timeline columns (token slots) -> legend label and colour; they sum to the budget
BREAKDOWN = {"token_state": ("token states", "#4f81bd"),
             "reserved_unused": ("reserved, not yet used", "#f79646"),
             "internal_frag": ("internal fragmentation", "#9bbb59"),
             "external_frag": ("external fragmentation", "#c0504d"),
             "free": ("free", "#d9d9d9")}


@styled
def breakdown_areas(timeline: pd.DataFrame) -> Plot | None:
    """Memory breakdown over time, one panel per run (stacked shares of the budget).

    ``timeline``: one row per (label, step) with the slot counts of :data:`BREAKDOWN` and
    ``budget_tokens``.
    """
    if _empty(timeline) or "budget_tokens" not in timeline.columns:
        return None
    cats = [c for c in BREAKDOWN if c in timeline.columns]
    if not cats:
        return None
    panels = list(dict.fromkeys(timeline["label"]))
    cols = min(4, len(panels))
    rows = ceil_div(len(panels), cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(7.0, 3.1 * cols), 2.5 * rows + 0.6),
                             squeeze=False,
                             sharey=True)
    for ax, name in zip(axes.flat, panels):
        g = timeline[timeline["label"] == name].sort_values("step")
        budget = g["budget_tokens"].astype(float)
        ax.stackplot(g["step"], [g[c].astype(float) / budget * 100 for c in cats],
                     labels=[BREAKDOWN[c][0] for c in cats],
                     colors=[BREAKDOWN[c][1] for c in cats])
        ax.set_title(label(name), fontsize=9)
        ax.set_ylim(0, 100)
        ax.set_xlabel("step")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("% of KV budget")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 5), fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return to_plot(fig, "Memory breakdown over time", "stacked area charts of KV memory use "
                   "over time per allocator", tight=False)


@styled
def grouped_bars(df: pd.DataFrame, category: str, series: list[str], title: str, ylabel: str,
                 alt: str, logy: bool = False) -> Plot | None:
    """One group of bars per row of ``df`` (labelled by ``category``), one bar per column."""
    if _empty(df):
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3))
    width = 0.8 / max(1, len(series))
    for i, col in enumerate(series):
        xs = [j + i * width for j in range(len(df))]
        ax.bar(xs, df[col].astype(float), width=width, label=label(col))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(df))],
                  [label(v) for v in df[category]], rotation=20 if len(df) > 3 else 0,
                  ha="right" if len(df) > 3 else "center", fontsize=7 if len(df) > 3 else 8)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.legend()
    return to_plot(fig, title, alt)


@styled
def lines(df: pd.DataFrame, x: str, y: str, hue: str, title: str, xlabel: str, ylabel: str,
          alt: str, *, logx: bool = False, logy: bool = False, hlines: dict | None = None,
          panel: str | None = None, spread: tuple[str, str] | None = None) -> Plot | None:
    """Line per ``hue`` value of ``y`` against ``x``; one panel per ``panel`` value if given;
    ``spread`` (low, high columns, e.g. min and max over repeats) draws error bars where
    those columns have values."""
    if _empty(df):
        return None
    panels = list(dict.fromkeys(df[panel])) if panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(min(4.2 * len(panels), 13), 3.2),
                             squeeze=False)
    for ax, p in zip(axes[0], panels):
        part = df if p is None else df[df[panel] == p]
        for key, g in part.groupby(hue, sort=True):
            g = g.sort_values(x)
            line, = ax.plot(g[x], g[y].astype(float), marker="o", markersize=3, label=label(key))
            if spread and set(spread) <= set(g.columns) and g[list(spread)].notna().all().all():
                mid = g[y].astype(float)
                err = [(mid - g[spread[0]].astype(float)).clip(lower=0),
                       (g[spread[1]].astype(float) - mid).clip(lower=0)]
                ax.errorbar(g[x], mid, yerr=err, fmt="none", ecolor=line.get_color(),
                            capsize=2, linewidth=0.8)
        for name, value in (hlines or {}).items():
            ax.axhline(value, color="k", linestyle="--", linewidth=1)
            ax.annotate(label(name), (0.01, value), xycoords=("axes fraction", "data"),
                        fontsize=7, va="bottom")
        if logx:
            log2_axis(ax, part[x])
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if p is not None:
            ax.set_title(label(p), fontsize=9)
        ax.legend(title=label(hue), fontsize=7, title_fontsize=7)
    return to_plot(fig, title, alt)


@styled
def twin_lines(df: pd.DataFrame, x: str, left: str, right: str, title: str, xlabel: str,
               alt: str, hue: str | None = None, logx: bool = False) -> Plot | None:
    """``left`` (solid) and ``right`` (dashed, second axis) against ``x``."""
    if _empty(df):
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax2 = ax.twinx()
    groups = df.groupby(hue, sort=True) if hue else [(None, df)]
    for i, (key, g) in enumerate(groups):
        g = g.sort_values(x)
        color = f"C{i}"
        suffix = "" if key is None else f" ({key})"
        ax.plot(g[x], g[left].astype(float), marker="o", color=color, label=label(left + suffix))
        ax2.plot(g[x], g[right].astype(float), marker="s", linestyle="--", color=color,
                 label=label(right + suffix))
    if logx:
        log2_axis(ax, df[x])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(label(left))
    ax2.set_ylabel(label(right))
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7)
    return to_plot(fig, title, alt)
