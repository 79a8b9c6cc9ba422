"""Every figure the report draws can be read: no two tick labels of an axis overlap and no label
runs past the figure's edge (checked on matplotlib's own text boxes, recorded in
``Plot.label_problems``, since a PNG cannot be checked in the browser), and each allocator has
one colour in every plot."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from synthetic_report import synthetic_results

from pagebench.analysis import analyse
from pagebench.report import build, plots
from pagebench.results.collect import collect


def every_plot(results) -> list[plots.Plot]:
    analyse(results)
    page = build.build_sections(results, {"device": "cpu"}, {})
    return [item.plot for s in page for item in s.items if item.kind == "plot"]


def test_crowded_ticks_and_a_cut_label_are_found():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.bar(range(12), range(12))
    ax.set_xticks(range(12), [f"a long label {i}" for i in range(12)])
    ax.set_ylabel("a y label far too long to fit beside an axes two inches high, surely")
    problems = plots.label_problems(fig)
    plt.close(fig)
    assert any(p.startswith("tick labels overlap: 'a long label 0' and 'a long label 1'")
               for p in problems)
    assert any(p.startswith("cut off at the figure's edge: 'a y label") for p in problems)


def test_a_readable_figure_has_no_problems():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([1, 2, 3], [1, 4, 9])
    ax.set_xlabel("x (units)")
    ax.set_ylabel("y (units)")
    fig.tight_layout()
    assert plots.label_problems(fig) == ()
    plt.close(fig)


@pytest.mark.slow
def test_every_plot_on_synthetic_data_is_readable():
    drawn = every_plot(synthetic_results())
    assert len(drawn) > 10
    assert {p.title: p.label_problems for p in drawn if p.label_problems} == {}


@pytest.mark.slow  # reads reports/data and draws ~40 figures: ~20 s on 2 cores
def test_every_plot_on_the_committed_data_is_readable():
    """The page's figures from reports/data (the engine-vs-transformers bars, the benchmark
    histories' log axes and long labels) as `pagebench report` draws them."""
    drawn = every_plot(collect(quick=True, progress=False))
    assert len(drawn) > 20
    assert {p.title: p.label_problems for p in drawn if p.label_problems} == {}


def test_many_bars_lie_on_their_side_with_one_colour_per_hue():
    df = pd.DataFrame({"case": [f"CPU (2-core)\nmethod {i % 3}\n{i} requests" for i in range(16)],
                       "method": [f"method {i % 3}" for i in range(16)],
                       "tokens_per_s": [10.0 * (i + 1) for i in range(16)]})
    p = plots.bars(df, "case", {"tokens_per_s": "tokens/s"}, "t", "case", "alt",
                   ylabel="tokens/s", logy=True, hue="method")
    assert p.label_problems == ()
    assert p.axes[0]["legend"] == ["method", "method 0", "method 1", "method 2"]


def test_each_allocator_has_one_colour(monkeypatch):
    seen = {}
    draw = plots.to_plot

    def record(fig, *args, **kwargs):
        ax = fig.axes[0]
        for bar, text in zip(ax.patches, [t.get_text() for t in ax.get_xticklabels()]):
            seen.setdefault(text, set()).add(bar.get_facecolor())
        for line in ax.get_lines():
            seen.setdefault(line.get_label(), set()).add(line.get_color())
        return draw(fig, *args, **kwargs)

    monkeypatch.setattr(plots, "to_plot", record)
    static = pd.DataFrame({"allocator": ["naive", "pow2", "oracle", "paged", "paged"],
                           "block_size": [None, None, None, 16, 128],
                           "utilisation": [0.1, 0.5, 1.0, 0.98, 0.9]})
    plots.utilisation_bars(static)
    sweep = pd.DataFrame({"label": ["naive", "naive", "paged 16", "paged 16"],
                          "max_len": [1024, 2048, 1024, 2048], "utilisation": [0.3, 0.2, 1, 1]})
    plots.max_len_lines(sweep)
    to_hex = {k: {tuple(round(c, 3) for c in matplotlib_rgba(v)) for v in vs}
              for k, vs in seen.items()}
    assert to_hex["naive"] == {rgba(plots.allocator_color("naive"))}  # bars and lines alike
    assert to_hex["paged 16"] == {rgba(plots.allocator_color("paged 16"))}
    assert len({plots.allocator_color(a) for a in ("naive", "pow2", "oracle", "paged 16")}) == 4


def matplotlib_rgba(value):
    from matplotlib.colors import to_rgba

    return to_rgba(value)


def rgba(color) -> tuple:
    return tuple(round(c, 3) for c in matplotlib_rgba(color))


@pytest.mark.parametrize("name, same_as", [("paged-16", "paged 16"), ("pow2", "pow2 ")])
def test_allocator_labels_spelled_either_way_share_a_colour(name, same_as):
    assert plots.allocator_color(name) == plots.allocator_color(same_as)


def test_a_colour_covering_few_pixels_keeps_its_exact_value():
    """The PNG palette is cut to 96 colours; a report colour drawn on a sliver of a figure
    full of other shades must still show exactly (it did not on one trace's timeline)."""
    import io

    from matplotlib.colors import to_rgb
    from PIL import Image

    image = Image.new("RGB", (400, 300))
    image.putdata([((x * 7) % 256, (y * 5) % 256, (x + y) % 256)  # many shades everywhere
                   for y in range(300) for x in range(400)])
    orange = tuple(round(255 * v) for v in to_rgb(plots.BREAKDOWN["reserved_unused"][1]))
    for x in range(6):
        for y in range(4):
            image.putpixel((x, y), orange)
    raw = io.BytesIO()
    image.save(raw, "PNG")
    small = Image.open(io.BytesIO(plots.small_png(raw.getvalue()))).convert("RGB")
    assert small.getpixel((0, 0)) == orange
