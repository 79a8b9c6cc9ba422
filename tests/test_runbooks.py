"""The runbooks under scripts/ call the CLI: every command they would run parses, on the GPU
path as on the CPU one, and the files they write are named for their datasets. (Running them is
a device's job; their CPU dry run, `DEVICE=cpu scripts/h200_fp8.sh OUT`, takes minutes.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagebench.results import classify

ROOT = Path(__file__).resolve().parents[1]
# stands in for the Python a runbook calls: parses `-m pagebench ...` with the CLI's parser,
# prints the arguments and runs nothing
PARSE_ONLY = """\
import sys
from pagebench.cli import build_parser
assert sys.argv[1:3] == ["-m", "pagebench"], sys.argv
build_parser().parse_args(sys.argv[3:])
print(" ".join(sys.argv[3:]))
"""


def commands(runbook: str, device: str, tmp_path: Path) -> list[list[str]]:
    stub = tmp_path / "parse_only.py"
    stub.write_text(PARSE_ONLY)
    env = os.environ | {"DEVICE": device, "PYTHON": f"{sys.executable} {stub}",
                        "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["bash", str(ROOT / runbook), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [line.split() for line in out.stdout.splitlines()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_h200_fp8_runbook_commands_parse_and_write_the_report_datasets(device, tmp_path):
    runs = commands("scripts/h200_fp8.sh", device, tmp_path)
    assert [r[:2] for r in runs] == [["bench", "--device"], ["bench", "--device"],
                                     ["engine-bench", "fp8"], ["report", "--quick"]]
    outs = [Path(r[r.index("--out") + 1]) for r in runs[:3]]
    assert [classify(p) for p in outs] == ["kernels_fp8", "kernels_layout", "fp8_engine"]
    assert all(r[r.index("--device") + 1] == device for r in runs[:3])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_gpu_serving_runbook_commands_parse_and_write_the_serving_datasets(device, tmp_path):
    runs = commands("scripts/gpu_serving.sh", device, tmp_path)
    assert [r[0] for r in runs] == ["serve-bench"] * 4 + ["step-cost-fit"]
    *serves, fit = runs
    out = lambda run, flag: Path(run[run.index(flag) + 1])  # noqa: E731
    # every part appends to the same two files, which the fit reads and validates against
    assert {out(r, "--out") for r in serves} == {out(fit, "--validate")}
    assert {out(r, "--steps-out") for r in serves} == {Path(fit[1])}
    assert all("--append" in r and r[r.index("--device") + 1] == device for r in serves)
    assert [classify(p) for p in (out(fit, "--validate"), Path(fit[1]), out(fit, "--out"),
                                  out(fit, "--predictions-out"))] == [
        "serve_bench", "serve_steps", "step_cost", "serve_bench"]
    value = lambda run, flag: run[run.index(flag) + 1]  # noqa: E731
    grid = [(value(r, "--block-sizes"), value(r, "--kv-cache-dtype") if "--kv-cache-dtype" in r
             else "auto", value(r, "--prefix-caching")) for r in serves[:3]]
    assert grid == [("16,128", "auto,fp8_e4m3", "on"), ("16,128", "auto", "off"),
                    ("1", "auto", "off")]
    if device == "cuda":
        assert value(serves[3], "--model") == "llama-3-8b"
        assert len(value(serves[3], "--rates").split(",")) >= 4
        assert int(value(serves[3], "--repeats")) >= 2  # the validation points, repeated
        assert (value(serves[3], "--slo-ttft"), value(serves[3], "--slo-tpot")) == ("1000", "50")
