"""The Triton kernels compile for NVIDIA GPUs (sm_80, sm_90) on every input the validation and
the backend registry accept there.

Interpreted on the CPU, a kernel runs whatever its types: the interpreter does not check, for
instance, that a loop-carried value keeps its type, which the GPU compiler refuses (int64
lengths once broke the prefill kernel on the H200 only). Triton's compiler and ``ptxas`` need
no GPU: a child process with ``TRITON_INTERPRET=0`` calls the public wrappers on CPU tensors,
catches each launch Triton would make, and compiles it for the architecture instead, with
``torch.cuda.get_device_capability`` answering as that GPU would (so the registry's fp8 rule and
the kernels' choice of conversion instruction follow it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pagebench.kernels import available_backends

CHILD = textwrap.dedent(r'''
    import json, sys
    import torch
    from pagebench.measure.kernel_cases import make_paged_inputs, quantized_inputs
    from pagebench.kernels import registered_backends, triton_decode
    from pagebench.measure.offline_compile import captured_launches, compile_for_arch
    from pagebench.kernels.triton_decode import DecodeLaunch, triton_paged_decode
    from pagebench.kernels.reference import cumulative_offsets
    from pagebench.kernels.triton_prefill import PrefillLaunch, triton_paged_prefill

    ARCH = int(sys.argv[1])
    sys.path.insert(0, sys.argv[2])  # property_tests: the launches prefill_launch picks on a GPU
    from kernel_cases import PREFILL_LAUNCHES
    CUDA = torch.device("cuda", 0)
    torch.cuda.get_device_capability = lambda device=None: divmod(ARCH, 10)
    triton_decode.hardware_fp8_convert = lambda device: ARCH >= 89
    # the ragged grid on these short tables too
    triton_decode.RAGGED_MIN_SPLIT_TILES = triton_decode.RAGGED_MIN_FUSED_SPLIT_TILES = 1

    def captured_first(call):
        """``call`` on a new plan, as if a CUDA graph captured it: no counters yet, so the split
        kernel without the merge and then the combine kernel."""
        def run():
            triton_decode._PLANS.clear()
            triton_decode._capturing = lambda device: True
            try:
                call()
            finally:
                triton_decode._capturing = capturing
        return run

    capturing = triton_decode._capturing

    def case(dtype, tables, lens, cache=None, shape=(8, 2, 64)):
        """Decode (one split, three merged by the last, three captured first) and prefill calls
        on one input."""
        q_heads, _, head_dim = shape
        inp = make_paged_inputs([1, 37, 200], *shape, 16, dtype, seed=1)
        if cache is not None:
            inp = quantized_inputs(inp, cache, seed=1)
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_tables.to(tables),
                inp.seq_lens.to(lens))
        scales = {} if cache is None else dict(k_scale=inp.k_scale, v_scale=inp.v_scale)
        q = torch.randn(85, q_heads, head_dim).to(dtype)
        starts = cumulative_offsets([1, 20, 64], dtype=lens)
        name = f"{dtype} cache={cache} tables={tables} seq_lens={lens} shape={shape}"
        calls = [(f"decode splits={n} {name}",
                  lambda n=n: triton_paged_decode(*args, 0.125, **scales,
                                                  launch=DecodeLaunch(num_splits=n)))
                 for n in (1, 3)]
        calls.append((f"decode splits=3 captured first {name}", captured_first(calls[-1][1])))
        # the default split count on tiles small enough to split here: per-sequence splits
        # read from the lengths on the device (merged by the split kernel or the combine)
        calls.append((f"decode ragged default {name}", lambda: triton_paged_decode(
            *args, 0.125, **scales, launch=DecodeLaunch(tile_n=16))))
        calls.append((f"decode ragged default captured first {name}",
                      captured_first(calls[-1][1])))
        every_launch = (dtype, tables, lens, cache, shape) == (torch.bfloat16, I64, I64, None,
                                                               (8, 2, 64))
        forced = ([None, *(PrefillLaunch(**launch, lazy_rescale=lazy)  # each with both rescales
                           for launch in PREFILL_LAUNCHES.values() for lazy in (False, True))]
                  if every_launch else [None])
        calls += [(f"prefill {launch} {name}", lambda launch=launch: triton_paged_prefill(
            q, *args[1:], starts, 0.125, **scales, launch=launch)) for launch in forced]
        accepted = registered_backends()["triton"].supports("decode", CUDA, dtype,
                                                            cache_dtype=cache)
        return calls if accepted else [(name, None)]  # refused: resolve names the reason

    I32, I64 = torch.int32, torch.int64
    cases = [c for tables, lens in ((I32, I32), (I32, I64), (I64, I32), (I64, I64))
             for c in case(torch.bfloat16, tables, lens)]
    cases += [c for dtype, cache in ((torch.float16, None), (torch.float32, None),
                                     (torch.bfloat16, torch.float8_e4m3fn),
                                     (torch.bfloat16, torch.float8_e5m2))
              for c in case(dtype, I64, I64, cache)]
    # the Llama-3-8B shape: head dim 128 and 4-row groups (fp8 caches: two KV heads a program;
    # there Triton 3.6, the H200's, failed to compile an earlier merge with a loop of maxima,
    # which this machine's Triton compiled: run this file under the GPU's Triton too)
    cases += [c for cache in (None, torch.float8_e4m3fn, torch.float8_e5m2)
              for c in case(torch.bfloat16, I64, I64, cache, shape=(32, 8, 128))]
    results = []
    for name, call in cases:
        if call is None:
            results.append([name, "", "refused"])
            continue
        with captured_launches() as launches:
            call()
        if not launches:
            results.append([name, "", "launched no kernel"])
        for kernel, args, kwargs in launches:
            try:
                compile_for_arch(kernel, args, kwargs, ARCH)
                results.append([name, kernel.__name__, ""])
            except Exception as e:
                results.append([name, kernel.__name__, f"{type(e).__name__}: {str(e)[-400:]}"])
    print(json.dumps(results))
''')


@pytest.mark.slow
@pytest.mark.skipif("triton" not in available_backends(), reason="triton not installed")
@pytest.mark.parametrize("arch", [80, 90])  # A100, H100/H200
def test_triton_kernels_compile_for_every_input_accepted_on(arch):
    env = dict(os.environ, TRITON_INTERPRET="0")
    property_tests = Path(__file__).resolve().parent.parent / "property_tests"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(arch), str(property_tests)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    refused = [name for name, _, error in results if error == "refused"]
    compiled = [r for r in results if r[2] != "refused"]
    assert {kernel for _, kernel, _ in compiled} == {"_decode_split_kernel", "_combine_kernel",
                                                     "_prefill_kernel"}
    failed = [f"{name}: {kernel}: {error}" for name, kernel, error in compiled if error]
    assert not failed, "\n".join(failed)
    # the registry refuses e4m3 exactly where Triton cannot compile it
    assert all("float8_e4m3fn" in name for name in refused)
    assert len(refused) == (2 if arch < 89 else 0)  # the two e4m3 cases


SPILLS = textwrap.dedent(r'''
    import json
    from pagebench.defaults import SHAPES
    from pagebench.measure.offline_compile import prefill_reports
    points = [(1, 2048, 0), (2, 2048, 0), (4, 2048, 0), (1, 512, 0), (8, 512, 0), (16, 512, 0),
              (32, 128, 0), (64, 128, 0), (128, 128, 0), (64, 256, 0), (8, 256, 2048),
              (1, 512, 3584)]
    print(json.dumps({shape: prefill_reports(SHAPES[shape], points)
                      for shape in ("llama-3-8b", "qwen2.5-0.5b")}))
''')


@pytest.mark.slow
@pytest.mark.skipif("triton" not in available_backends(), reason="triton not installed")
def test_prefill_launches_picked_for_an_h200_spill_nothing():
    """Compiled for sm_90 as ``prefill_launch`` picks them on an H200, for the Llama-3-8B and
    Qwen2.5-0.5B shapes: no launch spills, the long-chunk one (128 rows on 128 registers) at
    one, two or four sequences included (docs/kernels.md, "Launch rules")."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", SPILLS], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    for shape, rows in reports.items():
        assert {r["kernel"] for r in rows} == {"_prefill_kernel"}
        long_chunks = [r for r in rows if r["query_len"] == 2048]
        assert all(r["ROWS"] == (128 if shape == "llama-3-8b" else 64) for r in long_chunks)
        spilled = [(r["batch"], r["query_len"], r["spill_stores"]) for r in rows
                   if (r["spill_stores"] or r["spill_loads"]) and not long_chunk_spill(
                       r["ROWS"], r["TILE_N"], max(r["spill_stores"], r["spill_loads"]))]
        assert not spilled, (shape, spilled)


def long_chunk_spill(rows: int, tile_n: int, spill_bytes: int) -> bool:
    """Whether a spill is the one the long-chunk launch from a 16-bit cache may take: 128 rows
    in 64-key tiles, at most ``LONG_CHUNK_SPILL_BYTES`` (kept for its speed, docs/kernels.md)."""
    from pagebench.kernels.triton_prefill import LONG_CHUNK_SPILL_BYTES, LONG_CHUNK_TILE_N

    return (rows, tile_n) == (128, LONG_CHUNK_TILE_N) and spill_bytes <= LONG_CHUNK_SPILL_BYTES


EDGE_SPILLS = textwrap.dedent(r'''
    import json
    import torch
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    from pagebench.kernels.reference import cumulative_offsets
    from pagebench.kernels.triton_prefill import prefill_launch, triton_paged_prefill
    from pagebench.measure.kernel_cases import make_paged_inputs, quantized_inputs
    from pagebench.measure.offline_compile import captured_launches, compile_for_arch, ptxas_report

    rows = []
    # (dtype, fp8 cache, group, sequences, chunk, max_keys): long chunks, the shortest walks,
    # fp32; each launch as the rules pick it on an H100 (132 SMs), compiled with one KV head
    for dtype, fp8, group, sequences, chunk, max_keys in (
            (torch.bfloat16, False, 8, 1, 8192, 8192), (torch.bfloat16, True, 8, 1, 8192, 8192),
            (torch.bfloat16, False, 8, 256, 16, 128), (torch.bfloat16, True, 8, 256, 16, 128),
            (torch.float32, False, 8, 8, 512, 512)):
        launch = prefill_launch(128, dtype, torch.device("cuda"), group=group, kv_heads=1,
                                total=sequences * chunk, sequences=sequences, max_keys=max_keys,
                                fp8_cache=fp8, sm_count=132, hopper=True)
        inp = make_paged_inputs([300, 9], group, 1, 128, 16, dtype, "cpu", seed=1)
        case = quantized_inputs(inp, torch.float8_e5m2, seed=1) if fp8 else inp
        q = torch.randn(309, group, 128).to(dtype)
        with captured_launches() as launches:
            triton_paged_prefill(q, case.k_cache, case.v_cache, case.block_tables,
                                 case.seq_lens, cumulative_offsets([300, 9]), 128 ** -0.5,
                                 **case.scales(), launch=launch)
        for kernel, args, kwargs in launches:
            report = ptxas_report(compile_for_arch(kernel, args, kwargs, 90), 90)
            rows.append([repr(launch), str(dtype), fp8, report.spill_stores, report.spill_loads])
    print(json.dumps(rows))
''')


@pytest.mark.slow
@pytest.mark.skipif("triton" not in available_backends(), reason="triton not installed")
def test_prefill_launches_that_spilled_once_spill_nothing_on_sm90():
    """The launches an H100 picks where a launch once spilled (compiled for sm_90): long chunks
    (64-key tiles did), the shortest walks from an fp8 cache (128 registers did) and fp32
    (64 rows did), each from a 16-bit and, where it applies, an fp8 cache: no spill."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", EDGE_SPILLS], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == 5
    assert "rows=128, tile_n=64" in rows[0][0] and "rows=128, tile_n=32" in rows[1][0]
    assert "maxnreg=144" in rows[3][0]
    spilled = [row for row in rows if (row[3] or row[4]) and not long_chunk_spill(
        128 if "rows=128" in row[0] else 0, 64 if "tile_n=64" in row[0] else 0,
        max(row[3], row[4]))]
    assert not spilled, spilled


def _chosen_launches_here(device) -> dict:
    """The distinct launches ``prefill_launch`` picks on ``device`` over head dims, dtypes,
    groups, sequence counts, chunk lengths, table widths and caches (the queries' dtype or fp8
    e5m2): (launch, head dim, dtype, fp8 cache) -> the largest group it was picked for."""
    from pagebench.kernels.triton_prefill import prefill_launch

    picked = {}
    for head_dim in (64, 128, 256):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for fp8 in ((False,) if dtype == torch.float32 else (False, True)):
                for group in (1, 2, 4, 7, 8):
                    for sequences in (1, 8, 64, 256):
                        for chunk in (16, 128, 512, 1024, 2048, 8192):
                            for max_keys in {chunk, 512, 4 * chunk}:
                                if max_keys < chunk:
                                    continue
                                launch = prefill_launch(
                                    head_dim, dtype, device, group=group,
                                    kv_heads=max(1, 8 // group), total=sequences * chunk,
                                    sequences=sequences, max_keys=max_keys, fp8_cache=fp8)
                                key = (launch, head_dim, dtype, fp8)
                                picked[key] = max(picked.get(key, 0), group)
    return picked


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or "triton" not in available_backends(),
                    reason="needs a CUDA device and Triton")
def test_every_prefill_launch_chosen_here_compiles_without_spills_cuda(monkeypatch):
    """Each distinct launch the rules pick on this GPU, compiled for its head dim, dtype, group
    and cache (the queries' dtype or fp8 e5m2; on a small input: the launch, not the input,
    fixes the code): the compiled kernel spills no registers (Triton's ``n_spills``)."""
    from triton.runtime.jit import JITFunction

    from pagebench.kernels import triton_runtime
    from pagebench.measure.kernel_cases import make_paged_inputs, quantized_inputs
    from pagebench.kernels.reference import cumulative_offsets
    from pagebench.kernels.triton_prefill import triton_paged_prefill

    compiled = []
    run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **kw: (
        compiled.append(k := run(self, *a, **kw)), k)[1])
    monkeypatch.setattr(triton_runtime, "_LAUNCHERS", {})  # every call through Triton's launch
    monkeypatch.setattr(triton_runtime, "DIRECT_LAUNCH", False)
    device = torch.device("cuda")
    spilled = []
    for (launch, head_dim, dtype, fp8), group in _chosen_launches_here(device).items():
        inp = make_paged_inputs([300, 9], group, 1, head_dim, 16, dtype, device, seed=1)
        q = torch.randn(300 + 9, group, head_dim, device=device).to(dtype)
        starts = cumulative_offsets([300, 9], device)
        case = quantized_inputs(inp, torch.float8_e5m2, seed=1) if fp8 else inp
        compiled.clear()
        triton_paged_prefill(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                             starts, head_dim ** -0.5, **case.scales(), launch=launch)
        assert compiled, launch
        # Triton's n_spills counts 4-byte words of local memory
        spilled += [(launch, head_dim, dtype, group, case.k_cache.dtype, k.n_spills)
                    for k in compiled if k.n_spills and not long_chunk_spill(
                        launch.rows, launch.tile_n, 4 * k.n_spills)]
    assert not spilled, spilled
