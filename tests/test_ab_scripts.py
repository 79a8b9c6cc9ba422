"""The same-process A/B scripts under scripts/ (their GPU runs are committed under
reports/data/h200/) still run: their CPU dry runs time every variant and check it against the
float64 reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str) -> None:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]


def test_prefill_ab_times_and_checks_a_forced_launch_and_a_peer(tmp_path):
    out = tmp_path / "new"  # created by the script
    run("h200_prefill_ab.py", "--device", "cpu", "--out", str(out), "--shape", "qwen2.5-0.5b",
        "--bf16-only", "--launch", "rows=16,one_loop=True", "--sdpa-peers", "MATH,CUDNN_ATTENTION")
    times = pd.read_csv(out / "prefill_ab.csv")
    checks = pd.read_csv(out / "prefill_ab_checks.csv")
    forced = "bf16 rows=16,one_loop=True"
    # (no cuDNN kernel on the CPU: that peer is left out, not a failure)
    assert set(times["variant"]) == {"sdpa", "sdpa MATH", "bf16 default", forced}
    assert set(checks["variant"]) == {"bf16 default", forced, "sdpa MATH"}
    assert (checks["err"] < 1e-4).all()  # fp32 on the CPU


def test_fp8_decode_stages_times_and_checks_each_depth(tmp_path):
    run("h200_fp8_decode_kv_pairs.py", str(tmp_path), "--smoke", "--stages")
    times = pd.read_csv(tmp_path / "kv_pairs_times.csv")
    checks = pd.read_csv(tmp_path / "kv_pairs_checks.csv")
    staged = times[times["variant"].str.startswith("pair_st")]
    assert sorted(staged["num_stages"]) == [2, 3, 4, 5]
    assert (staged["kv_per_program"] == 2).all()
    assert checks["finite"].all() and (checks["err"] < 2e-2).all()  # bf16 q, fp8 cache


def test_prefill_ab_times_a_copy_with_forced_options(tmp_path):
    copy = ROOT / "pagebench" / "kernels" / "triton_prefill.py"
    run("h200_prefill_ab.py", "--device", "cpu", "--out", str(tmp_path), "--shape",
        "qwen2.5-0.5b", "--bf16-only", "--copy", str(copy), "--copy-launch", "rows=16")
    times = pd.read_csv(tmp_path / "prefill_ab.csv")
    checks = pd.read_csv(tmp_path / "prefill_ab_checks.csv")
    assert set(times["variant"]) == {"sdpa", "bf16 default", "copy default", "copy rows=16"}
    assert (checks["err"] < 1e-4).all()
