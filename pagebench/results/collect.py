"""Gather results from their sources into one :class:`Results`, turning every failure into a
named warning.

Three kinds of source, each checked against its dataset's schema (:mod:`pagebench.results`):
- *measured here*: steps passed in by the caller, each a call into the subsystem that measures
  (:mod:`pagebench.suite` lists those of ``pagebench report``); this package imports none;
- *committed data*: CSV/JSON files under ``reports/data/<machine>/`` and any ``--results DIR``,
  named by file (:data:`pagebench.results.FILE_KINDS`), each file once (by real path), never a
  report's own output (``<page>_data/``);
- *benchmark histories*: asv result files and pytest-benchmark JSON.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pagebench.results.history import asv_results_dir, load_benchmark_json
from pagebench.results.read import Results, load_data_dir

__all__ = ["benchmark_files", "collect", "default_data_dir", "guarded", "history_dirs",
           "input_dirs", "read_committed", "repo_root"]


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
            results_dirs=(), progress: bool = True, exclude=()) -> Results:
    """Everything the report shows: ``steps`` run here (``(label, fn(results, device=,
    quick=))``, e.g. :func:`pagebench.suite.plan`), committed data, benchmark histories; never
    anything under ``exclude`` (the report's own output directory). With ``progress``, one line
    per step on stderr: what runs, then how long it took (kept in ``Results.timings_s``)."""
    results = Results()
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    steps = [*steps, ("reading committed data and benchmark results",
                      lambda r, **_: read_committed(r, data_dir, results_dirs, exclude))]
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


def read_committed(results: Results, data_dir: Path, results_dirs=(), exclude=()) -> None:
    """The committed data under ``data_dir``, any ``results_dirs``, and the benchmark
    histories (asv, pytest-benchmark) found in the checkout and those directories. Each file is
    read once, however many of these directories reach it (real paths compared): a results
    directory inside the committed data adds nothing and is named in a warning. Nothing under
    ``exclude``, nor any report's own data directory, is read."""
    seen: set[Path] = set()
    guarded(results, "committed data",
            lambda: load_data_dir(results, data_dir, seen=seen, exclude=exclude))
    committed = Path(data_dir).resolve()
    extras = []
    for extra in results_dirs:
        if not Path(extra).exists():
            results.warn(f"results: {extra} not found")
            continue
        real = Path(extra).resolve()
        if Path(data_dir).is_dir() and (real == committed or committed in real.parents):
            results.warn(f"results: {extra} is inside the committed data directory {data_dir}, "
                         "which is read already; it adds nothing (give a directory of your own "
                         "results)")
            continue
        extras.append(extra)
        guarded(results, f"results {extra}",
                lambda e=extra: load_data_dir(results, e, seen=seen, exclude=exclude))
    bench_roots = [*history_dirs(repo_root()), data_dir, *extras]
    guarded(results, "benchmark results",
            lambda: load_benchmark_json(results, benchmark_files(bench_roots, skip=seen)))


def history_dirs(root: Path) -> list[Path]:
    """The checkout's directories of benchmark histories: asv results, pytest-benchmark's
    ``.benchmarks/`` and ``reports/bench/`` (``make bench``)."""
    return [asv_results_dir(root), root / ".benchmarks", root / "reports" / "bench"]


def input_dirs(data_dir=None, results_dirs=()) -> list[tuple[str, Path]]:
    """(what, directory) of every directory :func:`collect` reads with these arguments: the
    committed data, each ``--results`` directory, the benchmark histories
    (:func:`history_dirs`); for ``pagebench report`` to keep its output out of them."""
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    labels = ("the asv results directory", *["the pytest-benchmark directory"] * 2)
    return ([("--data-dir", data_dir)] + [("--results", Path(d)) for d in results_dirs]
            + list(zip(labels, history_dirs(repo_root()))))


def benchmark_files(roots, skip=frozenset()) -> list[Path]:
    """The JSON files under ``roots`` (or a root that is a file), each once by real path, in
    the order first reached; none whose real path is in ``skip`` (the files read as datasets,
    named for one: not benchmark histories, and a broken one is warned about once)."""
    seen, files = set(skip), []
    for root in map(Path, roots):
        if not root.exists():
            continue
        for path in [root] if root.is_file() else sorted(root.rglob("*.json")):
            real = path.resolve()
            if real not in seen:
                seen.add(real)
                files.append(path)
    return files
