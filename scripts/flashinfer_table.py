"""The short table gpu_flashinfer.sh prints last: each point's fastest backend and every
backend's time relative to it, from the CSVs of scripts/gpu_flashinfer.py.

    python scripts/flashinfer_table.py DIR     (DIR: the CSVs, or a results.tar.gz holding them)
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from pagebench.analysis.derive import relative_to_fastest

DECODE_KEYS = ["model_shape", "kv_dtype", "lengths", "batch", "context", "block_size"]
PREFILL_KEYS = ["model_shape", "lengths", "batch", "query_len", "cached"]


def frame(folder: Path, name: str) -> pd.DataFrame:
    path = folder / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def show(title: str, df: pd.DataFrame, keys: list[str], point_keys: list[str]) -> None:
    if df.empty:
        print(f"{title}: no rows")
        return
    rel = relative_to_fastest(df, point_keys)
    table = rel.pivot_table(index=keys, columns="backend", values="relative_time",
                            aggfunc="first", dropna=False)
    print(f"\n{title}: time / fastest at the point (1.00 = fastest)")
    print(table.dropna(how="all").round(2).to_string())


def main(arg: str) -> int:
    folder = Path(arg)
    if folder.is_file():
        tmp = Path(tempfile.mkdtemp())
        with tarfile.open(folder) as tar:
            tar.extractall(tmp, filter="data")
        folder = tmp
    decode = pd.concat([frame(folder, "kernels_flashinfer"), frame(folder, "kernels_flashinfer_fp8")])
    if not decode.empty:
        # contiguous rows hold no block size: compared at every block size of their point
        show("decode", decode, DECODE_KEYS, [k for k in DECODE_KEYS if k != "block_size"])
    show("prefill", frame(folder, "kernels_prefill_flashinfer"), PREFILL_KEYS, PREFILL_KEYS)
    plans = frame(folder, "kernels_plan_flashinfer")
    if not plans.empty:
        print("\nFlashInfer plan (host us): median over points",
              plans.groupby("backend")[["plan_us", "replan_us"]].median().round(1).to_dict())
    for name in ("kernels_equivalence_flashinfer", "kernels_equivalence_fp8_flashinfer",
                 "kernels_prefill_equivalence_flashinfer"):
        checks = frame(folder, name)
        if not checks.empty:
            bad = checks[~checks["ok"].astype(bool)]
            print(f"{name}: {len(checks) - len(bad)}/{len(checks)} within tolerance"
                  + "".join(f"\n  FAILED {r['backend']} {r.to_dict()}" for _, r in bad.iterrows()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
