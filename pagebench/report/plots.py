"""Matplotlib figures embedded as PNG data URIs: the page needs no JavaScript and no network.

Every function takes a tidy DataFrame with rows and returns a :class:`Plot` (``None`` where
those rows hold nothing to draw). Labels come from data; matplotlib draws them as text, never
as markup. Axis labels are words with units, given by the caller; each :class:`Plot` records
the labels it drew (``axes``) so the page, and the browser test, can read them.
"""

from __future__ import annotations

import base64
import functools
import io
import math
import textwrap
from dataclasses import dataclass

import matplotlib
import matplotlib.patches
import matplotlib.ticker

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd

from pagebench.config import ceil_div

STYLE = {
    "figure.dpi": 100, "savefig.dpi": 110, "font.size": 9, "axes.grid": True,
    "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "legend.fontsize": 8, "legend.frameon": False,
}


# one colour per allocator in every plot (paged: one blue, darker for larger blocks)
ALLOCATOR_COLORS = {"naive": "#c0504d", "pow2": "#f79646", "oracle": "#9bbb59",
                    "paged": "#4f81bd"}
PAGED_SHADES = ("#9dc3e6", "#6fa8dc", "#4f81bd", "#2e5c8a", "#1c3d5e")


def allocator_color(name: str) -> str:
    """The colour of an allocator or run label (``naive``, ``paged 16``, ``paged-128``):
    :data:`ALLOCATOR_COLORS`, paged in a shade of its blue by block size."""
    text = str(name).lower()
    kind = next((k for k in ALLOCATOR_COLORS if text.startswith(k)), None)
    if kind != "paged":
        return ALLOCATOR_COLORS.get(kind, "#7f7f7f")
    digits = "".join(c for c in text if c.isdigit())
    if not digits:
        return ALLOCATOR_COLORS["paged"]
    shade = min(len(PAGED_SHADES) - 1, int(digits).bit_length() // 2)
    return PAGED_SHADES[shade]


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
    # per drawn axes: {"x": x label, "y": y label, "legend": [title and entries], "title": ...};
    # "x" is None on an axes whose x axis is not drawn (the right-hand axes of a twin plot)
    axes: tuple = ()
    small: bool = False  # laid out two to a row
    # what a reader could not read: tick labels drawn over each other, text cut off at the
    # figure's edge (:func:`label_problems`); empty on every figure the report draws
    label_problems: tuple = ()


def visible_ticklabels(axis) -> list:
    """The tick labels ``axis`` draws: visible, with text, their tick inside the view."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    return [t.label1 for t in axis.get_major_ticks()
            if t.label1.get_visible() and t.label1.get_text()
            and lo - span <= t.get_loc() <= hi + span]


def label_problems(fig, slack: float = 1.0) -> tuple[str, ...]:
    """Tick labels of one axis whose boxes overlap (by more than ``slack`` pixels), and axis
    or tick labels reaching past the figure's edge: PNGs cannot be checked in the browser, so
    the boxes matplotlib laid out are checked here, where they are known."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    problems = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts = [ax.xaxis.label, ax.yaxis.label]
        for axis in (ax.xaxis, ax.yaxis):
            labels = visible_ticklabels(axis) if axis.get_visible() else []
            texts += labels
            boxes = [(t.get_text(), t.get_window_extent(renderer).expanded(1, 1)) for t in labels]
            for i, (a, box_a) in enumerate(boxes):
                for b, box_b in boxes[i + 1:]:
                    w = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
                    h = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
                    if w > slack and h > slack:
                        problems.append(f"tick labels overlap: {a!r} and {b!r}")
        for t in texts:
            if not (t.get_visible() and t.get_text()):
                continue
            box = t.get_window_extent(renderer)
            if (box.x0 < edge.x0 - slack or box.x1 > edge.x1 + slack
                    or box.y0 < edge.y0 - slack or box.y1 > edge.y1 + slack):
                problems.append(f"cut off at the figure's edge: {t.get_text()!r}")
    return tuple(problems)


def axes_labels(fig) -> tuple:
    """The labels each visible axes of ``fig`` draws; an axes sharing x or y with one that is
    labelled (panels in a row or column) counts as labelled."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        x = ax.get_xlabel() or next((o.get_xlabel() for o in
                                     ax.get_shared_x_axes().get_siblings(ax)
                                     if o.get_xlabel()), "")
        y = ax.get_ylabel() or next((o.get_ylabel() for o in
                                     ax.get_shared_y_axes().get_siblings(ax)
                                     if o.get_ylabel()), "")
        legend = ax.get_legend()
        entries = [] if legend is None else \
            [legend.get_title().get_text()] + [t.get_text() for t in legend.get_texts()]
        x, y = x.replace("\n", " "), y.replace("\n", " ")  # a wrapped label: the same words
        out.append({"x": x if ax.xaxis.get_visible() else None, "y": y,
                    "legend": [e for e in entries if e], "title": ax.get_title()})
    for legend in fig.legends:
        out.append({"x": None, "y": None, "title": "",
                    "legend": [t.get_text() for t in legend.get_texts() if t.get_text()]})
    return tuple(out)


def small_png(png: bytes, colors: int = 96) -> bytes:
    """The PNG with a palette of ``colors``: charts use few colours, and the page carries
    dozens of them inline (about a quarter of the size, no visible change). The report's own
    colours (:func:`fixed_colors`) keep their exact value: a median cut would otherwise merge
    a colour covering few pixels into a neighbour, and one allocator or memory category would
    show in another shade on one plot than on the next."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    quantized = image.quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    present = {rgb for _, rgb in image.getcolors(maxcolors=1 << 24)}
    palette = quantized.getpalette()[:3 * colors]
    entries = [tuple(palette[i:i + 3]) for i in range(0, len(palette), 3)]
    for rgb in fixed_colors() & present:
        nearest = min(range(len(entries)),
                      key=lambda i: sum((a - b) ** 2 for a, b in zip(entries[i], rgb)))
        entries[nearest] = rgb
    quantized.putpalette([c for rgb in entries for c in rgb])
    out = io.BytesIO()
    quantized.save(out, "PNG", optimize=True)
    return out.getvalue()


@functools.cache
def fixed_colors() -> frozenset:
    """The RGB of every colour the report names: allocators, memory categories, matplotlib's
    cycle (C0-C9)."""
    from matplotlib.colors import to_rgb

    names = [*ALLOCATOR_COLORS.values(), *PAGED_SHADES, *(c for _, c in BREAKDOWN.values()),
             *(f"C{i}" for i in range(10))]
    return frozenset(tuple(round(255 * v) for v in to_rgb(n)) for n in names)


def wrapped(text: str, width: int = 42) -> str:
    """A panel title on lines of at most ``width`` characters, broken at its " · " separators
    where it can be, so neighbouring panels' titles never meet."""
    lines = []
    for part in label(text).split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.extend(textwrap.wrap(part, width) or [""])
    return "\n".join(lines) or " "


def log2_axis(ax, values) -> None:
    """Log-2 x scale labelled with the measured values as plain integers (1, 16, 4096...)."""
    ticks = sorted({int(v) for v in values if v == v and v > 0})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def plain_log_y(ax) -> None:
    """Log-10 y scale ticked at 1, 2 and 5 per decade where the axes has room for them (else
    at each decade), labelled as plain numbers (200, 5000). Call it after plotting."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    decades = max(1.0, math.log10(hi / lo)) if lo > 0 and hi > lo else 1.0
    # labels the height holds (before a legend below the panels takes its share)
    room = ax.get_position().height * ax.figure.get_figheight() * 2.5
    subs = (1.0, 2.0, 5.0) if 3 * decades <= room else (1.0,)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=subs, numticks=max(3, int(room))))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def fit_ylabels(fig, chars_per_inch: float = 11.0) -> None:
    """Wrap each y label onto as many lines as its axes' height needs, so none runs past the
    figure's edge (matplotlib never wraps a label by itself)."""
    for ax in fig.axes:
        text = ax.get_ylabel()
        room = int(ax.get_position().height * fig.get_figheight() * chars_per_inch)
        if text and "\n" not in text and len(text) > max(room, 12):
            ax.set_ylabel("\n".join(textwrap.wrap(text, max(room, 12))))


def to_plot(fig, title: str, alt: str, tight: bool = True, small: bool = False) -> Plot:
    buf = io.BytesIO()
    if tight:  # a figure laid out by its caller fitted its labels first
        fit_ylabels(fig)
        fig.tight_layout()
    labels = axes_labels(fig)
    problems = label_problems(fig)
    fig.savefig(buf, format="png")
    plt.close(fig)
    uri = "data:image/png;base64," + base64.b64encode(small_png(buf.getvalue())).decode("ascii")
    drawn = "; ".join(f"x: {a['x']}, y: {a['y']}" for a in labels if a["y"])
    return Plot(title, uri, f"{alt} ({drawn})" if drawn else alt, labels, small, problems)


def panel_grid(n: int, max_cols: int, size, **kwargs):
    """(figure, the first ``n`` axes) of a grid at most ``max_cols`` wide, the rest hidden;
    ``size(cols, rows)`` gives the figure's size."""
    cols = min(max_cols, n)
    rows = ceil_div(n, cols)
    fig, axes = plt.subplots(rows, cols, figsize=size(cols, rows), squeeze=False, **kwargs)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


@styled
def utilisation_bars(static: pd.DataFrame) -> Plot:
    """Utilisation per allocator (paged: per block size) on one workload."""
    labels = [label(a) if pd.isna(b) else f"paged {int(b)}" for a, b in
              zip(static["allocator"], static["block_size"])]
    util = static["utilisation"].astype(float) * 100
    colors = [allocator_color(lab) for lab in labels]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.5 * len(labels) + 1.5), 3.2))
    ax.bar(range(len(labels)), util, color=colors)
    for i, u in enumerate(util):
        ax.text(i, u + 1, f"{u:.1f}", ha="center", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_xlabel("allocator (paged: block size in tokens)")
    ax.set_ylabel("KV slots holding tokens (%)")
    ax.set_ylim(0, 110)
    return to_plot(fig, "Utilisation per allocator and block size",
                   "bar chart of KV utilisation per allocator")


@styled
def max_len_lines(sweep: pd.DataFrame) -> Plot:
    """Utilisation versus max_model_len for each allocator (paged at each block size)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, g in sweep.groupby("label", sort=False):
        g = g.sort_values("max_len")
        ax.plot(g["max_len"], g["utilisation"].astype(float) * 100, marker="o", label=label(name),
                color=allocator_color(name))
    log2_axis(ax, sweep["max_len"])
    ax.set_xlabel("max_model_len (tokens)")
    ax.set_ylabel("KV slots holding tokens (%)")
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
    if "budget_tokens" not in timeline.columns:  # optional in the schema
        return None
    cats = [c for c in BREAKDOWN if c in timeline.columns]
    if not cats:
        return None
    panels = list(dict.fromkeys(timeline["label"]))
    fig, axes = panel_grid(len(panels), 4, lambda c, r: (max(7.0, 3.1 * c), 2.5 * r + 0.6),
                           sharey=True)
    for ax, name in zip(axes.flat, panels):
        g = timeline[timeline["label"] == name].sort_values("step")
        budget = g["budget_tokens"].astype(float)
        ax.stackplot(g["step"], [g[c].astype(float) / budget * 100 for c in cats],
                     labels=[BREAKDOWN[c][0] for c in cats],
                     colors=[BREAKDOWN[c][1] for c in cats])
        ax.set_title(wrapped(name, 36), fontsize=9)
        ax.set_ylim(0, 100)
        ax.set_xlabel("simulation step")
        # steps run to hundreds of thousands: few ticks, so narrow panels never crowd them
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=4))
    for row in axes:
        row[0].set_ylabel("share of the KV budget (%)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 5), fontsize=7)
    fit_ylabels(fig)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return to_plot(fig, "Memory breakdown over time", "stacked area charts of KV memory use "
                   "over time per allocator", tight=False)


@styled
def bars(df: pd.DataFrame, category: str, series: dict[str, str], title: str, xlabel: str,
         alt: str, *, ylabel: str | None = None, logy: bool = False,
         hue: str | None = None) -> Plot | None:
    """One group of bars per row of ``df`` (labelled by ``category``), one bar per column of
    ``series`` (column -> legend entry). With ``ylabel`` every series shares that axis; without
    it each series has a panel of its own, labelled with its entry: quantities in different
    units (tokens, blocks) never share an axis. More than :data:`MANY_BARS` rows, or more than
    three with long labels, lie on their side, one row a line, so their labels never meet. ``hue`` (a column of ``df``, one series
    only): one colour per value, with a legend."""
    if df.empty:  # e.g. no run that finished
        return None
    longest = max(len(line) for v in df[category] for line in label(v).split("\n"))
    if len(df) > MANY_BARS or (len(df) > 3 and longest > LONG_LABEL):
        return side_bars(df, category, series, title, xlabel, alt, ylabel=ylabel, logy=logy,
                         hue=hue)
    groups = [series] if ylabel else [{col: name} for col, name in series.items()]
    fig, axes = plt.subplots(1, len(groups), squeeze=False,
                             figsize=(6.5, 3) if ylabel else (3.4 * len(groups) + 0.6, 3))
    many = len(df) > 3
    for ax, group in zip(axes[0], groups):
        width = 0.8 / len(group)
        for i, (col, name) in enumerate(group.items()):
            ax.bar([j + i * width for j in range(len(df))], df[col].astype(float), width=width,
                   label=label(name), color=hue_colors(df, hue) if len(group) == 1 else None)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(df))],
                      [label(v) for v in df[category]], rotation=20 if many else 0,
                      ha="right" if many else "center", fontsize=7 if many else 8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel or name)
        if logy:
            plain_log_y(ax)
    if ylabel and len(series) > 1:
        axes[0][0].legend()
    hue_legend(axes[0][0], df, hue, len(series))
    return to_plot(fig, title, alt)


MANY_BARS = 8  # more bars than this lie on their side
LONG_LABEL = 16  # so do more than three whose labels have a line longer than this


def hue_colors(df: pd.DataFrame, hue: str | None):
    if hue is None:
        return None
    values = list(dict.fromkeys(df[hue].astype(str)))
    return [f"C{values.index(v) % 10}" for v in df[hue].astype(str)]


def hue_legend(ax, df: pd.DataFrame, hue: str | None, num_series: int) -> None:
    if hue is None or num_series != 1:
        return
    values = list(dict.fromkeys(df[hue].astype(str)))
    handles = [matplotlib.patches.Patch(color=f"C{i % 10}", label=label(v))
               for i, v in enumerate(values)]
    ax.legend(handles=handles, fontsize=7, title=label(hue), title_fontsize=7)


def side_bars(df, category, series, title, xlabel, alt, *, ylabel, logy, hue) -> Plot:
    """:func:`bars` on their side: a line per row, its label on one line (` · ` between the
    parts of a multi-line label), the values along x."""
    groups = [series] if ylabel else [{col: name} for col, name in series.items()]
    names = [label(v).replace("\n", " · ") for v in df[category]]
    height = 0.3 * len(df) * (len(groups[0]) if ylabel else 1) + 1.2
    fig, axes = plt.subplots(1, len(groups), squeeze=False, sharey=True,
                             figsize=(7.5 if ylabel else 3.0 * len(groups) + 4, height))
    for ax, group in zip(axes[0], groups):
        width = 0.8 / len(group)
        for i, (col, name) in enumerate(group.items()):
            ax.barh([j + i * width for j in range(len(df))], df[col].astype(float),
                    height=width, label=label(name),
                    color=hue_colors(df, hue) if len(group) == 1 else None)
        ax.set_yticks([j + 0.4 - width / 2 for j in range(len(df))], names, fontsize=7)
        ax.invert_yaxis()  # first row on top, as in a table
        ax.set_ylabel(xlabel)
        ax.set_xlabel(ylabel or name)
        if logy:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
                lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    if ylabel and len(series) > 1:
        axes[0][0].legend()
    hue_legend(axes[0][0], df, hue, len(series))
    return to_plot(fig, title, alt)


@styled
def lines(df: pd.DataFrame, x: str, y: str, hue: str, title: str, xlabel: str, ylabel: str,
          alt: str, *, legend_title: str, logx: bool = False, logy: bool = False,
          hlines: dict | None = None, panel: str | None = None,
          spread: tuple[str, str] | None = None) -> Plot:
    """Line per ``hue`` value of ``y`` against ``x`` (legend titled ``legend_title``); one
    panel per ``panel`` value if given, at most three to a row. ``spread`` (low, high columns,
    e.g. min and max over repeats) draws error bars where those columns have values."""
    panels = list(dict.fromkeys(df[panel])) if panel else [None]
    fig, axes = panel_grid(len(panels), 3, lambda c, r: (max(4.4 * c, 6.5), 3.4 * r))
    for ax, p in zip(axes.flat, panels):
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
            plain_log_y(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if p is not None:
            ax.set_title(wrapped(p), fontsize=9)
        ax.legend(title=label(legend_title), fontsize=7, title_fontsize=7)
    return to_plot(fig, title, alt)


@styled
def twin_lines(df: pd.DataFrame, x: str, left: str, right: str, title: str, xlabel: str,
               alt: str, *, left_label: str, right_label: str, hue: str | None = None,
               logx: bool = False) -> Plot:
    """``left`` (solid, axis ``left_label``) and ``right`` (dashed, second axis
    ``right_label``) against ``x``; one colour per ``hue`` value."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax2 = ax.twinx()
    groups = df.groupby(hue, sort=True) if hue else [(None, df)]
    for i, (key, g) in enumerate(groups):
        g = g.sort_values(x)
        color = f"C{i}"
        suffix = "" if key is None else f", {key}"
        ax.plot(g[x], g[left].astype(float), marker="o", color=color,
                label=label(left_label + suffix))
        ax2.plot(g[x], g[right].astype(float), marker="s", linestyle="--", color=color,
                 label=label(right_label + suffix))
    if logx:
        log2_axis(ax, df[x])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(label(left_label))
    ax2.set_ylabel(label(right_label))
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7)
    return to_plot(fig, title, alt)


@styled
def block_size_scores(table: pd.DataFrame) -> Plot:
    """The recommendation's table (dataset ``recommendation``): utilisation, relative speed and
    their product per block size on one axis from 0 (1.0 = the best block size's speed), the
    speed's and the score's low..high as error bars."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    t = table.sort_values("block_size")
    x = t["block_size"].astype(int)
    ax.plot(x, t["utilisation"].astype(float), marker="o", label="KV utilisation on the workload")
    for col, name, marker in (("speed", "decode speed / best block size's", "s"),
                              ("score", "score = utilisation × speed", "D")):
        mid = t[col].astype(float)
        if mid.isna().all():
            continue
        line, = ax.plot(x, mid, marker=marker, label=name)
        low, high = t[f"{col}_low"].astype(float), t[f"{col}_high"].astype(float)
        ax.errorbar(x, mid, yerr=[(mid - low).clip(lower=0), (high - mid).clip(lower=0)],
                    fmt="none", ecolor=line.get_color(), capsize=3, linewidth=0.8)
    log2_axis(ax, x)
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("fraction (1.0 = best / all slots used)")
    ax.legend(fontsize=7, loc="lower right")
    return to_plot(fig, "What a block size buys (utilisation) and costs (speed), from 0",
                   "line chart of utilisation, relative speed and their product per block size")


@styled
def hit_rate_vs_budget(prefix: pd.DataFrame) -> Plot | None:
    """Prefix-cache hit rate (%) per trace against the KV budget in multiples of the article's;
    a trace's hit rate with unlimited memory as a dashed line."""
    finite = prefix[~prefix["unlimited"].astype(bool)]
    if finite.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    for i, (name, g) in enumerate(finite.groupby("trace", sort=False)):
        g = g.sort_values("budget_vs_article")
        ax.plot(g["budget_vs_article"], 100 * g["prefix_cache_hit_rate"], marker="o",
                color=f"C{i}", label=label(name))
        for rate in prefix[(prefix["trace"] == name) & prefix["unlimited"].astype(bool)][
                "prefix_cache_hit_rate"]:
            ax.axhline(100 * rate, color=f"C{i}", linestyle="--", linewidth=1)
            ax.annotate(f"unlimited memory: {100 * rate:.1f}%", (0.02, 100 * rate),
                        xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
    ticks = sorted(finite["budget_vs_article"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("KV budget (multiples of the article's 12.4 GB = 1,009,104 slots)")
    ax.set_ylabel("prompt tokens from cache (%)")
    ax.legend(fontsize=7)
    return to_plot(fig, "Prefix-cache hit rate versus KV budget (paged, block 16)",
                   "line chart of the prefix-cache hit rate against the KV budget")


# asv units -> (scale, unit shown): times are shown in the unit that suits their size
TIME_UNITS = ((1e-6, 1e6, "µs"), (1e-3, 1e3, "ms"), (float("inf"), 1.0, "s"))


def history_axis_label(benchmark: str, unit: str, values: pd.Series) -> tuple[float, str]:
    """(factor, y label in words with unit) for one asv benchmark's values."""
    method = str(benchmark).rsplit(".", 1)[-1]
    if unit == "seconds" or method.startswith("time_"):
        median = float(values.abs().median()) if len(values) else 0.0
        factor, shown = next((f, u) for limit, f, u in TIME_UNITS if median < limit * 1e3)
        return factor, f"time per call ({shown})"
    words = method.removeprefix("track_").replace("_", " ")
    for tail, noun in ((" tokens per s", " throughput"), (" per s", " rate"),
                       (" ms", " time"), (" us", " time"), (" pct", "")):
        if (" " + words).endswith(tail):
            words = (" " + words)[:-len(tail)] + noun
            break
    return 1.0, f"{words.strip()} ({unit})" if unit else words.strip()


@styled
def history(df: pd.DataFrame, benchmark: str, alt: str) -> Plot:
    """One asv benchmark over commits: a panel per machine (commits in date order), a line per
    parameter set (one colour per set across panels, one legend below). ``df``: rows of
    :func:`pagebench.results.history.asv_rows` for this benchmark."""
    unit = str(df["unit"].iloc[0])
    factor, ylabel = history_axis_label(benchmark, unit, df["value"].astype(float))
    machines = list(dict.fromkeys(df["machine"]))
    params = sorted(df["params"].astype(str).unique())
    color = {p: f"C{i % 10}" for i, p in enumerate(params)}
    marker = {p: "os^v"[i // 10 % 4] for i, p in enumerate(params)}
    legend_cols = 1 if len(params) <= 3 else 2 if len(params) <= 12 else 3
    legend_rows = ceil_div(len(params), legend_cols)
    height = 2.5 + 0.13 * legend_rows
    fig, axes = plt.subplots(1, len(machines), figsize=(5.6 * len(machines), height),
                             squeeze=False)
    handles = {}
    for ax, machine in zip(axes[0], machines):
        part = df[df["machine"] == machine]
        commits = list(dict.fromkeys(part.sort_values("date")["commit"].astype(str)))
        position = {c: i for i, c in enumerate(commits)}
        for p, g in part.groupby(part["params"].astype(str), sort=True):
            g = g.assign(pos=g["commit"].astype(str).map(position)).sort_values("pos")
            (line,) = ax.plot(g["pos"], g["value"].astype(float) * factor, marker=marker[p],
                              markersize=3, color=color[p])
            handles[p] = line
        values = part["value"].astype(float) * factor
        if len(values) and values.min() > 0 and values.max() / values.min() > 20:
            plain_log_y(ax)
        ax.set_xticks(range(len(commits)), [c[:7] for c in commits], rotation=30, ha="right",
                      fontsize=7)
        ax.set_xlim(-0.5, len(commits) - 0.5)
        ax.set_xlabel("commit (oldest to newest)")
        ax.set_ylabel(ylabel)
        ax.set_title(wrapped(machine, 60), fontsize=9)
    names = [label(p.replace("'", "") or "(no parameters)") for p in handles]
    fig.legend(list(handles.values()), names, loc="lower center", ncol=legend_cols,
               fontsize=6, title="parameters", title_fontsize=6)
    fit_ylabels(fig, chars_per_inch=7.0)  # the legend below takes part of the height
    fig.tight_layout(rect=(0, (0.13 * legend_rows + 0.25) / height, 1, 1))
    return to_plot(fig, benchmark, alt, tight=False, small=len(machines) == 1)
