"""Render a :class:`~pagebench.results.Results`: judge the claims, lay out sections, write the page
and its CSVs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pagebench.atomic import replace_dir
from pagebench.report import claims as claims_mod
from pagebench.report import derive, fp8, parallel, real_traces, render, sections
from pagebench.results import Results, devices

DATA_DIR_SUFFIX = "_data"
# the claims table's rows; fp8 and parallel judge theirs in their own sections
ARTICLE_CLAIMS = claims_mod.CLAIMS + real_traces.CLAIMS
EVERY_CLAIM = ARTICLE_CLAIMS + fp8.CLAIMS + parallel.CLAIMS


def derived_frames(results: Results, rec: dict | None, claims) -> dict:
    """Tables computed from the raw frames, saved beside the report like the raw ones (those
    with rows: an empty table has no CSV and no link)."""
    frames = {"claims": claims_mod.claims_frame(claims)}
    frames |= {name: derive.table(results, name) for name in derive.KERNEL_TABLES}
    if rec is not None:
        frames["recommendation"] = rec["table"]
    return {name: frame for name, frame in frames.items() if len(frame)}


def guarded_section(results: Results, sid: str, title: str, fn):
    """``fn(results)``, or a section that says why it could not be built (the report still
    renders)."""
    try:
        return fn(results)
    except Exception as e:  # noqa: BLE001 (one failing section must not lose the page)
        results.warn(f"section {sid}: failed ({type(e).__name__}: {e})")
        s = sections.Section(sid, title)
        s.nodata(f"this section could not be built from the data ({type(e).__name__}); "
                 "see warnings")
        return s


def build_sections(results: Results, env: dict, options: dict):
    """The page's sections, the article's verdicts and the recommendation (None: none)."""
    claims = claims_mod.evaluate(results, ARTICLE_CLAIMS)
    try:
        rec = derive.recommend(results.get("memory_static"),
                               derive.table(results, "kernels_block_cost"))
    except Exception as e:  # noqa: BLE001 (no recommendation must not lose the page)
        results.warn(f"section recommendation: failed ({type(e).__name__}: {e})")
        rec = None
    page = [sections.recommendation(rec), sections.claims_section(claims)]
    page += [guarded_section(results, *entry) for entry in (
        ("environment", "Environment", lambda r: sections.environment(r, env, options)),
        ("memory", "Memory", sections.memory), ("real-traces", "Real traces", real_traces.section),
        ("capacity", "Capacity", sections.capacity), ("kernels", "Kernels", sections.kernels),
        ("engine", "Engine", sections.engine),
        ("fp8", "fp8 KV cache and block-table layout", fp8.section),
        ("parallel", "Past one GPU", parallel.section),
        ("benchmarks", "Benchmark histories", sections.benchmarks))]
    return page, claims, rec


def write_report(results: Results, out, *, env: dict, options: dict) -> Path:
    """Write ``out`` (HTML) and ``<out stem>_data/*.csv``; returns the page's path."""
    if str(out).endswith(("/", "\\")) or Path(out).is_dir():  # before Path drops the "/"
        out = Path(out) / "index.html"
    out = Path(out)
    data_dir = out.parent / (out.stem + DATA_DIR_SUFFIX)
    page, claims, rec = build_sections(results, env, options)
    frames = results.frames | derived_frames(results, rec, claims)
    hrefs = render.dataset_hrefs(frames, data_dir, out.parent)
    headline = ""
    if rec is not None:
        headline = (f"Recommended block size: {rec['block_size']}"
                    + ("" if rec["kernel_measured"] else " (memory only: no kernel data)")
                    + ". " + claims_mod.tally(claims) + ".")
    html = render.render_html(
        title="pagebench: paged KV-cache report",
        subtitle=f"built on {devices.run_label(env)}, commit {env.get('commit')}",
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        sections=page, warnings=results.warnings, hrefs=hrefs, headline=headline)
    # the page is rendered before anything is written: a failure changes no file; the data
    # directory is built beside the old one and swapped in just before the page
    replace_dir(data_dir, lambda new_dir: render.write_datasets(frames, new_dir))
    render.atomic_write_text(out, html)
    return out

