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
    capacity, attention = evaluate(results, parallel_claims.CLAIMS)
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
    capacity, attention = evaluate(results, parallel_claims.CLAIMS)
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
    assert [r[4] for r in verdicts.rows] == [UNMEASURED, UNMEASURED]
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
