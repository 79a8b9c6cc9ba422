"""The registry's promise: a backend registered from outside the package, with what the sweeps
need declared at registration (a prepare hook, the block sizes to time it at, where it is a
real kernel), is timed by the decode and prefill sweeps with no change to either."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from pagebench.kernels import register_backend, registered_backends, unregister_backend
from pagebench.measure.kernel_cases import paged_case, relative_error
from pagebench.measure.prefill_sweep import PREFILL_COLUMNS, run_prefill_sweep
from pagebench.kernels.reference import (reference_decode, torch_paged_decode,
                                         torch_paged_prefill)
from pagebench.measure.kernel_sweep import COLUMNS, run_sweep, variants

SHAPE = (4, 2, 16)
MEASURE = pathlib.Path(__file__).resolve().parents[1] / "pagebench" / "measure"


@pytest.fixture
def toy():
    """A third-party backend whose decode and prefill prepare per-input state once (here a
    copy of the lengths) and whose unprepared kernels must never be what the sweeps time."""
    log = {"prepared": [], "timed": 0, "unprepared": 0}

    def decode(*args):
        log["unprepared"] += 1
        return torch_paged_decode(*args)

    def prefill(*args):
        log["unprepared"] += 1
        return torch_paged_prefill(*args)

    def prepare(kernel, op):
        def hook(q, k_cache, v_cache, tables, seq_lens, *rest):
            lens = seq_lens.clone()  # the state a real backend would build once (a plan)
            log["prepared"].append((op, k_cache.shape[1]))

            def call():
                log["timed"] += 1
                return kernel(q, k_cache, v_cache, tables, lens, *rest)
            return call
        return hook

    register_backend("toy", decode=decode, prefill=prefill, devices=("cpu",),
                     dtypes=(torch.float32,),
                     prepare={"decode": prepare(torch_paged_decode, "decode"),
                              "prefill": prepare(torch_paged_prefill, "prefill")},
                     sweep_block_sizes=(8,), description="test backend")
    yield log
    unregister_backend("toy")


def test_a_third_party_backend_is_timed_by_the_decode_sweep_through_its_hook(toy):
    df = run_sweep("cpu", shapes={"t": SHAPE}, points=[(2, 32)], block_sizes=(4, 8, 16),
                   include=["toy", "sdpa"], repeat=2)
    assert list(df.columns) == COLUMNS
    paged = df[df.backend == "toy-paged"]
    assert set(df.backend) == {"toy-paged", "sdpa-contiguous"}
    assert list(paged.block_size) == [8]  # its declared sweep_block_sizes, of the three asked
    assert (paged.time_us > 0).all() and not paged.cuda_graphs.any()
    assert toy["prepared"] == [("decode", 8)]  # one prepared call for the one case
    assert toy["timed"] >= 2 and toy["unprepared"] == 0


def test_a_third_party_backend_is_timed_by_the_prefill_sweep_through_its_hook(toy):
    df = run_prefill_sweep("cpu", shapes={"t": SHAPE}, points=[(2, 3, 5)], block_size=4,
                           repeat=2, include=["toy"])
    assert list(df.columns) == PREFILL_COLUMNS
    assert set(df.backend) == {"toy-paged", "sdpa-contiguous"}
    assert toy["prepared"] == [("prefill", 4)] and toy["timed"] >= 2
    assert toy["unprepared"] == 0


def test_prepared_call_computes_what_the_kernel_does(toy):
    case = paged_case(2, 21, SHAPE, 8, torch.float32, "cpu", seed=3)
    call = registered_backends()["toy"].prepared_call("decode", *case.args(), 0.25)
    assert relative_error(call(), reference_decode(*case.args(), 0.25)) < 1e-5
    with pytest.raises(ValueError, match="op"):
        registered_backends()["sdpa"].prepared_call("decode", *case.args(), 0.25)


def test_a_backend_that_is_no_real_kernel_here_is_timed_only_when_named():
    register_backend("interpreted", decode=torch_paged_decode, auto_devices=("cuda",))
    try:
        assert "interpreted-paged" not in {v.label for v in variants("cpu")}
        assert "interpreted-paged" in {v.label for v in variants("cpu", exclude=())}
        df = run_prefill_sweep("cpu", shapes={"t": SHAPE}, points=[(1, 4, 0)], repeat=1)
        assert "interpreted-paged" not in set(df.backend)
    finally:
        unregister_backend("interpreted")


def test_the_sweeps_time_a_backend_only_on_inputs_it_accepts():
    """A backend restricting head and block sizes (``Backend.supports``) is timed by neither
    sweep on an input it rejects, only on those it accepts."""
    register_backend("narrow", decode=torch_paged_decode, prefill=torch_paged_prefill,
                     devices=("cpu",), dtypes=(torch.float32,),
                     supports_head_dim=lambda d: d == SHAPE[2],
                     supports_block_size=lambda bs: bs == 8)
    shapes = {"t": SHAPE, "wide": (4, 2, 2 * SHAPE[2])}
    try:
        df = run_sweep("cpu", shapes=shapes, points=[(1, 32)], block_sizes=(4, 8),
                       include=["narrow"], repeat=1)
        assert set(zip(df.model_shape, df.block_size)) == {("t", 8)}
        for block_size, timed in ((8, {"t"}), (4, set())):
            df = run_prefill_sweep("cpu", shapes=shapes, points=[(1, 4, 0)],
                                   block_size=block_size, include=["narrow"], repeat=1)
            assert set(df[df.backend == "narrow-paged"].model_shape) == timed
            assert set(df[df.backend == "sdpa-contiguous"].model_shape) == set(shapes)
    finally:
        unregister_backend("narrow")


@pytest.mark.parametrize("kwargs, message", [
    (dict(graph_capturable=("prefill",)), "graph_capturable"),
    (dict(prepare={"contiguous": lambda *a: None}), "prepare"),
    (dict(prepare={"decode": 3}), "prepare"),
    (dict(sweep_block_sizes=()), "sweep_block_sizes"),
    (dict(sweep_block_sizes=(0, 16)), "sweep_block_sizes"),
    (dict(scratch_ratio=-1.0), "scratch_ratio"),
    (dict(scratch_ratio=float("nan")), "scratch_ratio"),
    (dict(scratch_ratio="2"), "scratch_ratio"),
    (dict(graph_capturable="decode"), "graph_capturable"),
    (dict(prepare=[("decode", print)]), "prepare"),
])
def test_register_backend_rejects_bad_sweep_declarations(kwargs, message):
    with pytest.raises(ValueError, match=message):
        register_backend("bad", decode=torch_paged_decode, **kwargs)
    assert "bad" not in registered_backends()


def test_the_sweeps_name_no_backend():
    """No string in the sweeps' code equals a registered backend's name: what differs between
    backends is declared in the registry."""
    names = set(registered_backends())
    for module in ("kernel_sweep.py", "prefill_sweep.py"):
        tree = ast.parse((MEASURE / module).read_text())
        found = {node.value for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and node.value in names}
        assert not found, f"{module} names backends {sorted(found)}"
