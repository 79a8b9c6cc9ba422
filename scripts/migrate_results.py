"""Rewrite committed results files (reports/data/ by default) to the schemas of
pagebench.results.datasets, once: the engine bench's old column names, ``cuda_graph``, a
``kernel`` column for kernel rows, ``n`` for copy-on-write rows, ``experiment`` = dataset name,
and one encoding of a contiguous row's block size (empty; no ``16.0``).

    PYTHONPATH=. python scripts/migrate_results.py [DIR ...]

Values are handled as text, so nothing but the changed columns is rewritten. A file already in
the schema is left byte-identical (running it twice changes nothing).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from pagebench.results.datasets import classify

# old engine-bench column -> the schema's name (every engine dataset)
ENGINE_RENAMES = {"batch_size": "batch", "prefix_caching": "enable_prefix_caching",
                  "hit_rate": "prefix_cache_hit_rate",
                  "computed_prompt_tokens": "num_computed_prompt_tokens",
                  "peak_kv_blocks": "peak_blocks", "preemptions": "num_preemptions",
                  "throughput_tokens_per_s": "tokens_per_s"}
KERNEL_FILES = ("kernels", "kernels_prefill", "sweep_rows")  # rows of run_sweep / prefill


def dataset_of(path: Path) -> str | None:
    """The schema a file follows: its report dataset, or the kernel sweep's for sweep_rows."""
    return "kernels" if path.stem.lower().startswith("sweep_rows") else classify(path)


def insert_after(frame: pd.DataFrame, after: str, name: str, values) -> pd.DataFrame:
    if name in frame.columns:
        return frame
    frame = frame.copy()
    frame.insert(frame.columns.get_loc(after) + 1 if after in frame.columns else len(frame.columns),
                 name, values)
    return frame


def integer_text(values: pd.Series) -> pd.Series:
    """'16.0' -> '16', '' stays '' (the one encoding of a row that does not page)."""
    def one(v: str) -> str:
        v = v.strip()
        if v in ("", "nan", "None", "<NA>"):
            return ""
        f = float(v)
        return str(int(f)) if f == int(f) else v
    return values.map(one)


def migrate_frame(dataset: str, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (every value a string, missing = '') in ``dataset``'s schema."""
    frame = frame.copy()
    if "block_size" in frame.columns:
        frame["block_size"] = integer_text(frame["block_size"])
    if dataset in ("kernels", "kernels_prefill"):
        frame = frame.rename(columns={"cuda_graph": "cuda_graphs"})
        # the prefill sweep's contiguous rows are its SDPA baseline, not a registry backend
        kernel = ["" if dataset == "kernels_prefill" and layout == "contiguous"
                  else b.removesuffix(f"-{layout}")
                  for b, layout in zip(frame["backend"], frame["layout"])]
        if "kernel" in frame.columns:
            frame["kernel"] = kernel
        frame = insert_after(frame, "backend", "kernel", kernel)
    if dataset.startswith("engine"):
        frame = frame.rename(columns={k: v for k, v in ENGINE_RENAMES.items()
                                      if k in frame.columns and v not in frame.columns})
        if dataset != "engine":
            frame["experiment"] = dataset
        if dataset == "engine_compare" and "batch" not in frame.columns:
            frame = insert_after(frame, "method", "batch", frame["num_requests"])
        if dataset == "engine_cow" and "n" not in frame.columns:
            n = frame["variant"].str.extract(r"^n\s*=\s*(\d+)")[0].fillna("")
            frame = insert_after(frame, "variant", "n", n)
    return frame


def migrate_csv(path: Path, dataset: str) -> bool:
    old = path.read_text(encoding="utf-8")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    new = migrate_frame(dataset, frame).to_csv(index=False, lineterminator="\n")
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old


def migrate_json(path: Path, dataset: str) -> bool:
    """A ``{"columns": [...], "rows": [{...}]}`` file as kernels.json holds (other JSON is left)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        return False

    def text(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return v if isinstance(v, str) else json.dumps(v)

    texts = {k for r in doc["rows"] for k, v in r.items() if isinstance(v, str)}
    frame = pd.DataFrame([{k: text(v) for k, v in r.items()} for r in doc["rows"]])
    frame = migrate_frame(dataset, frame)
    texts |= {"kernel", "experiment"}  # the text columns migrate_frame may add
    rows = [{k: None if v == "" else v if k in texts else json.loads(v) for k, v in r.items()}
            for r in frame.to_dict("records")]
    new = dict(doc, rows=rows)
    if "columns" in doc:
        new["columns"] = list(frame.columns)
    if new == doc:
        return False
    path.write_text(json.dumps(new, indent=1) + "\n", encoding="utf-8")
    return True


def migrate_dir(root: Path) -> list[Path]:
    """Migrate every results file under ``root``; the paths changed."""
    changed = []
    for path in sorted(root.rglob("*")):
        dataset = dataset_of(path) if path.is_file() else None
        if dataset is None:
            continue
        suffix = path.suffix.lower()
        if (suffix == ".csv" and migrate_csv(path, dataset)) or \
                (suffix == ".json" and migrate_json(path, dataset)):
            changed.append(path)
    return changed


if __name__ == "__main__":
    roots = [Path(a) for a in sys.argv[1:]] or [Path(__file__).resolve().parents[1] / "reports"
                                                 / "data"]
    for root in roots:
        for path in migrate_dir(root):
            print(f"migrated {path}")
