"""The report in a real browser: headless Chromium (Debian's package, `make browser-deps`) opens
it from disk; nothing leaves the machine, no console errors, the claims table and every plot
are there, every plot's axes are labelled in words (no raw column names), and every device is
named in the one scheme of pagebench.results.devices. A screenshot is written to
reports/test-artifacts/ as a test artefact."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from synthetic_report import synthetic_results

from pagebench.analysis import analyse
from pagebench.analysis.pipeline import EVERY_CLAIM
from pagebench.report import build
from pagebench.results import devices

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "reports" / "test-artifacts"

# CI installs Chromium (make test -> browser-deps): there a missing browser is a failure
pytestmark = [pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                 reason="chromium not installed "
                                 "(make browser-deps installs Debian's package)"),
              pytest.mark.slow]  # a browser per module: ~10 s on 2 cores


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report on small synthetic data: every section and plot present, seconds to build."""
    results = synthetic_results()
    # committed CPU rows under a raw machine name: the page must show them by their label
    results.add("engine_cow", pd.DataFrame({
        "n": [1, 4], "variant": ["n=1", "n=4 shared"], "peak_blocks": [30, 36], "machine": "cpu", "device": "cpu",
        "device_name": "x86_64", "cpu_count": 2}), "reports/data/cpu/engine_cow.csv")
    results.warn("synthetic data: this page is the browser test's fixture")
    out = tmp_path_factory.mktemp("site") / "index.html"
    analyse(results)
    build.write_report(results, out, env={"device": "cpu", "device_name": "test"}, options={})
    page = build.build_sections(results, {"device": "cpu"}, {})
    frames = build.derived_frames(results)
    columns = set()
    for frame in [*frames.values(), *results.frames.values()]:
        columns.update(map(str, frame.columns))
    return out, sum(len(s.plots) for s in page), len(frames["claims"]), columns


def test_report_opens_offline_without_errors(report):
    assert CHROMIUM, "chromium not installed (make browser-deps installs Debian's package)"
    from playwright import sync_api
    out, num_plots, num_claims, _ = report
    # a page that does fetch something, to show the request check below can fail
    leaky = out.with_name("leaky.html")
    leaky.write_text(out.read_text().replace("</main>", '<img src="http://127.0.0.1:9/x.png"></main>'))
    requests, errors, leaky_requests = [], [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            # anything that is not the file itself or an inline data: URI is refused
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
                ("file:", "data:")) else route.abort())
            page.goto(out.as_uri(), wait_until="load")
            rows = page.locator("#claims-table tbody tr").count()
            verdicts = page.locator("#claims-table td.verdict").all_inner_texts()
            images = page.evaluate("""() => Array.from(document.images).map(
                img => [img.src.slice(0, 22), img.complete && img.naturalWidth > 0])""")
            headings = page.locator("h2").all_inner_texts()
            headline = page.locator("#headline").inner_text()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
            other = browser.new_page()
            other.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
                ("file:", "data:")) else route.abort())
            other.on("request", lambda r: leaky_requests.append(r.url))
            other.goto(leaky.as_uri(), wait_until="load")
        finally:
            browser.close()
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert any(u.startswith("http:") for u in leaky_requests)  # the check sees a fetch
    assert errors == []
    assert rows == num_claims and len(verdicts) == num_claims
    assert set(verdicts) <= {"holds", "does not hold", "within noise", "not measured here"}
    assert len(images) == num_plots >= 10
    assert all(src == "data:image/png;base64," and loaded for src, loaded in images), images
    for title in ("Recommendation", "Claims", "Environment", "Memory", "Capacity", "Kernels",
                  "Engine", "Warnings"):
        assert any(h.startswith(title) for h in headings), (title, headings)
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
    # one claim count: the banner counts the rows `pagebench claims` prints, the page's all
    assert f"{len(EVERY_CLAIM)} claims:" in headline, headline


# what a raw column name looks like: snake_case, or one lower-case word a dataset uses as-is
SNAKE = re.compile(r"[a-z0-9]+(_[a-z0-9]+)+")
OLD_DEVICE_NAMES = re.compile(r"this machine|\[(h200|cpu|synthetic)|^(cpu|vm|h200)$|NVIDIA H200")


def read_page(out: Path) -> dict:
    """What the browser shows: each plot's recorded axes, the device cells of every table (those
    of verdict tables apart), and the verdict tables' measured and device cells."""
    from playwright import sync_api
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
                ("file:", "data:")) else route.abort())
            page.goto(out.as_uri(), wait_until="load")
            return page.evaluate("""() => {
                const figures = Array.from(document.querySelectorAll("figure")).map(f => ({
                    caption: f.querySelector("figcaption").innerText,
                    alt: f.querySelector("img").alt, axes: f.dataset.axes,
                    labelProblems: f.dataset.labelProblems}));
                const deviceCells = [], claims = [];
                for (const table of document.querySelectorAll("table")) {
                    const heads = Array.from(table.querySelectorAll("thead th"))
                        .map(th => th.innerText.trim());
                    const col = heads.indexOf("device");
                    if (col < 0) continue;
                    for (const tr of table.querySelectorAll("tbody tr")) {
                        const cells = tr.querySelectorAll("td");
                        if (heads.includes("verdict")) {  // the claims, and sections' verdicts
                            const measured = cells[heads.indexOf("measured")];
                            claims.push({device: cells[col].innerText.trim(),
                                         main: table.id === "claims-table",
                                         glance: measured.firstChild.textContent.trim(),
                                         details: measured.querySelector("details") !== null});
                        } else deviceCells.push(cells[col].innerText.trim());
                    }
                }
                return {figures, deviceCells, claims};
            }""")
        finally:
            browser.close()


def test_every_plot_is_labelled_in_words_and_devices_use_one_scheme(report):
    assert CHROMIUM, "chromium not installed (make browser-deps installs Debian's package)"
    out, num_plots, _, columns = report
    seen = read_page(out)
    assert len(seen["figures"]) == num_plots
    labelled_devices = set()
    for fig in seen["figures"]:
        # every image has its caption and alt text; no tick labels overlap and no label is
        # cut off (matplotlib's text boxes, recorded by plots.label_problems: a PNG's pixels
        # cannot be read back here)
        assert fig["caption"].strip() and fig["alt"].strip(), fig
        assert json.loads(fig["labelProblems"]) == [], (fig["caption"], fig["labelProblems"])
        axes = json.loads(fig["axes"])
        drawn = [a for a in axes if a["y"] is not None]
        assert drawn, fig["caption"]
        for a in axes:
            texts = [t for t in (a["x"], a["y"]) if t is not None]
            assert all(t.strip() for t in texts), (fig["caption"], a)  # every axis labelled
            for text in texts:  # an axis label is never a column's name
                assert text not in columns and not SNAKE.fullmatch(text), (fig["caption"], text)
            for text in a["legend"]:  # a legend entry may be a word ("free"), not an identifier
                assert not SNAKE.fullmatch(text), (fig["caption"], text)
            for text in a["legend"] + [a["title"]]:
                assert not OLD_DEVICE_NAMES.search(text), (fig["caption"], text)
        assert all(a["y"] in fig["alt"] for a in drawn), fig  # and said in the alt text
    assert seen["deviceCells"], "no table shows a device column"
    for cell in filter(None, seen["deviceCells"]):  # empty: not measured on any device
        assert devices.is_device_label(cell), cell
        labelled_devices.add(cell)
    assert {"Synthetic GPU", "CPU (2-core x86_64)"} <= labelled_devices
    assert seen["claims"]
    for claim in seen["claims"]:
        if not claim["device"] or claim["device"].startswith("any machine ("):
            continue
        for label in claim["device"].split(", "):
            assert devices.is_device_label(label), claim
            # the claims table's cell names every device it judged
            assert label in claim["glance"] or not claim["main"], claim
    assert any(c["details"] for c in seen["claims"])  # details one click away
    html = out.read_text(encoding="utf-8")
    for old in ("this machine (", "[h200]", "x86_64 [", "NVIDIA H200 ["):
        assert old not in html, old
