"""Gather the report's data as tidy DataFrames, turning every failure into a named warning.

Three kinds of source:
- *measured here*: the quick sweeps this machine can afford (simulators, CPU kernel and engine
  sweeps), run by the steps of :mod:`pagebench.report.sweeps`;
- *committed data*: CSV/JSON files under ``reports/data/<machine>/`` (e.g. the H200 runs) and
  any ``--results DIR``, classified by file name (``kernels*``, ``engine*``, ...);
- *benchmark histories*: asv result files and pytest-benchmark JSON.

Results are read as CSV or JSON only. A missing or malformed file never stops the report: it is
named in a warning and its section says "no data".
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from pagebench.errors import PagebenchError
from pagebench.report import devices

# file-name prefix (under a data directory) -> dataset name; first match wins
FILE_KINDS = (
    ("kernels_prefill_equivalence", "kernels_prefill_equivalence"),
    ("kernels_prefill_tuning", None),  # prefill launch-parameter tuning: not a report dataset
    ("kernels_prefill", "kernels_prefill"),
    ("kernels_equivalence", "kernels_equivalence"),
    ("kernels_tuning", None),  # kernel launch-parameter tuning: not a report dataset
    # fp8 caches and table layouts (scripts/h200_fp8.py; read by pagebench.report.fp8)
    ("kernels_fp8", "kernels_fp8"), ("kernels_layout", "kernels_layout"),
    ("fp8_engine", "fp8_engine"),
    ("kernels", "kernels"),
    ("engine_cow", "engine_cow"),
    ("engine_prefix", "engine_prefix"),
    ("engine_pool", "engine_pool"),
    ("engine_batch", "engine_batch"),
    ("engine_throughput", "engine_batch"),
    ("engine_equal_memory", "engine_equal_memory"),
    ("engine_vs_transformers", "engine_compare"),
    ("engine", "engine"),
    ("capacity", "capacity"),
    ("dynamic", "memory_dynamic_summary"),
    ("copy_bandwidth", "copy_bandwidth"),
    # two GPUs (scripts/h200x2_tp.py; read by pagebench.report.parallel)
    ("tp_equality", "tp_equality"), ("tp_capacity", "tp_capacity"),
    ("tp_throughput", "tp_throughput"), ("tp_allreduce", "tp_allreduce"),
    ("tp_attention", "tp_attention"), ("sweep_wall", "sweep_wall"),
    ("sweep_rows", None),  # the split sweep's own rows: not a decode-kernel dataset here
)
# columns a dataset must have to be usable; a file missing any of them is reported, not used
REQUIRED_COLUMNS = {
    "kernels": ("device", "batch", "context", "block_size", "backend", "time_us"),
    "kernels_equivalence": ("backend", "ok"),
    "kernels_prefill": ("backend", "batch", "query_len", "cached", "time_us"),
    "kernels_prefill_equivalence": ("backend", "ok"),
    "engine_cow": ("n",),
    "engine_prefix": ("enable_prefix_caching",),
    "engine_pool": ("num_blocks",),
    "engine_batch": ("batch",),
}


class DataError(PagebenchError, ValueError):
    """A results file that cannot be used; the message names the file and the reason."""


class Results:
    """Named tidy DataFrames, where each came from, and the warnings met on the way."""

    def __init__(self):
        self.frames: dict[str, pd.DataFrame] = {}
        self.sources: dict[str, list[str]] = {}
        self.warnings: list[str] = []
        self.timings_s: dict[str, float] = {}

    def add(self, name: str, frame: pd.DataFrame | None, source: str) -> None:
        if frame is None or len(frame) == 0:
            return
        missing = [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in frame.columns]
        if missing:
            self.warn(f"{name}: {source}: missing column(s) {', '.join(missing)}; not used")
            return
        frame = frame.copy()
        if "source" not in frame.columns:
            frame["source"] = source
        labels = devices.frame_labels(frame)
        if labels.notna().any():  # one device naming scheme in every table, plot and claim
            frame["machine"] = labels
        old = self.frames.get(name)
        self.frames[name] = frame if old is None else pd.concat([old, frame], ignore_index=True)
        self.sources.setdefault(name, []).append(source)

    def get(self, name: str) -> pd.DataFrame | None:
        return self.frames.get(name)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


# ---- reading files ----------------------------------------------------------------------

def records_from_json(obj, path) -> list[dict]:
    """Rows from a JSON document: a list of records, or a dict holding one under a usual key."""
    if isinstance(obj, list):
        rows = obj
    elif isinstance(obj, dict):
        key = next((k for k in ("rows", "results", "data", "records") if
                    isinstance(obj.get(k), list)), None)
        if key is None:
            raise DataError(f"{path}: JSON holds no list of records (expected a list, or a "
                            "'rows'/'results' list)")
        rows = obj[key]
    else:
        raise DataError(f"{path}: JSON top level is {type(obj).__name__}, not a list or object")
    if not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{path}: records must be JSON objects")
    return rows


def read_table(path, required=()) -> pd.DataFrame:
    """A CSV or JSON results file as a DataFrame; :class:`DataError` names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            check_csv_complete(path)
            frame = pd.read_csv(path)
        elif suffix in (".json", ".jsonl"):
            text = path.read_text(encoding="utf-8")
            if suffix == ".jsonl":
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                rows = records_from_json(json.loads(text), path)
            frame = pd.DataFrame.from_records(rows)
        else:
            raise DataError(f"{path}: unsupported format {suffix!r} (only CSV and JSON are read)")
    except DataError:
        raise
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError, OSError) as e:
        raise DataError(f"{path}: cannot parse ({type(e).__name__}: {e})") from e
    if len(frame) == 0:
        raise DataError(f"{path}: holds no rows")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame


def check_csv_complete(path: Path) -> None:
    """Refuse a CSV cut short by an interrupted write: one whose last line has no newline (a
    ``time_us`` of ``17.52`` may have become ``1``), or a row with fewer or more fields than the
    header (pandas would fill or shift them silently)."""
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        raise DataError(f"{path}: the last line does not end with a newline (a truncated "
                        "write?); file skipped")
    rows = csv.reader(io.StringIO(text))
    header = next(rows, [])
    for lineno, row in enumerate(rows, 2):
        if row and len(row) != len(header):
            raise DataError(f"{path}: line {lineno} has {len(row)} fields, the header "
                            f"{len(header)}; file skipped")


def classify(path: Path) -> str | None:
    stem = path.stem.lower()
    if "smoke" in stem:  # a quick check run beside the full one: not report data
        return None
    for prefix, name in FILE_KINDS:
        if stem.startswith(prefix):
            return name  # None: a known file that the report does not read
    return None


# pagebench.engine.bench's ``experiment`` values (and its function names) -> dataset
ENGINE_EXPERIMENTS = {
    "cow": "engine_cow", "cow_comparison": "engine_cow", "engine_cow": "engine_cow",
    "prefix_cache": "engine_prefix", "prefix_cache_comparison": "engine_prefix",
    "engine_prefix": "engine_prefix",
    "pool_size": "engine_pool", "pool_size_sweep": "engine_pool", "engine_pool": "engine_pool",
    "throughput_vs_batch": "engine_batch", "engine_batch": "engine_batch",
    "equal_memory": "engine_equal_memory", "equal_memory_comparison": "engine_equal_memory",
    "compare_with_transformers": "engine_compare", "engine_compare": "engine_compare",
}


# other names for the columns the report reads, per engine dataset: canonical <- alias
ENGINE_ALIASES = {
    "engine_batch": {"batch": "batch_size"},
    "engine_prefix": {"enable_prefix_caching": "prefix_caching",
                      "prefix_cache_hit_rate": "hit_rate",
                      "num_computed_prompt_tokens": "computed_prompt_tokens"},
    "engine_cow": {"peak_blocks": "peak_kv_blocks"},
    "engine_pool": {"num_preemptions": "preemptions", "tokens_per_s": "throughput_tokens_per_s"},
}


def normalise_engine(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The engine bench's column names -> the ones the report reads (both kept)."""
    frame = frame.copy()
    for canonical, alias in ENGINE_ALIASES.get(name, {}).items():
        if canonical not in frame.columns and alias in frame.columns:
            frame[canonical] = frame[alias]
    if name == "engine_cow" and "n" not in frame.columns and "variant" in frame.columns:
        # "n=1", "n=4 shared" -> n; "4 separate requests" -> no n (shown, not judged)
        n = frame["variant"].astype(str).str.extract(r"^n\s*=\s*(\d+)")[0]
        frame["n"] = pd.to_numeric(n, errors="coerce")
    return frame


def add_engine_rows(results: Results, frame: pd.DataFrame, source: str, default: str) -> None:
    """Engine rows to their datasets: by ``experiment`` column if present, else ``default``."""
    if "experiment" in frame.columns:
        for exp, part in frame.groupby(frame["experiment"].astype(str), sort=False):
            name = ENGINE_EXPERIMENTS.get(exp, "engine")
            results.add(name, normalise_engine(name, part), source)
        return
    name = ENGINE_EXPERIMENTS.get(default, default if default.startswith("engine") else "engine")
    results.add(name, normalise_engine(name, frame), source)


def load_file(results: Results, name: str, path: Path, label: str) -> None:
    try:
        frame = read_table(path, () if name.startswith("engine") else
                           REQUIRED_COLUMNS.get(name, ()))
    except DataError as e:
        results.warn(f"{name}: {e}")
        return
    if "machine" not in frame.columns:
        frame["machine"] = label
    if name.startswith("engine"):
        add_engine_rows(results, frame, str(path), default=name)
    else:
        results.add(name, frame, str(path))


def load_data_dir(results: Results, root) -> None:
    """Every ``<root>/<machine>/*.csv|json`` file whose name says what it holds."""
    root = Path(root)
    if not root.is_dir():
        results.warn(f"data: directory {root} not found")
        return
    seen = set()
    # CSV first: a kernels.json written beside kernels.csv holds the same rows
    order = {".csv": 0, ".jsonl": 1, ".json": 2}
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in order]
    for path in sorted(files, key=lambda p: (str(p.parent), p.stem, order[p.suffix.lower()])):
        if (path.parent, path.stem) in seen:
            continue
        seen.add((path.parent, path.stem))
        name = classify(path)
        if name is None:
            continue
        machine = path.parent.name if path.parent != root else "unknown"
        load_file(results, name, path, machine)


# ---- asv and pytest-benchmark -----------------------------------------------------------

def _asv_units(results_dir: Path) -> dict:
    path = results_dir / "benchmarks.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {k: v.get("unit") for k, v in data.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        return {}


def _asv_machine_info(machine_dir: Path) -> dict:
    try:
        info = json.loads((machine_dir / "machine.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def asv_rows(doc: dict, path, units: dict) -> list[dict]:
    """Tidy rows from one asv result file (format version 2: values over the params product)."""
    import itertools

    machine = (doc.get("params") or {}).get("machine", Path(path).parent.name)
    machine = devices.label_from_asv_machine(_asv_machine_info(Path(path).parent), machine)
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
            if not isinstance(doc, dict):
                continue
            if "commit_hash" in doc and "results" in doc:
                asv.extend(asv_rows(doc, path, _asv_units(path.parent.parent)))
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


# ---- running the quick sweeps -----------------------------------------------------------

class Progress:
    """One line per step on stderr: what runs, then how long it took."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled

    @contextmanager
    def step(self, label: str, results: Results):
        self.done += 1
        if self.enabled:
            print(f"report [{self.done}/{self.total}] {label} ...", file=self.stream, flush=True)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            results.timings_s[label] = dt
            if self.enabled:
                print(f"report [{self.done}/{self.total}] {label}: {dt:.1f} s",
                      file=self.stream, flush=True)


def first_column(frame: pd.DataFrame, *names: str) -> str | None:
    """The first of ``names`` that is a column of ``frame`` (None if none is)."""
    return next((n for n in names if n in frame.columns), None)


def call_with_supported(fn, **kwargs):
    """Call ``fn`` with those of ``kwargs`` its signature accepts."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(**kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def as_frame(value) -> pd.DataFrame | None:
    """A DataFrame from what a sweep returned (DataFrame, list of dicts, dict with rows)."""
    if value is None:
        return None
    if isinstance(value, pd.DataFrame):
        return value
    if isinstance(value, dict):
        if any(isinstance(value.get(k), list) for k in ("rows", "results", "records")):
            return pd.DataFrame.from_records(records_from_json(value, "sweep"))
        return pd.DataFrame([value])
    if isinstance(value, (list, tuple)):
        return pd.DataFrame.from_records([getattr(v, "to_dict", lambda v=v: v)() for v in value])
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return pd.DataFrame([to_dict()])
    raise DataError(f"unexpected result type {type(value).__name__}")


def guarded(results: Results, name: str, fn) -> None:
    """Run one collector; any failure becomes a warning naming it, never an exception."""
    try:
        fn()
    except ImportError as e:
        results.warn(f"{name}: not available in this build ({e})")
    except Exception as e:  # noqa: BLE001 -- a broken source must not stop the report
        results.warn(f"{name}: failed ({type(e).__name__}: {e})")


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_data_dir() -> Path:
    """``reports/data`` under the current directory if there is one, else in the checkout
    this package runs from."""
    here = Path.cwd() / "reports" / "data"
    return here if here.is_dir() else repo_root() / "reports" / "data"


def collect(*, device: str = "cpu", quick: bool = False, steps=(), data_dir=None,
            results_dirs=(), progress: bool = True) -> Results:
    """Everything the report shows: ``steps`` run here (``(label, fn(results, device=,
    quick=))``, e.g. :func:`pagebench.report.sweeps.plan`), committed data, benchmark
    histories."""
    results = Results()
    root = repo_root()
    prog = Progress(len(steps) + 1, enabled=progress)
    for label, fn in steps:
        with prog.step(label, results):
            guarded(results, label, lambda f=fn: f(results, device=device, quick=quick))
    with prog.step("reading committed data and benchmark results", results):
        data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        guarded(results, "committed data", lambda: load_data_dir(results, data_dir))
        for extra in results_dirs:
            if not Path(extra).exists():
                results.warn(f"results: {extra} not found")
                continue
            guarded(results, f"results {extra}", lambda e=extra: load_data_dir(results, e))
        bench_roots = [asv_results_dir(root), root / ".benchmarks", root / "reports" / "bench",
                       data_dir, *results_dirs]
        guarded(results, "benchmark results", lambda: load_benchmark_json(results, bench_roots))
    return results


def default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"
