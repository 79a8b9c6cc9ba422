"""The report's fp8 and layout section: verdicts computed from the data, both ways."""

from pathlib import Path

import pandas as pd

from pagebench import suite
from pagebench.analysis import analyse
from pagebench.analysis import fp8 as fp8_claims
from pagebench.analysis.claims import ARITHMETIC, evaluate
from pagebench.report import fp8
from pagebench.results import Results, classify
from pagebench.results.derived import FAILS, HOLDS, UNMEASURED, WITHIN_NOISE
from pagebench.sim.capacity import fp8_rows

ENV = {"device": "cuda", "device_name": "NVIDIA H200"}


def decode_frame(fp8_over_bf16: float) -> pd.DataFrame:
    rows = []
    for batch, context in ((32, 4096), (128, 4096), (1, 65536), (1, 1024)):
        for block in (1, 16):
            base = 100.0 * batch * context / 4096
            rows.append({**ENV, "op": "decode", "cache_dtype": "bfloat16", "batch": batch,
                         "context": context, "block_size": block, "time_us": base,
                         "copy_fraction": 0.8})
            rows.append({**ENV, "op": "decode", "cache_dtype": "float8_e4m3fn", "batch": batch,
                         "context": context, "block_size": block,
                         "time_us": base * (1.0 if context == 1024 else fp8_over_bf16),
                         "copy_fraction": 0.7, "err_vs_bf16_cache": 0.03,
                         "err_vs_dequantised": 0.002})
    return pd.DataFrame(rows)


def layout_frame(aged_slowdown: float, l2_slowdown: float) -> pd.DataFrame:
    rows = []
    for batch, foot, slow in ((64, 10**9, aged_slowdown), (1, 10**7, l2_slowdown)):
        for layout in ("contiguous", "shuffled", "aged"):
            rows.append({**ENV, "table_layout": layout, "batch": batch, "context": 4096,
                         "block_size": 16, "footprint_bytes": foot, "fits_l2": foot < 6e7,
                         "time_us": 100.0 * (slow if layout == "aged" else 1.0)})
    frame = pd.DataFrame(rows)
    return frame.assign(q20_us=0.99 * frame["time_us"], q80_us=1.01 * frame["time_us"])


def results_with(**frames) -> Results:
    r = Results()
    for name, frame in frames.items():
        r.add(name, frame, "test")
    analyse(r)
    return r


def verdict(key: str, results: Results):
    return {v.key: v for v in evaluate(results, fp8_claims.CLAIMS)}[key]


def test_fp8_time_claim_both_ways():
    assert verdict("fp8_decode_time", Results()).verdict == UNMEASURED
    assert verdict("fp8_decode_time",
                   results_with(kernels_fp8=decode_frame(0.52))).verdict == HOLDS
    c = verdict("fp8_decode_time", results_with(kernels_fp8=decode_frame(0.8)))
    assert c.verdict == FAILS and "32×4096 b16: 0.80×" in c.measured
    assert "1024" not in c.measured  # short contexts are not part of the claim


def test_fp8_time_claim_takes_the_fastest_fp8_kernel_per_point():
    """Rows without a backend are Triton's; a second fp8 kernel's rows are compared with the
    same Triton bf16 time, and the claim judges the faster fp8 kernel at each point."""
    slow = decode_frame(0.8)
    fast = slow[slow["cache_dtype"] == "float8_e4m3fn"].copy()
    fast["backend"] = "cuda-fp8"
    fast.loc[fast["context"] != 1024, "time_us"] *= 0.55 / 0.8
    frame = pd.concat([slow, fast], ignore_index=True)
    ratios = fp8_claims.decode_ratios(frame)
    assert set(ratios["backend"]) == {"triton", "cuda-fp8"}
    assert len(ratios) == 2 * 8  # every point, once per fp8 kernel
    c = verdict("fp8_decode_time", results_with(kernels_fp8=frame))
    # 0.55x with no spread recorded: ±5% on each time reaches 0.61x, past 0.6
    assert c.verdict == WITHIN_NOISE and "32×4096 b16: 0.55× (cuda-fp8)" in c.measured
    fast.loc[fast["context"] != 1024, "time_us"] *= 0.45 / 0.55
    c = verdict("fp8_decode_time", results_with(kernels_fp8=pd.concat([slow, fast])))
    assert c.verdict == HOLDS and "±5% assumed" in c.measured
    fast.loc[fast["context"] != 1024, "time_us"] *= 0.55 / 0.45
    # a kernel that is faster at one point only: the worst point's best kernel decides
    fast.loc[(fast["batch"] == 1) & (fast["context"] == 65536), "time_us"] *= 2
    c = verdict("fp8_decode_time",
                results_with(kernels_fp8=pd.concat([slow, fast], ignore_index=True)))
    assert c.verdict == FAILS and "1×65536 b16: 0.80× (triton)" in c.measured


def test_fp8_time_claim_pairs_rows_of_one_machine_and_judges_each():
    """A slower GPU's fp8 rows are never divided by a faster GPU's bf16 rows: at 0.75× on each
    GPU the claim fails, however fast the other GPU's bf16 is."""
    h200 = decode_frame(0.75)
    h100 = h200.assign(device_name="NVIDIA H100", time_us=2 * h200["time_us"])
    ratios = fp8_claims.decode_ratios(pd.concat([h200, h100], ignore_index=True))
    assert len(ratios) == 2 * 8 and set(ratios["fp8_over_bf16"].round(6)) == {0.75, 1.0}
    c = verdict("fp8_decode_time", results_with(kernels_fp8=pd.concat([h200, h100])))
    assert c.verdict == FAILS and c.device == "H100, H200"
    both = verdict("fp8_decode_time",
                   results_with(kernels_fp8=pd.concat([decode_frame(0.5), h100])))
    assert both.verdict == FAILS
    assert both.measured.endswith("b16: 0.50× (triton) (no spread recorded: ±5% assumed on "
                                  "each time) (holds)")


def test_layout_claim_leaves_l2_resident_points_out():
    ok = verdict("layout_cost", results_with(kernels_layout=layout_frame(1.05, 3.0)))
    assert ok.verdict == HOLDS and "1 L2-resident points left out" in ok.measured
    bad = verdict("layout_cost", results_with(kernels_layout=layout_frame(1.3, 1.0)))
    assert bad.verdict == FAILS and "worst 1.30×" in bad.measured
    # no spread recorded: ±5% on each time, and 1.05x (0.95-1.16) straddles 1.10
    bare = layout_frame(1.05, 3.0).drop(columns=["q20_us", "q80_us"])
    noisy = verdict("layout_cost", results_with(kernels_layout=bare))
    assert noisy.verdict == WITHIN_NOISE and "±5% assumed" in noisy.measured


def test_layout_claim_needs_every_layout_at_a_point_and_judges_each_machine():
    one_layout = layout_frame(1.0, 1.0).query("table_layout == 'contiguous'")
    assert verdict("layout_cost", results_with(kernels_layout=one_layout)).verdict == UNMEASURED
    no_aged = layout_frame(1.5, 1.0).query("table_layout != 'aged'")
    assert verdict("layout_cost", results_with(kernels_layout=no_aged)).verdict == UNMEASURED
    # a GPU where the aged table costs 30% is not outvoted by two where it costs nothing
    others = [layout_frame(1.0, 1.0).assign(device_name=f"NVIDIA {n}") for n in ("H100", "A100")]
    c = verdict("layout_cost",
                results_with(kernels_layout=pd.concat([layout_frame(1.3, 1.0), *others])))
    assert c.verdict == FAILS and "H200: worst 1.30×" in c.measured
    assert c.device == "A100, H100, H200"


def test_fp8_and_layout_claims_judge_each_run():
    """An older commit's 0.50× fp8 decode does not stand in for a newer one's 0.75×; layout
    rows of a file that recorded no commit count (a group-by dropped them)."""
    runs = pd.concat([decode_frame(0.5).assign(commit="aaaaaaa"),
                      decode_frame(0.75).assign(commit="bbbbbbb")], ignore_index=True)
    c = verdict("fp8_decode_time", results_with(kernels_fp8=runs))
    assert c.verdict == FAILS and "32×4096 b16: 0.75× (triton)" in c.measured
    assert "32×4096 b16: 0.50× (triton)" in c.measured and c.device == "H200"
    no_commit = layout_frame(1.3, 1.0)
    layouts = pd.concat([no_commit, layout_frame(1.0, 1.0).assign(commit="aaaaaaa")])
    c = verdict("layout_cost", results_with(kernels_layout=layouts))
    assert c.verdict == FAILS and "H200: worst 1.30×" in c.measured
    assert "H200: worst 1.00×" in c.measured and "over 1 points" in c.measured


def test_fp8_claims_judge_the_tables_the_section_shows_derived_once(monkeypatch):
    calls = []
    for name in ("decode_ratios", "layout_spread"):
        real = getattr(fp8_claims, name)
        monkeypatch.setattr(fp8_claims, name,
                            lambda frame, real=real, name=name: calls.append(name) or real(frame))
    results = results_with(kernels_fp8=decode_frame(0.5), kernels_layout=layout_frame(1.0, 1.0))
    assert {verdict(k, results).verdict for k in ("fp8_decode_time", "layout_cost")} == {HOLDS}
    assert sorted(calls) == ["decode_ratios", "layout_spread"]


def test_capacity_claim_from_the_planner_and_the_engine_pool():
    assert verdict("fp8_capacity", Results()).verdict == UNMEASURED
    planner = pd.DataFrame(fp8_rows())
    alone = verdict("fp8_capacity", results_with(capacity_fp8=planner))
    assert alone.verdict == HOLDS and alone.device == ARITHMETIC  # arithmetic alone
    engine = pd.DataFrame([{**ENV, "blocks_bf16": 1000, "blocks_fp8": 1500,
                            "blocks_ratio": 1.5}])
    c = verdict("fp8_capacity", results_with(capacity_fp8=planner, fp8_engine=engine))
    assert c.verdict == FAILS and "1.50×" in c.measured and c.measured.startswith("planner")
    engine_only = verdict("fp8_capacity", results_with(fp8_engine=engine))
    assert engine_only.verdict == UNMEASURED and "arithmetic" not in engine_only.device
    assert "1.50×" in engine_only.measured and "not judged" in engine_only.measured
    # every engine run is judged, not the first alone
    runs = pd.concat([engine.assign(blocks_fp8=2000, blocks_ratio=2.0), engine])
    c = verdict("fp8_capacity", results_with(capacity_fp8=planner, fp8_engine=runs))
    assert c.verdict == FAILS and "2.00×" in c.measured and "1.50×" in c.measured


def test_the_suite_adds_the_planner_rows_the_section_judges_and_shows():
    results = Results()
    suite.capacity(results)
    analyse(results)
    assert verdict("fp8_capacity", results).verdict == HOLDS
    tables = [i.table for i in fp8.section(results).items if i.table is not None]
    assert [t.data for t in tables if t.caption.startswith("Capacity planner")] == ["capacity_fp8"]


def test_section_renders_with_and_without_data():
    empty = fp8.section(results_with())
    assert any(i.kind == "nodata" for i in empty.items)
    full = fp8.section(results_with(kernels_fp8=decode_frame(0.5),
                                    kernels_layout=layout_frame(1.0, 1.0)))
    captions = [i.table.caption for i in full.items if i.table is not None]
    assert any(c.startswith("Paged decode, Triton bf16 vs each e4m3 kernel") for c in captions)
    assert any(c.startswith("Triton bf16 decode by block-table layout") for c in captions)


def test_file_names_classify_to_their_datasets():
    assert classify(Path("h200/kernels_fp8.csv")) == "kernels_fp8"
    assert classify(Path("h200/kernels_layout.csv")) == "kernels_layout"
    assert classify(Path("h200/fp8_engine.csv")) == "fp8_engine"
    assert classify(Path("h200/kernels.csv")) == "kernels"
