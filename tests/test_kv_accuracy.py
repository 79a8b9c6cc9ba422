"""The trained model's corpus rule and the accuracy measurement through the paged cache."""

from __future__ import annotations

import torch

from pagebench.engine import trained_model
from pagebench.measure import kv_accuracy
from pagebench.measure.engine_bench import tiny_model


def test_held_out_files_are_fixed_by_path_and_disjoint_from_training():
    train, held = trained_model.corpus_files(False), trained_model.corpus_files(True)
    assert held and len(train) > 10 * len(held)
    assert not set(train) & set(held)
    root = trained_model.stdlib_dir()
    assert all(trained_model.is_held_out(p.relative_to(root).as_posix()) for p in held)
    windows = trained_model.windows(4, 64)
    assert windows == trained_model.windows(4, 64)
    assert all(w[0] == trained_model.BOS and len(w) == 64 for w in windows)
    assert max(max(w) for w in windows) < trained_model.VOCAB_SIZE


def test_cached_logits_equal_the_models_own_forward_at_every_block_size():
    """fp32 cache: the paged path (every attention read back from the cache) gives the
    logits of the model's own forward pass, position by position."""
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    windows = [torch.randint(0, 1024, (n,), generator=g).tolist() for n in (37, 20)]
    with torch.no_grad():
        want = torch.cat([model(input_ids=torch.tensor([w])).logits[0] for w in windows])
    for block_size in (1, 16):
        got = kv_accuracy.cached_logits(model, windows, block_size, "auto")
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_an_fp8_cache_changes_the_logits_but_not_most_predictions():
    model = tiny_model()  # random weights, wide logits: few near-ties
    windows = [list(range(1, 41))]
    exact = kv_accuracy.cached_logits(model, windows, 16, "auto")
    fp8 = kv_accuracy.cached_logits(model, windows, 16, "fp8_e4m3")
    err = (fp8 - exact).abs().max() / exact.abs().max()
    assert 0 < err < 0.5
    assert (fp8.argmax(-1) == exact.argmax(-1)).float().mean() > 0.8


def test_the_shipped_model_predicts_held_out_text_and_the_rows_have_the_schema():
    rows = kv_accuracy.accuracy_rows(num_windows=2, length=128, block_sizes=(16,),
                                     pairs=(("fp8_e4m3", "bfloat16"),))
    row, = rows
    assert (row["kv_dtype"], row["reference_dtype"], row["block_size"]) == ("fp8_e4m3",
                                                                            "bfloat16", 16)
    assert row["tokens"] == 2 * 127 and 0.5 < row["top1_agreement"] <= 1
    # a byte model with real structure: far below the 260-way vocabulary's uniform guess
    assert 1 < row["perplexity_reference"] < 5 and 1 < row["perplexity"] < 5


def test_cli_writes_the_dataset_and_refuses_a_window_past_the_model(tmp_path, capsys):
    import json

    import pandas as pd

    from pagebench.cli import main
    from pagebench.results import DATASETS

    out = tmp_path / "kv_accuracy.csv"
    assert main(["kv-accuracy", "--windows", "1", "--length", "32", "--block-sizes", "16",
                 "--json", "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["kv_dtype"] for r in rows] == ["bfloat16", "fp8_e4m3", "fp8_e5m2"]
    DATASETS["kv_accuracy"].validate(pd.read_csv(out), "test")
    assert main(["kv-accuracy", "--length", "2000"]) == 2
    assert "--length" in capsys.readouterr().err
