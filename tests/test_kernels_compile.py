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

from pagebench.kernels import available_backends

CHILD = textwrap.dedent(r'''
    import json, sys
    import torch
    from pagebench.kernels.fixtures import make_paged_inputs, quantized_inputs
    from pagebench.kernels import registered_backends, triton_decode
    from pagebench.kernels.offline_compile import captured_launches, compile_for_arch
    from pagebench.kernels.triton_decode import DecodeLaunch, triton_paged_decode
    from pagebench.kernels.triton_prefill import triton_paged_prefill

    ARCH = int(sys.argv[1])
    sys.path.insert(0, sys.argv[2])  # property_tests: the launches prefill_launch picks on a GPU
    from kernel_cases import PREFILL_LAUNCHES
    CUDA = torch.device("cuda", 0)
    torch.cuda.get_device_capability = lambda device=None: divmod(ARCH, 10)
    triton_decode.hardware_fp8_convert = lambda device: ARCH >= 89

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
        qlens = torch.tensor([1, 20, 64], dtype=lens)
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
        forced = ([{}, *PREFILL_LAUNCHES.values(),  # and each with the rows' offsets read again
                   *(dict(launch, reread=True) for launch in PREFILL_LAUNCHES.values())]
                  if every_launch else [{}])
        calls += [(f"prefill {launch} {name}", lambda launch=launch: triton_paged_prefill(
            q, *args[1:], qlens, 0.125, **scales, **launch)) for launch in forced]
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
    from pagebench.kernels.offline_compile import prefill_reports
    points = [(1, 2048, 0), (2, 2048, 0), (4, 2048, 0), (1, 512, 0), (8, 512, 0), (16, 512, 0),
              (32, 128, 0), (64, 128, 0), (1, 512, 3584)]
    print(json.dumps({shape: prefill_reports(SHAPES[shape], points)
                      for shape in ("llama-3-8b", "qwen2.5-0.5b")}))
''')


@pytest.mark.slow
@pytest.mark.skipif("triton" not in available_backends(), reason="triton not installed")
def test_prefill_launches_picked_for_an_h200_spill_no_more_with_more_sequences():
    """Compiled for sm_90 as ``prefill_launch`` picks them on an H200: the launches of short
    and medium walks spill nothing, nor does the work list's kernel (16 x 512, 64 x 128), and the
    long-chunk launch (128 registers, Llama shape) spills no more at two or four sequences
    than at one. Before its rows' offsets were read again after the walk, it spilled 308
    bytes at two sequences against 72 at one, and the prefill of several long prompts ran
    1.2x slower; the work list's kernel spilled 68 bytes at 128 tiles a program on four warps
    and took ~10% of 128 x 128's time (docs/kernels.md)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", SPILLS], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    for shape, rows in reports.items():
        lists = [r for r in rows if r["kernel"] == "_work_list_kernel"]
        assert [(r["batch"], r["query_len"]) for r in lists] == (
            [(16, 512), (64, 128)] if shape == "llama-3-8b" else []), (shape, lists)
        rows = [r for r in rows if r["kernel"] == "_prefill_kernel"] + lists
        long_chunks = [r for r in rows if r["query_len"] == 2048]
        assert all(r["ROWS"] == (128 if shape == "llama-3-8b" else 64) for r in long_chunks)
        one = long_chunks[0]["spill_stores"]
        assert all(r["spill_stores"] <= one for r in long_chunks[1:]), (shape, long_chunks)
        others = [(r["batch"], r["query_len"], r["spill_stores"]) for r in rows
                  if r["query_len"] != 2048 and r["spill_stores"]]
        assert not others, (shape, others)
