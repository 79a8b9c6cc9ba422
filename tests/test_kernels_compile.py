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
    import triton
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction, native_specialize_impl
    from pagebench.kernels.fixtures import make_paged_inputs, quantized_inputs
    from pagebench.kernels import registered_backends, triton_decode
    from pagebench.kernels.triton_decode import triton_paged_decode
    from pagebench.kernels.triton_prefill import triton_paged_prefill

    OPTIONS = ("num_warps", "num_stages", "maxnreg")
    ARCH = int(sys.argv[1])
    sys.path.insert(0, sys.argv[2])  # property_tests: the launches prefill_launch picks on a GPU
    from test_kernel_equivalence import PREFILL_LAUNCHES
    CUDA = torch.device("cuda", 0)
    torch.cuda.get_device_capability = lambda device=None: divmod(ARCH, 10)
    triton_decode.hardware_fp8_convert = lambda device: ARCH >= 89
    launches = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: launches.append(
        (self, args, kwargs))

    def compile_for_arch(kernel, args, kwargs):
        """As the JIT would on a GPU: its own specialisation of every argument (types, 16-byte
        divisibility of pointers and integers, integers equal to 1 as constants). Without the
        divisibility hints the loads are neither vectorised nor pipelined: not the code a GPU
        compiles and runs."""
        constexprs = {p.name for p in kernel.params if p.is_constexpr}
        values = dict(zip(kernel.arg_names, args)) | kwargs
        signature, constants, attrs = {}, {}, {}
        for i, name in enumerate(kernel.arg_names):
            v = values[name]
            if name in constexprs:
                signature[name], constants[name] = "constexpr", v
                continue
            kind, key = native_specialize_impl(BaseBackend, v, False, True, True)
            signature[name] = kind
            if kind == "constexpr":
                constants[name] = v
            else:
                attrs[(i,)] = BaseBackend.parse_attr(key) if isinstance(key, str) else []
        options = {k: kwargs[k] for k in OPTIONS if kwargs.get(k) is not None}
        triton.compile(ASTSource(kernel, signature, constants, attrs),
                       target=GPUTarget("cuda", ARCH, 32), options=options)

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
                  lambda n=n: triton_paged_decode(*args, 0.125, num_splits=n, **scales))
                 for n in (1, 3)]
        calls.append((f"decode splits=3 captured first {name}", captured_first(calls[-1][1])))
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
        launches.clear()
        call()
        if not launches:
            results.append([name, "", "launched no kernel"])
        for kernel, args, kwargs in launches:
            try:
                compile_for_arch(kernel, args, kwargs)
                results.append([name, kernel.__name__, ""])
            except Exception as e:
                results.append([name, kernel.__name__, f"{type(e).__name__}: {str(e)[-400:]}"])
    print(json.dumps(results))
''')


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
