"""`pagebench recommend --html`: the answer as one short self-contained page (the score chart
inline as a PNG, no script, no network), every line with the data it came from."""

from __future__ import annotations

import html

import pandas as pd

from pagebench.atomic import atomic_write_text
from pagebench.report import plots

STYLE = """body { font-family: system-ui, sans-serif; max-width: 900px; margin: 24px auto;
 padding: 0 16px; color: #222; line-height: 1.45; }
.answer { font-size: 17px; background: #e8f0fe; padding: 10px 14px; border-radius: 4px; }
.data { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } img { max-width: 100%; }"""


def section(title: str, answer: str, data: list[str]) -> str:
    items = "".join(f"<li>{html.escape(d)}</li>" for d in data)
    return (f"<h2>{html.escape(title)}</h2><p class='answer'>{html.escape(answer)}</p>"
            f"<ul class='data'>{items}</ul>")


def table_html(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if not k.endswith(("_low", "_high"))]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)

    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else html.escape("-" if v is None else str(v))

    body = "".join("<tr>" + "".join(f"<td>{cell(r[k])}</td>" for k in keys) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(doc: dict) -> str:
    w, b, f = doc["workload"], doc["block_size"], doc["fp8"]
    rate = doc["latency_bound_rate"]
    chart = plots.block_size_scores(pd.DataFrame(doc["table"]))
    parts = [
        f"<h1>pagebench recommend</h1><p>Workload: {html.escape(w['name'])}; max_model_len "
        f"{w['max_model_len']:,}. Device data: {html.escape(str(doc['device_data']))}.</p>",
        section("Block size", b["words"], [f"utilisation: {b['utilisation_data']}",
                                           f"speed: {b['basis']}"]),
        f"<img src='{chart.data_uri}' alt='{html.escape(chart.alt)}'>"
        f"<p class='data'>{html.escape(chart.title)}</p>",
        table_html(doc["table"]),
        section("Sequences that fit", ", ".join(
            f"{n:,} ({d})" for d, n in doc["capacity"]["at_best_block"].items())
            + f" at block {b['best']}", [doc["capacity"]["data"]]),
        section("Latency-bound rate", f"{rate['requests_per_s']:g} requests/s"
                if rate["requests_per_s"] is not None else rate["data"],
                [rate["data"]] if rate["requests_per_s"] is not None else []),
        section("fp8 KV cache", f["verdict"], f["evidence"] + [f"missing: {m}"
                                                                for m in f["missing"]]),
    ]
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>pagebench "
            f"recommend</title><style>{STYLE}</style></head><body>{''.join(parts)}"
            "</body></html>\n")


def write_page(doc: dict, path: str) -> None:
    atomic_write_text(path, page(doc))
