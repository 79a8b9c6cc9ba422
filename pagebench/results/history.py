"""Benchmark histories: asv result files and pytest-benchmark JSON as the ``asv`` and
``pytest_benchmark`` datasets."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pandas as pd

from pagebench.results import devices
from pagebench.results.read import Results


def asv_units(results_dir: Path) -> dict:
    path = results_dir / "benchmarks.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {k: v.get("unit") for k, v in data.items() if isinstance(v, dict)}
    except (OSError, ValueError, RecursionError, AttributeError):
        return {}


def asv_machine_info(machine_dir: Path) -> dict:
    try:
        info = json.loads((machine_dir / "machine.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return info if isinstance(info, dict) else {}


def asv_rows(doc: dict, path, units: dict) -> list[dict]:
    """Tidy rows from one asv result file (format version 2: values over the params product)."""
    machine = (doc.get("params") or {}).get("machine", Path(path).parent.name)
    machine = devices.label_from_asv_machine(asv_machine_info(Path(path).parent), machine)
    columns = doc.get("result_columns") or ["result", "params"]
    rows = []
    for bench, entry in (doc.get("results") or {}).items():
        if not isinstance(entry, list) or not entry:
            continue
        record = dict(zip(columns, entry))
        values = record.get("result")
        params = record.get("params") or []
        if not isinstance(values, list):
            values = [values]
        combos = list(itertools.product(*params)) if params else [()]
        for combo, value in zip(combos, values):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            rows.append({"machine": machine, "commit": str(doc.get("commit_hash", ""))[:10],
                         "date": doc.get("date"), "benchmark": bench,
                         "params": ", ".join(str(c) for c in combo),
                         "value": float(value), "unit": units.get(bench) or ""})
    return rows


def pytest_benchmark_rows(doc: dict) -> list[dict]:
    commit = (doc.get("commit_info") or {}).get("id", "")
    info = doc.get("machine_info") or {}
    cpu = info.get("cpu") or {}
    machine = devices.device_label("cpu", cpu.get("arch_string_raw") or info.get("machine", ""),
                                   cpu.get("count"))
    rows = []
    for b in doc.get("benchmarks") or []:
        stats = b.get("stats") or {}
        if "median" not in stats:
            continue
        rows.append({"machine": machine, "commit": str(commit)[:10], "date": doc.get("datetime"),
                     "benchmark": b.get("fullname") or b.get("name"),
                     "params": json.dumps(b.get("params")) if b.get("params") else "",
                     "median_us": float(stats["median"]) * 1e6,
                     "iqr_us": float(stats.get("iqr", 0.0)) * 1e6,
                     "rounds": stats.get("rounds")})
    return rows


def load_benchmark_json(results: Results, roots) -> None:
    """asv result files and pytest-benchmark JSON anywhere under ``roots``."""
    asv, pyb = [], []
    for root in roots:
        root = Path(root)
        if not root.exists():
            continue
        files = [root] if root.is_file() else sorted(root.rglob("*.json"))
        for path in files:
            if path.name in ("machine.json", "benchmarks.json"):
                continue
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, UnicodeDecodeError) as e:
                results.warn(f"benchmarks: {path}: cannot parse ({type(e).__name__}: {e})")
                continue
            except RecursionError:  # nested deeper than Python's stack ('[' x 100,000)
                results.warn(f"benchmarks: {path}: cannot parse (nested too deeply)")
                continue
            if not isinstance(doc, dict):
                continue
            if "commit_hash" in doc and "results" in doc:
                asv.extend(asv_rows(doc, path, asv_units(path.parent.parent)))
            elif "benchmarks" in doc and "machine_info" in doc:
                pyb.extend(pytest_benchmark_rows(doc))
    if asv:
        results.add("asv", pd.DataFrame(asv), "asv results")
    if pyb:
        results.add("pytest_benchmark", pd.DataFrame(pyb), "pytest-benchmark JSON")


def read_asv_conf(repo_root: Path) -> dict:
    """``asv.conf.json`` as a dict (asv allows whole-line // comments: dropped before parsing)."""
    text = (Path(repo_root) / "asv.conf.json").read_text(encoding="utf-8")
    return json.loads("\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("//")))


def asv_results_dir(repo_root: Path) -> Path:
    try:
        return repo_root / read_asv_conf(repo_root).get("results_dir", ".asv/results")
    except (OSError, ValueError):
        return repo_root / ".asv" / "results"
