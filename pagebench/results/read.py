"""Reading results back: a CSV/JSON file as a DataFrame, a data directory as datasets, and
:class:`Results`, the named, schema-checked frames the report renders.

A missing or malformed file never raises out of :func:`load_data_dir`: it is named in a warning
and left out.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd

from pagebench.results import devices
from pagebench.results.datasets import DATASETS, DERIVED, classify, is_report_output
from pagebench.results.derived import Recommendation
from pagebench.results.schema import DataError


class Results:
    """Named tidy DataFrames, each checked against its dataset's schema, where each came from,
    the warnings met on the way, and what :func:`pagebench.analysis.analyse` derived from them."""

    def __init__(self):
        self.frames: dict[str, pd.DataFrame] = {}
        self.sources: dict[str, list[str]] = {}
        self.warnings: list[str] = []
        self.timings_s: dict[str, float] = {}
        # tables derived from the frames (DERIVED) and the recommended block size: add clears
        # them, so none outlives the data it came from
        self.derived: dict[str, pd.DataFrame] = {}
        self.recommendation: Recommendation | None = None

    def add(self, name: str, frame: pd.DataFrame | None, source: str) -> None:
        """Add ``frame``'s rows to dataset ``name``; a frame that fails its schema is named in a
        warning and not used."""
        if name not in DATASETS:
            raise ValueError(f"name: {name!r} is not a dataset of pagebench.results.DATASETS")
        if frame is None or len(frame) == 0:
            return
        try:
            frame = DATASETS[name].validate(frame, source, self.warn)
        except DataError as e:
            self.warn(f"{e}; not used")
            return
        if "source" not in frame.columns:
            frame["source"] = source
        labels = devices.frame_labels(frame)
        if labels.notna().any():  # one device naming scheme in every table, plot and claim
            frame["machine"] = labels
        old = self.frames.get(name)
        self.derived.clear()
        self.recommendation = None
        self.frames[name] = frame if old is None else pd.concat([old, frame], ignore_index=True)
        self.sources.setdefault(name, []).append(source)

    def add_derived(self, name: str, frame: pd.DataFrame) -> None:
        """Keep ``frame`` as the derived table ``name`` (:data:`DERIVED`; empty: nothing could
        be derived); ``ValueError`` naming the required columns a non-empty frame lacks."""
        if name not in DERIVED:
            raise ValueError(f"name: {name!r} is not a derived table of "
                             "pagebench.results.datasets.DERIVED")
        if len(frame):
            DERIVED[name].table(frame)
        self.derived[name] = frame

    def get(self, name: str) -> pd.DataFrame | None:
        """Dataset ``name``, or the table derived under that name (None: neither)."""
        return self.frames.get(name, self.derived.get(name))

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


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
    except RecursionError:  # json nests deeper than Python's stack ('[' x 100,000)
        raise DataError(f"{path}: cannot parse (nested too deeply)") from None
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


def data_files(root: Path) -> list[tuple[str, Path]]:
    """(dataset, path) of every report file under ``root``; of a CSV and a JSON of the same
    stem (``kernels.json`` beside ``kernels.csv`` holds the same rows) only the CSV."""
    order = {".csv": 0, ".jsonl": 1, ".json": 2}
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in order]
    seen, out = set(), []
    for path in sorted(files, key=lambda p: (str(p.parent), p.stem, order[p.suffix.lower()])):
        name = classify(path)
        if (path.parent, path.stem) not in seen and name is not None:
            out.append((name, path))
        seen.add((path.parent, path.stem))
    return out


def report_output_of(path: Path, root: Path, excluded=()) -> Path | None:
    """The report output directory that ``path`` (a file under ``root``) lies in: a report's
    own data directory at or below ``root``, or one of ``excluded`` (real paths, compared with
    the real path's directories, so that a link into one counts too); None if none."""
    for directory in path.parents:
        if is_report_output(directory):
            return directory
        if directory == root:
            break
    real = path.resolve()
    return next((e for e in excluded if e in real.parents), None)


def load_data_dir(results: Results, root, *, seen: set | None = None, exclude=()) -> None:
    """Every ``<root>/<machine>/*.csv|json`` file whose name says which dataset it holds, each
    once: a file whose real path is in ``seen`` (updated) was read already, from another
    directory or through a link. Never read: a report's own data directory
    (:func:`~pagebench.results.datasets.is_report_output`) nor anything under ``exclude``
    (e.g. the directory the report being built writes to), each skipped with one warning."""
    root = Path(root)
    if not root.is_dir():
        results.warn(f"data: directory {root} not found")
        return
    seen = set() if seen is None else seen
    excluded = [Path(e).resolve() for e in exclude]
    for name, path in data_files(root):
        real = path.resolve()
        own = report_output_of(path, root, excluded)
        if own is not None:
            results.warn(f"data: {own} is a report's own output (its tables as CSV), not "
                         "results; not read back")
            continue
        if real in seen:
            continue
        seen.add(real)
        try:
            frame = read_table(path)
        except DataError as e:
            results.warn(f"{name}: {e}")
            continue
        if "machine" not in frame.columns:
            frame["machine"] = path.parent.name if path.parent != root else "unknown"
        results.add(name, frame, str(path))
