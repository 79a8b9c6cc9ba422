"""Render an analysed :class:`~pagebench.results.Results`: lay out the sections, write the page
and its CSVs. The numbers and verdicts come from :func:`pagebench.analysis.analyse`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pagebench.atomic import replace_dir
from pagebench.report import fp8, parallel, real_traces, render, sections, serving
from pagebench.report.outputs import check_report_output
from pagebench.results import Results, devices, report_data_dir
from pagebench.results.derived import ARTICLE, tally

# derived tables saved beside the page (the others are shown beside their source's CSV)
SAVED = ("kernels_batch1_ratio", "kernels_throughput", "kernels_bandwidth",
         "kernels_block_cost", "recommendation", "recommendation_traces")


def derived_frames(results: Results) -> dict:
    """The derived tables saved beside the report like the raw ones (those with rows: an
    empty table has no CSV and no link): ``claims`` holds the claims table's rows."""
    frames = {"claims": sections.verdicts(results, ARTICLE).drop(columns="section")}
    frames |= {name: results.get(name) for name in SAVED}
    return {name: frame for name, frame in frames.items() if frame is not None and len(frame)}


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


def build_sections(results: Results, env: dict, options: dict) -> list[sections.Section]:
    page = [sections.recommendation(results), sections.claims_section(results)]
    return page + [guarded_section(results, *entry) for entry in (
        ("environment", "Environment", lambda r: sections.environment(r, env, options)),
        ("memory", "Memory", sections.memory), ("real-traces", "Real traces", real_traces.section),
        ("capacity", "Capacity", sections.capacity), ("kernels", "Kernels", sections.kernels),
        ("engine", "Engine", sections.engine),
        ("fp8", "fp8 KV cache and block-table layout", fp8.section),
        ("parallel", "Past one GPU", parallel.section),
        ("serving", "Serving", serving.section),
        ("benchmarks", "Benchmark histories", sections.benchmarks))]


def page_path(out) -> Path:
    """The page ``out`` names: ``out/index.html`` when it is a directory (existing, or ending
    in a slash), else ``out``."""
    if str(out).endswith(("/", "\\")) or Path(out).is_dir():  # before Path drops the "/"
        return Path(out) / "index.html"
    return Path(out)


def write_report(results: Results, out, *, env: dict, options: dict) -> Path:
    """Write ``out`` (HTML) and ``<out stem>_data/*.csv`` from ``results`` after
    :func:`pagebench.analysis.analyse`; returns the page's path. A file or directory there
    that pagebench did not write is never replaced: ValueError, nothing written
    (:func:`pagebench.report.outputs.check_report_output`)."""
    if results.get("claims") is None:
        raise ValueError("results: not analysed (run pagebench.analysis.analyse(results) after "
                         "the last Results.add)")
    out = page_path(out)
    data_dir = report_data_dir(out)
    # only a page and data directory pagebench wrote are replaced (ValueError otherwise)
    check_report_output(out)
    page = build_sections(results, env, options)
    frames = results.frames | derived_frames(results)
    hrefs = render.dataset_hrefs(frames, data_dir, out.parent)
    headline, rec = "", results.recommendation
    if rec is not None:
        every = results.get("claims")
        headline = (f"Recommended: {rec.words()} for {rec.workload}"
                    + ("" if rec.speed_measured else " (memory only: no speed data)")
                    + ". " + tally(every["verdict"], every["kind"]) + " on this page.")
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
