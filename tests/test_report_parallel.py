"""The report's "Past one GPU" section: verdicts from two-GPU data, "No data" without it."""

import pandas as pd
import pytest

from pagebench.analysis import analyse
from pagebench.analysis import parallel as parallel_claims
from pagebench.analysis.claims import evaluate
from pagebench.report import parallel
from pagebench.results import Results, load_data_dir
from pagebench.results.derived import FAILS, HOLDS, UNMEASURED
from pagebench.sim.capacity import tensor_parallel_rows

GPU = dict(device="cuda:0", device_name="NVIDIA H200")


def write_h200x2(root, attention_ratio=0.5):
    d = root / "h200x2"
    d.mkdir(parents=True)
    pd.DataFrame([GPU | dict(tp=1, kv_heads_per_gpu=8, num_blocks_per_gpu=8192),
                  GPU | dict(tp=2, kv_heads_per_gpu=4, num_blocks_per_gpu=16384)]
                 ).to_csv(d / "tp_capacity.csv", index=False)
    pd.DataFrame([GPU | dict(tp=tp, batch=b, per_step_us=100.0 * b * (attention_ratio
                                                                     if tp == 2 else 1))
                  for b in (1, 256) for tp in (1, 2)]).to_csv(d / "tp_attention.csv",
                                                              index=False)
    pd.DataFrame([GPU | dict(tp=tp, batch=b, tokens_per_s=10.0 * b * tp, time_s=1.0)
                  for b in (1, 16) for tp in (1, 2)]).to_csv(d / "tp_throughput.csv",
                                                             index=False)
    pd.DataFrame([dict(gpus=1, wall_s=100.0, rows=10, points=4),
                  dict(gpus=2, wall_s=55.0, rows=10, points=4)]).to_csv(d / "sweep_wall.csv",
                                                                       index=False)
    pd.DataFrame([GPU | dict(batch=1, context=4096, backend="x", time_us=1.0)]).to_csv(
        d / "sweep_rows.csv", index=False)


def loaded(root) -> Results:
    """The data under ``root`` and the planner's rows, as ``pagebench report`` gathers them."""
    results = Results()
    load_data_dir(results, root)
    results.add("capacity_tp", pd.DataFrame(tensor_parallel_rows()), "planner")
    analyse(results)
    return results


def test_verdicts_hold_on_doubled_blocks_and_halved_attention(tmp_path):
    write_h200x2(tmp_path)
    results = loaded(tmp_path)
    assert results.get("kernels") is None  # the split sweep's rows are not decode data here
    capacity, attention, _ = evaluate(results, parallel_claims.CLAIMS)
    assert capacity.verdict == HOLDS and "8,192 → 16,384" in capacity.measured
    assert capacity.device == "H200"  # the device label (pagebench.results.devices)
    assert attention.verdict == HOLDS and "batch 256: 0.50×" in attention.measured
    s = parallel.section(results)
    assert not [i for i in s.items if i.kind == "nodata"]
    assert len(s.plots) == 1
    wall = next(i.table for i in s.items if i.kind == "table" and i.table.data == "sweep_wall")
    assert wall.rows[1][wall.columns.index("speedup")] == "1.82"


def test_attention_that_does_not_halve_fails(tmp_path):
    write_h200x2(tmp_path, attention_ratio=0.9)
    assert evaluate(loaded(tmp_path), parallel_claims.CLAIMS)[1].verdict == FAILS


def test_capacity_pairs_tp_rows_of_one_kv_budget():
    """Two budgets, each 1.5× or 4.1×: the largest tp=2 over the largest tp=1 (2.00×) is no
    measurement of either."""
    rows = [GPU | dict(kv_memory_budget_bytes=budget, tp=tp, num_blocks_per_gpu=n)
            for budget, b1, b2 in ((2**34, 8192, 12000), (2**33, 4000, 16384))
            for tp, n in ((1, b1), (2, b2))]
    results = Results()
    results.add("tp_capacity", pd.DataFrame(rows), "two budgets")
    capacity = evaluate(results, parallel_claims.CLAIMS)[0]
    assert capacity.verdict == FAILS
    assert "8,192 → 12,000 blocks per GPU in 16 GiB (1.46×) (does not hold)" in capacity.measured
    assert "4,000 → 16,384 blocks per GPU in 8 GiB (4.10×)" in capacity.measured


def test_tp_claims_pair_rows_of_one_machine_and_judge_each():
    """H200 0.3× and H100 0.7× attention both fail: their pooled medians (0.50×) must not
    hold; nor do one GPU's tp=1 blocks and another's tp=2 blocks make 2.00×."""
    h100 = dict(device="cuda:0", device_name="NVIDIA H100")
    attention = [gpu | dict(tp=tp, batch=b, per_step_us=100.0 * b * (r if tp == 2 else 1))
                 for gpu, r in ((GPU, 0.3), (h100, 0.7)) for b in (1, 256) for tp in (1, 2)]
    capacity = [gpu | dict(tp=tp, num_blocks_per_gpu=n)
                for gpu, blocks in ((GPU, (8192, 12000)), (h100, (4000, 16384)))
                for tp, n in zip((1, 2), blocks)]
    results = Results()
    results.add("tp_attention", pd.DataFrame(attention), "two GPUs")
    results.add("tp_capacity", pd.DataFrame(capacity), "two GPUs")
    capacity, attention, _ = evaluate(results, parallel_claims.CLAIMS)
    assert attention.verdict == FAILS and attention.device == "H100, H200"
    assert "H200: tp=2 / tp=1 per step: batch 1: 0.30×, batch 256: 0.30× (largest batch " \
        "0.30× (0.27–0.33, ±5% assumed)) (does not hold)" in attention.measured
    assert capacity.verdict == FAILS and "H100: 4,000 → 16,384" in capacity.measured


def test_section_without_data_says_no_data_and_keeps_the_planner(tmp_path):
    results = loaded(tmp_path)
    s = parallel.section(results)
    assert [i.text for i in s.items if i.kind == "nodata"] == [
        f"No data: two-GPU measurements ({parallel.SOURCE})"]
    verdicts = next(i.table for i in s.items if i.kind == "table")
    # columns: claim, kind, measured, device, verdict, ...
    assert [r[4] for r in verdicts.rows] == [UNMEASURED] * 3
    assert any(i.table.data == "capacity_tp" for i in s.items if i.kind == "table")
    nothing = Results()
    analyse(nothing)
    assert [i.text for i in parallel.section(nothing).items if i.kind == "nodata"][-1] == \
        f"No data: {parallel.PLANNER.missing}"
    planner = pd.DataFrame(tensor_parallel_rows())
    eight = planner[(planner["model"] == "llama-3-8b")]
    assert eight.set_index("tensor_parallel_size")["kv_replication"].to_dict()[16] == 2
    assert float(eight.set_index("tensor_parallel_size").loc[2, "blocks_vs_tp1"]) == \
        pytest.approx(2.15, abs=0.01)


def test_allreduce_set_against_the_graph_decode_step(tmp_path):
    write_h200x2(tmp_path)
    d = tmp_path / "h200x2"
    pd.DataFrame([GPU | dict(tp=2, mode="tp=2, CUDA graphs", batch=16, tokens_per_s=1.0,
                             decode_tokens_per_s=1600.0)]).to_csv(d / "tp_throughput.csv",
                                                                  index=False)
    pd.DataFrame([GPU | dict(batch=16, step_ms=20.0, allreduce_calls_per_step=64,
                             isolated_allreduce_us=25.0)]).to_csv(d / "tp_allreduce.csv",
                                                                  index=False)
    frame = loaded(tmp_path).get("tp_allreduce_step")
    assert frame["graph_decode_step_ms"].iloc[0] == pytest.approx(10.0)  # 16 / 1600 tokens/s
    assert frame["isolated_share_of_graph_step"].iloc[0] == pytest.approx(0.16)  # 64 x 25 us


EIGHT_B = "llama-3-8b-random"
# tokens/s per (mode, batch): replicas win at batch 1, tp=2 at batch 256
TPUT = {("tp=1, CUDA graphs", 1): 130.0, ("tp=1, CUDA graphs", 256): 8700.0,
        ("tp=2, CUDA graphs", 1): 120.0, ("tp=2, CUDA graphs", 256): 17000.0,
        ("2 replicas, CUDA graphs", 1): 131.0, ("2 replicas, CUDA graphs", 256): 16000.0,
        ("tp=2, eager", 256): 5000.0}


def write_choice(root, modes=None, alone=True, bandwidth=True):
    d = root / "h200x2"
    d.mkdir(parents=True)
    rows = [GPU | dict(model=EIGHT_B, tp=2 if mode.startswith("tp=2") else 1, mode=mode,
                       batch=b, tokens_per_s=t, decode_tokens_per_s=t * 2, time_s=1.0,
                       baseline_alone=alone if mode.startswith("tp=1") else None)
            for (mode, b), t in TPUT.items() if modes is None or mode in modes]
    pd.DataFrame(rows).to_csv(d / "tp_throughput.csv", index=False)
    if bandwidth:  # hidden 4096, bf16: batch 1 = 8 KiB, batch 256 = 2 MiB
        pd.DataFrame([GPU | dict(model="llama-3-8b", world=2, backend="nccl", batch=b,
                                 hidden=4096, bytes=b * 4096 * 2, time_us=us,
                                 busbw_gbps=b * 8192 / us / 1e3)
                      for b, us in ((1, 10.0), (64, 20.0), (512, 60.0))]
                     ).to_csv(d / "tp_allreduce_bw.csv", index=False)


def section_texts(results):
    return [i.text for i in parallel.section(results).items if i.kind == "text"]


def test_choice_names_the_better_use_of_two_gpus_per_batch(tmp_path):
    write_choice(tmp_path)
    results = loaded(tmp_path)
    choice = results.get("tp_choice").set_index("batch")
    assert choice.loc[1, "choice"] == "2 replicas"  # 131 vs 120 tokens/s
    assert choice.loc[256, "choice"] == "tp=2"
    assert choice.loc[256, "tp2_speedup"] == pytest.approx(17000 / 8700)
    assert choice["baseline_alone"].all()
    verdict = evaluate(results, parallel_claims.CLAIMS)[2]
    assert verdict.verdict == HOLDS and "batch 256: 17,000 vs 8,700 tokens/s (1.95×)" in \
        verdict.measured
    texts = section_texts(results)
    answer = next(t for t in texts if t.startswith("tp=2 or two replicas?"))
    assert f"{EIGHT_B} on " in answer and "batch 256: tp=2 (tp=2 1.95×, 2 replicas 1.84× " \
        "one GPU)" in answer
    todo = next(t for t in texts if t.startswith("Runs still to make"))
    assert EIGHT_B not in todo and "all-reduce" not in todo  # only the 0.5B shape's runs
    assert todo.count("qwen2.5-0.5b-random: ") == 3


def test_step_model_is_half_the_graph_step_plus_the_all_reduces(tmp_path):
    write_choice(tmp_path)
    model = loaded(tmp_path).get("tp_step_model").set_index("batch")
    # batch 256: one GPU's step 256 / 17,400 tokens/s; all-reduce of 2 MiB interpolated
    # between 64 (20 us) and 512 (60 us) sequences' sizes: 20 + 40 * 192 / 448 us, 64 a step
    step = 256 / 17400 * 1e3
    reduce_ms = 64 * (20 + 40 * 192 / 448) / 1e3
    assert model.loc[256, "predicted_tp2_step_ms"] == pytest.approx(step / 2 + reduce_ms)
    assert model.loc[256, "measured_tp2_step_ms"] == pytest.approx(256 / 34000 * 1e3)
    assert model.loc[1, "allreduce_bytes"] == 8192


def test_section_lists_the_runs_still_missing(tmp_path):
    write_choice(tmp_path, modes={"tp=1, CUDA graphs", "tp=2, eager"}, alone=False,
                 bandwidth=False)
    texts = section_texts(loaded(tmp_path))
    todo = next(t for t in texts if t.startswith("Runs still to make"))
    assert "all-reduce bandwidth" in todo
    assert f"{EIGHT_B}: tp=2 with CUDA graphs" in todo
    assert f"{EIGHT_B}: two replicas with CUDA graphs" in todo
    assert f"{EIGHT_B}: the one-GPU baseline again, alone" in todo
    assert f"{EIGHT_B}: one GPU with CUDA graphs" not in todo
    assert "qwen2.5-0.5b-random: tp=2 with CUDA graphs" in todo  # a shape not run at all
    assert not any(t.startswith("tp=2 or two replicas?") for t in texts)
    nothing = Results()
    analyse(nothing)
    todo = next(t for t in section_texts(nothing) if t.startswith("Runs still to make"))
    assert todo.count("for the 0.5B and Llama-3-8B shapes") == 3


def test_throughput_plot_draws_a_panel_per_model():
    rows = [dict(model=m, mode=mode, batch=b, tokens_per_s=float(b))
            for m in (EIGHT_B, "qwen2.5-0.5b-random") for (mode, b) in TPUT]
    plot = parallel.throughput_plot(pd.DataFrame(rows))
    titles = [axes.get("title") for axes in plot.axes]
    assert len(titles) == 2 and all(EIGHT_B in t or "qwen2.5-0.5b" in t for t in titles), titles
