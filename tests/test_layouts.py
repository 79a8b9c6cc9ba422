"""Block-table layouts as a sweep axis: contiguous, shuffled, and aged (from a block manager
that has served a trace with churn); each timed point's footprint and L2 flag."""

import pytest
import torch

from pagebench.config import ceil_div
from pagebench.measure.kernel_cases import TABLE_LAYOUTS, adjacent_fraction, aged_tables, layout_tables


@pytest.mark.parametrize("layout", TABLE_LAYOUTS)
@pytest.mark.parametrize("batch, context, block_size", [(1, 1, 1), (3, 50, 4), (5, 97, 16),
                                                        (2, 300, 1)])
def test_every_layout_maps_distinct_blocks_inside_the_pool(layout, batch, context, block_size):
    tables, num_blocks = layout_tables(layout, batch, context, block_size, seed=3)
    assert tables.dtype == torch.int32
    assert tables.shape == (batch, ceil_div(context, block_size))
    assert 0 <= int(tables.min()) and int(tables.max()) < num_blocks
    assert torch.unique(tables).numel() == tables.numel()  # no block serves two positions
    again, _ = layout_tables(layout, batch, context, block_size, seed=3)
    assert torch.equal(tables, again)


def test_layouts_differ_as_named():
    contiguous, _ = layout_tables("contiguous", 8, 1024, 4)
    shuffled, _ = layout_tables("shuffled", 8, 1024, 4)
    aged, pool = layout_tables("aged", 8, 1024, 4)
    assert adjacent_fraction(contiguous) == 1.0
    assert adjacent_fraction(shuffled) < 0.05
    # decode steps in lockstep hand consecutive free blocks to different sequences
    assert adjacent_fraction(aged) < 0.5
    assert pool > 8 * 256  # other requests' blocks share the pool
    assert not torch.equal(aged.sort(dim=1).values, contiguous)


def test_aged_tables_come_from_a_churned_pool():
    """With one sequence, consecutive decode steps take consecutive free-queue blocks; after
    churn that queue is no longer in block order, so the table has many breaks."""
    tables, pool = aged_tables(1, 4000, 1, seed=0)
    breaks = int(((tables[0, 1:] - tables[0, :-1]) != 1).sum())
    assert breaks > 20 and tables.shape == (1, 4000)


def test_sweep_records_layout_footprint_and_l2_flag():
    from pagebench.measure.kernel_sweep import COLUMNS, DEFAULT_L2_BYTES, run_sweep

    df = run_sweep("cpu", quick=True, shapes={"t": (4, 2, 16)}, points=[(2, 32)],
                   block_sizes=(4,), include=["torch"], repeat=1,
                   layouts=("contiguous", "aged"))
    assert list(df.columns) == COLUMNS
    paged = df[df["layout"] == "paged"]
    assert sorted(paged["table_layout"]) == ["aged", "contiguous"]
    assert (paged["footprint_bytes"] == 2 * 2 * 32 * 2 * 16 * 4).all()
    assert paged["fits_l2"].all() and (paged["l2_bytes"] == DEFAULT_L2_BYTES).all()


def test_bench_cli_rejects_unknown_layouts():
    from pagebench.cli import main

    assert main(["bench", "--layouts", "contiguous,fragmented"]) == 2


def test_bench_cli_layout_rows_are_one_variant_and_meet_the_layout_schema(tmp_path):
    import pandas as pd

    from pagebench.cli import main
    from pagebench.results.datasets import KERNELS_LAYOUT

    out = tmp_path / "kernels_layout.csv"
    assert main(["bench", "--shape", "t=4/2/16", "--points", "2x32,1x48", "--block-sizes", "4",
                 "--backends", "torch-paged", "--layouts", "contiguous,shuffled,aged",
                 "--cuda-graphs", "only", "--repeat", "1", "--out", str(out)]) == 0
    rows = KERNELS_LAYOUT.validate(pd.read_csv(out), str(out))
    assert set(rows["backend"]) == {"torch-paged"}
    assert sorted(set(zip(rows["batch"], rows["context"]))) == [(1, 48), (2, 32)]
    assert len(rows) == 6 and set(rows["table_layout"]) == {"contiguous", "shuffled", "aged"}
    assert not rows["cuda_graphs"].any()  # a CPU has no graphs: timed eagerly


def test_graph_modes_follow_the_option_where_a_graph_can_be_used():
    from pagebench.measure.kernel_sweep import graph_modes

    assert graph_modes("both", True, True) == (False, True)
    assert graph_modes("only", True, True) == (True,)
    assert graph_modes("off", True, True) == (False,)
    assert graph_modes("only", False, True) == graph_modes("only", True, False) == (False,)
    with pytest.raises(ValueError, match="cuda_graphs: expected one of both, only, off"):
        graph_modes("always", True, True)


@pytest.mark.parametrize("argv, message", [
    (["--points", "2x"], "--points: expected comma-separated BATCHxCONTEXT pairs"),
    (["--points", "2x8", "--batches", "2", "--contexts", "8"], "not with --points"),
    (["--backends", "torch-contiguous"], "--backends: not available here"),
])
def test_bench_cli_point_and_variant_errors_name_the_option(argv, message, capsys):
    from pagebench.cli import main

    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
