"""The Triton kernels compiled for an NVIDIA GPU without one, and what ``ptxas`` says of them.

Triton's compiler and the ``ptxas`` it ships run on the CPU. :func:`captured_launches` calls the
public wrappers on CPU tensors and keeps each launch Triton would make; :func:`compile_for_arch`
compiles one for an architecture as the JIT would on that GPU; :func:`ptxas_report` reads the
registers, spills and any serialised ``wgmma`` of the result. A process that uses this must
run with ``TRITON_INTERPRET=0``, set before Triton is imported (else the launches are
interpreted and never compiled). ``tests/test_kernels_compile.py`` uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, native_specialize_impl

OPTIONS = ("num_warps", "num_stages", "maxnreg")


@contextlib.contextmanager
def captured_launches():
    """A list that collects ``(kernel, args, kwargs)`` for every Triton launch made inside the
    block, none of which runs."""
    launches, run = [], JITFunction.run
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: launches.append(
        (self, args, kwargs))
    try:
        yield launches
    finally:
        JITFunction.run = run


def compile_for_arch(kernel, args, kwargs, arch: int):
    """``kernel`` compiled for ``sm_<arch>`` as the JIT would on that GPU: its own
    specialisation of every argument (types, 16-byte divisibility of pointers and integers,
    integers equal to 1 as constants). Without the divisibility hints the loads are neither
    vectorised nor pipelined: not the code a GPU compiles and runs."""
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
    return triton.compile(ASTSource(kernel, signature, constants, attrs),
                          target=GPUTarget("cuda", arch, 32), options=options)


@dataclasses.dataclass(frozen=True, slots=True)
class PtxasReport:
    registers: int  # per thread
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    serialised: str  # why ptxas serialised the kernel's wgmma ("": it did not)


def ptxas_report(compiled, arch: int) -> PtxasReport:
    """What ``ptxas -v`` (the one Triton compiles with for ``arch``) reports of the compiled
    kernel's PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    suffix = "a" if arch >= 90 else ""  # wgmma needs the architecture-specific target
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w", encoding="utf-8") as f:
            f.write(compiled.asm["ptx"])
        out = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{suffix}", ptx,
                              "-o", os.path.join(tmp, "kernel.o")],
                             capture_output=True, text=True, timeout=120)
    log = out.stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if out.returncode != 0 or registers is None or spills is None:
        raise RuntimeError(f"ptxas: {log.strip()[-800:]}")
    serialised = re.search(r"wgmma\.mma_async instructions are serialized due to (.*?) for", log)
    return PtxasReport(int(registers.group(1)), int(spills.group(1)), int(spills.group(2)),
                       serialised.group(1) if serialised else "")


@contextlib.contextmanager
def launching_as_on(sm_count: int, arch: int = 90):
    """``prefill_launch`` choosing inside the block as on a CUDA GPU of ``sm_count`` SMs and
    architecture ``sm_<arch>``, for the CPU tensors the wrappers are called with here."""
    import torch

    from pagebench.kernels import triton_prefill

    choose = triton_prefill.prefill_launch
    triton_prefill.prefill_launch = lambda head_dim, dtype, device, **kw: choose(
        head_dim, dtype, torch.device("cuda"), sm_count=sm_count, hopper=arch // 10 == 9, **kw)
    try:
        yield
    finally:
        triton_prefill.prefill_launch = choose


def prefill_reports(shape: tuple[int, int, int], points, arch: int = 90, sm_count: int = 132,
                    launch=None) -> list[dict]:
    """One row per (batch, query_len, cached) point of ``points``: the prefill kernel as
    ``prefill_launch`` picks it on a GPU of ``sm_count`` SMs (``launch``: a ``PrefillLaunch``
    forced), bf16, block 16, heads and head dim ``shape``, with :func:`ptxas_report`'s
    fields."""
    import torch

    from pagebench.measure.kernel_cases import prefill_case
    from pagebench.kernels.triton_prefill import triton_paged_prefill

    rows = []
    for batch, query_len, cached in points:
        case = prefill_case(batch, query_len, cached, shape, 16, torch.bfloat16, "cpu",
                            seed=0).args()
        with launching_as_on(sm_count, arch), captured_launches() as launches:
            triton_paged_prefill(*case, shape[2] ** -0.5, launch=launch)
        for kernel, args, kwargs in launches:
            report = ptxas_report(compile_for_arch(kernel, args, kwargs, arch), arch)
            options = {k: kwargs.get(k) for k in ("ROWS", "TILE_N", "num_warps", "num_stages",
                                                    "maxnreg", "ONE_LOOP", "TABLE_AHEAD",
                                                    "LAZY", "VOTE")}
            rows.append({"batch": batch, "query_len": query_len, "cached": cached,
                         "kernel": kernel.fn.__name__, **options,
                         **dataclasses.asdict(report)})
    return rows
