"""Gather results from their sources into one :class:`Results`, turning every failure into a
named warning.

Three kinds of source, each checked against its dataset's schema (:mod:`pagebench.results`):
- *measured here*: steps passed in by the caller, each a call into the subsystem that measures
  (:mod:`pagebench.suite` lists those of ``pagebench report``); this package imports none;
- *committed data*: CSV/JSON files under ``reports/data/<machine>/`` and any ``--results DIR``,
  named by file (:data:`pagebench.results.FILE_KINDS`);
- *benchmark histories*: asv result files and pytest-benchmark JSON.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pagebench.results.history import asv_results_dir, load_benchmark_json
from pagebench.results.read import Results, load_data_dir

__all__ = ["collect", "default_data_dir", "guarded", "read_committed", "repo_root"]


def guarded(results: Results, name: str, fn) -> None:
    """Run one collector; any failure becomes a warning naming it, never an exception."""
    try:
        fn()
    except ImportError as e:
        results.warn(f"{name}: not available in this build ({e})")
    except Exception as e:  # noqa: BLE001 -- a broken source must not stop the report
        results.warn(f"{name}: failed ({type(e).__name__}: {e})")


def repo_root() -> Path:
    """The checkout this package runs from."""
    return Path(__file__).resolve().parents[2]


def default_data_dir() -> Path:
    """``reports/data`` under the current directory if there is one, else in the checkout
    this package runs from."""
    here = Path.cwd() / "reports" / "data"
    return here if here.is_dir() else repo_root() / "reports" / "data"


def collect(*, device: str = "cpu", quick: bool = False, steps=(), data_dir=None,
            results_dirs=(), progress: bool = True) -> Results:
    """Everything the report shows: ``steps`` run here (``(label, fn(results, device=,
    quick=))``, e.g. :func:`pagebench.suite.plan`), committed data, benchmark histories. With ``progress``, one line per step on stderr: what runs, then how long it
    took (kept in ``Results.timings_s``)."""
    results = Results()
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    steps = [*steps, ("reading committed data and benchmark results",
                      lambda r, **_: read_committed(r, data_dir, results_dirs))]
    for done, (label, fn) in enumerate(steps, 1):
        if progress:
            print(f"report [{done}/{len(steps)}] {label} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        guarded(results, label, lambda f=fn: f(results, device=device, quick=quick))
        results.timings_s[label] = dt = time.perf_counter() - t0
        if progress:
            print(f"report [{done}/{len(steps)}] {label}: {dt:.1f} s", file=sys.stderr,
                  flush=True)
    return results


def read_committed(results: Results, data_dir: Path, results_dirs=()) -> None:
    """The committed data under ``data_dir``, any ``results_dirs``, and the benchmark
    histories (asv, pytest-benchmark) found in the checkout and those directories."""
    guarded(results, "committed data", lambda: load_data_dir(results, data_dir))
    for extra in results_dirs:
        if not Path(extra).exists():
            results.warn(f"results: {extra} not found")
            continue
        guarded(results, f"results {extra}", lambda e=extra: load_data_dir(results, e))
    root = repo_root()
    bench_roots = [asv_results_dir(root), root / ".benchmarks", root / "reports" / "bench",
                   data_dir, *results_dirs]
    guarded(results, "benchmark results", lambda: load_benchmark_json(results, bench_roots))

