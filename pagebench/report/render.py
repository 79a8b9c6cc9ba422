"""Render sections into one self-contained HTML page and write it, and its data, atomically.

The page loads nothing: CSS inline, plots as PNG data URIs, no JavaScript. Every string is
escaped by jinja2's autoescape. Files are written to a temporary file in the same directory and
moved into place with ``os.replace``, so an interrupted run leaves the previous page intact.
"""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

from pagebench.atomic import atomic_write_text  # the page's writer, re-exported
from pagebench.report.outputs import GENERATOR_META, MARKER, marker_text

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{{ generator_meta }}
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d1d1f; }
main { max-width: 1180px; margin: 0 auto; padding: 16px 24px 48px; }
header { background: #1f3b5a; color: #fff; padding: 18px 24px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 0; opacity: .85; }
nav { margin: 12px 0; font-size: 13px; }
nav a { margin-right: 14px; }
h2 { border-bottom: 2px solid #1f3b5a; padding-bottom: 4px; margin-top: 36px; }
table { border-collapse: collapse; margin: 8px 0 18px; font-size: 12.5px; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 7px; vertical-align: top; }
th { background: #f0f3f6; text-align: left; }
td { font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: 10px 0 18px; }
figure img { max-width: 100%; border: 1px solid #e5e7eb; }
figure.small { display: inline-block; width: 49%; margin: 6px 0; vertical-align: top; }
figcaption { font-size: 12px; color: #555; }
.nodata { background: #fff8e1; border-left: 4px solid #f0b400; padding: 6px 10px; margin: 8px 0; }
.warnings { background: #fdecea; border-left: 4px solid #c62828; padding: 6px 14px; }
.verdict { font-weight: 700; white-space: nowrap; }
.verdict.holds { color: #1b5e20; background: #e8f5e9; }
.verdict.fails { color: #b71c1c; background: #ffebee; }
.verdict.noise { color: #6d4c00; background: #fff8e1; }
.verdict.unmeasured { color: #555; background: #f5f5f5; }
.criterion { color: #555; font-size: 11.5px; min-width: 170px; }
#claims-table { width: 100%; }
#claims-table td:first-child { min-width: 200px; }
#claims-table td:nth-child(2) { min-width: 240px; }
#claims-table td.datalink { word-break: break-all; min-width: 90px; }
details { margin: 8px 0 18px; }
details.more { margin: 4px 0 0; font-size: 11.5px; color: #444; }
details.more summary { font-weight: 400; color: #1f3b5a; }
#claims-table td.device { min-width: 110px; }
table:not(#claims-table) td.device { white-space: nowrap; }
summary { cursor: pointer; font-weight: 600; font-size: 13px; }
.datalink { font-size: 11.5px; }
.recommendation { font-size: 16px; background: #e8f0fe; padding: 10px 14px; border-radius: 4px; }
</style>
</head>
<body>
<header>
<h1>{{ title }}</h1>
<p>Generated {{ generated }} · {{ subtitle }}</p>
</header>
<main>
<nav>{% for s in sections %}<a href="#{{ s.id }}">{{ s.title }}</a>{% endfor %}
{% if warnings %}<a href="#warnings">Warnings ({{ warnings|length }})</a>{% endif %}</nav>
{% if headline %}<p class="recommendation" id="headline">{{ headline }}</p>{% endif %}
{% for s in sections %}
<section id="{{ s.id }}">
<h2>{{ s.title }}</h2>
{% for item in s.items %}
{% if item.kind == "text" %}<p>{{ item.text }}</p>
{% elif item.kind == "nodata" %}<p class="nodata">{{ item.text }}</p>
{% elif item.kind == "plot" %}<figure class="plot{% if item.plot.small %} small{% endif %}" data-axes='{{ item.plot.axes|tojson }}' data-label-problems='{{ item.plot.label_problems|list|tojson }}'><img src="{{ item.plot.data_uri }}" alt="{{ item.plot.alt }}"><figcaption>{{ item.plot.title }}</figcaption></figure>
{% elif item.kind == "table" %}{% set t = item.table %}
{% if t.rows|length > 15 and s.id != "claims" %}<details><summary>{{ t.caption }} ({{ t.rows|length }} rows)</summary>{% endif %}
<div class="scroll"><table{% if s.id == "claims" %} id="claims-table"{% endif %}>
<caption>{{ t.caption }}{% if t.data and t.data in hrefs %} · <a class="datalink" href="{{ hrefs[t.data] }}">CSV</a>{% endif %}</caption>
<thead><tr>{% for c in t.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in t.rows %}{% set rowloop = loop %}<tr>{% for cell in row %}{% set cls = t.classes[rowloop.index0][loop.index0] if t.classes else "" %}
{% if cls == "links" %}<td class="datalink">{% for name in cell.split() %}{% if name in hrefs %}<a href="{{ hrefs[name] }}">{{ name }}</a>{% else %}{{ name }}{% endif %}{% if not loop.last %}, {% endif %}{% endfor %}</td>
{% else %}<td{% if cls %} class="{{ cls }}"{% endif %}>{{ cell }}{% set more = t.details[rowloop.index0][loop.index0] if t.details else "" %}{% if more %}<details class="more"><summary>details</summary>{{ more }}</details>{% endif %}</td>{% endif %}{% endfor %}</tr>
{% endfor %}</tbody></table></div>
{% if t.rows|length > 15 and s.id != "claims" %}</details>{% endif %}
{% endif %}
{% endfor %}
</section>
{% endfor %}
{% if warnings %}
<section id="warnings"><h2>Warnings</h2>
<div class="warnings"><ul>{% for w in warnings %}<li>{{ w }}</li>{% endfor %}</ul></div>
</section>
{% endif %}
</main>
</body>
</html>
"""


def render_html(*, title: str, subtitle: str, generated: str, sections, warnings,
                hrefs: dict, headline: str = "") -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEMPLATE).render(
        generator_meta=Markup(GENERATOR_META), title=title, subtitle=subtitle,
        generated=generated, sections=sections, warnings=warnings, hrefs=hrefs,
        headline=headline)


def dataset_hrefs(frames: dict[str, pd.DataFrame], data_dir: Path, base: Path) -> dict:
    """Dataset name -> href (relative to ``base``) of its CSV."""
    return {name: os.path.relpath(data_dir / f"{name}.csv", base).replace(os.sep, "/")
            for name in frames}


def write_datasets(frames: dict[str, pd.DataFrame], data_dir: Path) -> None:
    """One CSV per dataset in ``data_dir``, and its marker (:data:`MARKER`, listing them: what
    tells the next run the directory is pagebench's to replace); CSVs of an earlier run that
    this run did not produce are removed (the page would link to nothing)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for stale in data_dir.glob("*.csv"):
        if stale.stem not in frames:
            stale.unlink()
    for name, frame in frames.items():
        atomic_write_text(data_dir / f"{name}.csv", frame.to_csv(index=False))
    atomic_write_text(data_dir / MARKER, marker_text(f"{name}.csv" for name in frames))
