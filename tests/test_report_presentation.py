"""How the report presents its numbers: claim headlines per device, plots labelled in words with
units (recorded on each Plot), separate axes for different units, asv history plots."""

from __future__ import annotations

import re

import pytest

import pandas as pd

from pagebench.analysis import analyse, claims
from pagebench.report import plots, sections
from pagebench.results import Results
from pagebench.results.derived import UNMEASURED

from synthetic_report import DEVICE, synthetic_results

SNAKE = re.compile(r"[a-z0-9]+(_[a-z0-9]+)+")


def test_claim_headlines_name_every_judged_device_and_keep_the_details():
    results = synthetic_results()
    cpu = results.get("engine_cow").assign(machine="cpu", device="cpu", device_name="x86_64",
                                           cpu_count=2)
    results.add("engine_cow", cpu, "committed cpu")
    evaluated = {c.key: c for c in claims.evaluate(results)}
    cow = evaluated["cow_n4"]
    assert cow.device == f"CPU (2-core x86_64), {DEVICE}"
    assert cow.headline == (f"CPU (2-core x86_64): n=4 takes 1.30× the blocks of n=1; "
                           f"{DEVICE}: n=4 takes 1.30× the blocks of n=1")
    assert "peak blocks n=4 / n=1 = 1.30× (130 vs 100)" in cow.measured  # the details
    for c in evaluated.values():
        if c.verdict == UNMEASURED or c.device.startswith("any machine ("):
            continue
        assert all(label in c.headline for label in c.device.split(", ")), c
    frame = claims.verdict_frame(list(evaluated.values()), "claims")
    assert {"headline", "measured", "device", "verdict", "section"} <= set(frame.columns)


def test_claims_table_shows_the_headline_and_details_one_click_away():
    c = claims.Verdict("k", "a claim", "criterion", "holds", "X: 1.0×; more detail", "X",
                       headline="X: 1.0×")
    short = claims.Verdict("s", "short", "criterion", "holds", "2.0×", "any machine (simulation)")
    results = Results()
    results.add_derived("claims", claims.verdict_frame([c, short], "claims"))
    table = sections.claims_section(results).items[-1].table
    measured = table.columns.index("measured")
    assert [r[measured] for r in table.rows] == ["X: 1.0×", "2.0×"]
    assert [d[measured] for d in table.details] == ["X: 1.0×; more detail", ""]


@pytest.mark.slow
def test_plots_record_axis_labels_in_words():
    analysed = synthetic_results()
    analyse(analysed)
    for builder in (sections.memory, sections.capacity, sections.kernels, sections.engine,
                    sections.benchmarks):
        for plot in builder(analysed).plots:
            drawn = [a for a in plot.axes if a["y"] is not None]
            assert drawn, plot.title
            for a in drawn:
                assert a["y"] and not SNAKE.fullmatch(a["y"]), (plot.title, a)
                assert a["x"] is None or (a["x"] and not SNAKE.fullmatch(a["x"])), (plot.title, a)


def test_prefix_caching_puts_tokens_and_blocks_on_separate_axes():
    engine = sections.engine(synthetic_results())
    prefix = next(p for p in engine.plots if p.title == "Prefix caching on versus off")
    assert [a["y"] for a in prefix.axes] == ["prompt tokens computed (tokens)",
                                             "peak KV blocks (blocks)"]


def test_history_plot_per_benchmark_over_commits():
    rows = [{"machine": m, "commit": c, "date": d, "benchmark": "attention.B.time_step",
             "params": p, "value": v, "unit": "seconds"}
            for m in ("H200", "CPU (2-core x86_64)")
            for c, d, v in (("aaaaaaa1", 1, 2e-5), ("bbbbbbb2", 2, 3e-5))
            for p in ("'llama', 1", "'llama', 4")]
    plot = plots.history(pd.DataFrame(rows), "attention.B.time_step", "history")
    panels = [a for a in plot.axes if a["y"] is not None]
    assert [a["title"] for a in panels] == ["H200", "CPU (2-core x86_64)"]
    assert {(a["x"], a["y"]) for a in panels} == {("commit (oldest to newest)",
                                                   "time per call (µs)")}
    legend = next(a["legend"] for a in plot.axes if a["y"] is None)
    assert legend == ["llama, 1", "llama, 4"]
    assert plots.history_axis_label("a.B.track_tokens_per_s", "tokens/s", pd.Series([1.0])) \
        == (1.0, "throughput (tokens/s)")
    assert plots.history_axis_label("a.B.time_x", "seconds", pd.Series([0.5]))[1] == \
        "time per call (ms)"
    section = sections.benchmarks(synthetic_results())
    assert [p.title for p in section.plots] == ["attention.Decode.track_time"]


def test_panel_titles_wrap_at_their_separators():
    assert plots.wrapped("CPU (2-core x86_64) · this run · llama-3-8b · context 4,096") == \
        "CPU (2-core x86_64) · this run\nllama-3-8b · context 4,096"
    assert all(len(line) <= 42 for line in plots.wrapped("x" * 100).splitlines())
