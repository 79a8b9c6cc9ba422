"""The report's one device naming scheme (pagebench.results.devices)."""

from __future__ import annotations

import json

import pandas as pd

from pagebench.results import Results, devices
from pagebench.results.history import load_benchmark_json


def test_device_labels_are_short_and_one_scheme():
    assert devices.device_label("cuda", "NVIDIA H200") == "H200"
    assert devices.device_label("cuda:1", "NVIDIA H200", num_devices=2) == "2× H200"
    assert devices.device_label("cpu", "x86_64", 2) == "CPU (2-core x86_64)"
    assert devices.device_label("cpu", "x86_64", None, this_run=True) == "CPU (x86_64) · this run"
    for raw in ("cpu", "vm", "h200", "this machine (cpu)", "NVIDIA H200 [h200]",
                "x86_64 [this machine (cpu)]", "NVIDIA H200", "CPU"):
        assert not devices.is_device_label(raw), raw
    for label in ("H200", "2× H200", "CPU (2-core x86_64)", "CPU (2-core x86_64) · this run"):
        assert devices.is_device_label(label), label


def test_machine_names_alone_become_labels():
    assert devices.label_from_name("h200") == "H200"
    assert devices.label_from_name("cpu-epyc-2core") == "CPU (2-core)"
    assert devices.label_from_name("H200") == "H200"  # a label stays as it is
    assert devices.label_from_asv_machine({"cpu": "NVIDIA H200, 580; host Xeon"}, "h200") == "H200"
    assert devices.label_from_asv_machine({"arch": "x86_64", "num_cpu": "2"}, "box") == \
        "CPU (2-core x86_64)"


def test_every_dataset_gets_labels_when_added():
    r = Results()
    r.add("engine_cow", pd.DataFrame({
        "n": [1, 4, 1], "variant": ["n=1", "n=4 shared", "n=1"], "peak_blocks": [3, 4, 3],
        "machine": ["cpu", "cpu", "CPU (2-core x86_64) · this run"],
        "device": ["cpu"] * 3, "device_name": ["x86_64"] * 3, "cpu_count": [2, 2, 2]}), "x")
    r.add("kernels", pd.DataFrame({"device": ["cuda"], "device_name": ["NVIDIA H200"],
                                   "batch": [1], "context": [1], "block_size": [16],
                                   "backend": ["b-paged"], "kernel": ["b"],
                                   "layout": ["paged"], "cuda_graphs": [False],
                                   "dtype": ["bfloat16"], "model_shape": ["m"],
                                   "time_us": [1.0]}), "y")
    assert r.get("engine_cow")["machine"].tolist() == [
        "CPU (2-core x86_64)", "CPU (2-core x86_64)", "CPU (2-core x86_64) · this run"]
    assert r.get("kernels")["machine"].tolist() == ["H200"]


def test_benchmark_machines_are_labelled(tmp_path):
    box = tmp_path / "asv" / "gpu-box"
    box.mkdir(parents=True)
    (box / "machine.json").write_text(json.dumps({"cpu": "NVIDIA H100 80GB HBM3, 550"}))
    (box / "abc.json").write_text(json.dumps({
        "commit_hash": "abcdef123456", "date": 1, "params": {"machine": "gpu-box"},
        "result_columns": ["result", "params"],
        "results": {"b.T.time_x": [[1.0], [["1"]]]}}))
    (tmp_path / "pb.json").write_text(json.dumps({
        "machine_info": {"node": "vm", "cpu": {"count": 4, "arch_string_raw": "aarch64"}},
        "commit_info": {"id": "f"}, "datetime": "d",
        "benchmarks": [{"name": "t", "stats": {"median": 1e-6}}]}))
    r = Results()
    load_benchmark_json(r, [tmp_path])
    assert r.get("asv")["machine"].tolist() == ["H100 80GB HBM3"]
    assert r.get("pytest_benchmark")["machine"].tolist() == ["CPU (4-core aarch64)"]


def test_gpu_rows_name_their_timing_harness_and_older_ones_read_as_harness_1():
    from pagebench.report.sections import gpu_harnesses

    old = pd.DataFrame({"device": ["cuda", "cuda"], "time_us": [1.0, 2.0]})
    assert gpu_harnesses(old) == ["1"]  # measured before rows carried the column
    mixed = pd.DataFrame({"device": ["cuda", "cuda", "cpu"], "timing_harness": [None, 2, 2],
                          "time_us": [1.0, 2.0, 3.0]})
    assert gpu_harnesses(mixed) == ["1", "2"]
    cpu = pd.DataFrame({"device": ["cpu"], "timing_harness": [2], "time_us": [1.0]})
    assert gpu_harnesses(cpu) == []
    engine = pd.DataFrame({"device": ["cuda"], "tokens_per_s": [9.0]})  # timed end to end
    assert gpu_harnesses(engine) == []


def test_every_row_carries_the_timing_harness():
    from pagebench.measure.timing import HARNESS, environment

    assert environment("cpu")["timing_harness"] == HARNESS
