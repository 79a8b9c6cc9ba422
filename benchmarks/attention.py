"""Decode attention per step (and prefill): paged backends against contiguous baselines.

Two attention shapes: Llama-3-8B (32 query / 8 KV heads x 128) and Qwen2.5-0.5B (14 / 2 x 64).
``Batch1*``: one sequence across context lengths and block sizes. ``Throughput*``: batch sizes at
a fixed context, with tokens/s = batch / step time. ``Prefill*``: whole prompts and chunks after
a cached prefix, against causal SDPA. Block tables are scattered (a random permutation of the
pool), as in a long-running server.

CPU classes (``time_*``, fp32, small sizes) run where there is no GPU; CUDA classes (``track_*``,
bf16, real sizes, ``--launch-method spawn``) return the median of CUDA-event timings of the
step replayed from a CUDA graph, L2 flushed between calls, through ``pagebench.measure.timing.measure``. A backend that this commit or machine lacks is skipped.
Triton and FlexAttention are skipped on CPU: there Triton only runs interpreted and Flex is
dominated by compilation, so their times would say nothing about the kernels.
"""

from __future__ import annotations

import functools
import os

from .common import (SHAPES, SkipCase, cpu_median_us, defaults, gpu_median_us, require,
                     require_cpu, require_gpu)

CPU_PAGED = ["torch-paged"]
CPU_CONTIGUOUS = ["sdpa-contiguous"]
GPU_BACKENDS = ["triton-paged", "torch-paged", "sdpa-contiguous", "triton-contiguous"]
DEFAULT_BLOCK = defaults.BLOCK_SIZE

CPU_CONTEXTS = [512, 4096]
CPU_BLOCK_SIZES = list(defaults.SHORT_BLOCK_SIZES)
CPU_BATCHES = [1, 4, 16]
CPU_THROUGHPUT_CONTEXT = 1024  # 4096 x 16 sequences in fp32 is too slow for 2 shared cores

# GPU sizes. A GPU case costs a process start (spawn) plus compilation, so the set is kept to the
# headline points; PAGEBENCH_ASV_GPU=headline trims it further (Llama shape only) for runs over
# many commits on a short device lease.
HEADLINE = os.environ.get("PAGEBENCH_ASV_GPU", "full") == "headline"
GPU_SHAPES = ["llama-3-8b"] if HEADLINE else list(SHAPES)
GPU_CONTEXTS = [4096, 65536] if HEADLINE else [1024, 4096, 16384, 65536]
GPU_BATCHES = [1, 16, 64] if HEADLINE else [1, 8, 16, 32, 64, 128, 256]
GPU_BLOCK_SIZES = list(defaults.BLOCK_SIZES)
GPU_THROUGHPUT_CONTEXT = 4096


class DecodeCase:
    """Inputs for one decode step (``pagebench.measure.kernel_cases``) and the call that runs it
    (the backend's ``prepared_call``, as the kernel sweep times it), built outside the timed
    body. A commit without the fixtures module skips the case."""

    def __init__(self, shape: str, batch: int, context: int, block_size: int, backend: str,
                 device: str):
        import torch

        fixtures = require("pagebench.measure.kernel_cases", "paged_case", "contiguous_case")
        kernels = require("pagebench.kernels", "paged_decode", "contiguous_decode",
                          "available_backends", "get_backend")
        name, _, layout = backend.rpartition("-")
        backends = kernels.available_backends()
        if name not in backends or device not in backends[name].get("devices", []):
            raise SkipCase(f"backend {name!r} is not available on {device}")
        dims = SHAPES[shape]
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        scale = dims[2] ** -0.5
        if layout == "paged":
            case = fixtures.paged_case(batch, context, dims, block_size, dtype, device)
            api_call = functools.partial(kernels.paged_decode, *case.args(), backend=name)
            op, args = "decode", case.args()
        else:
            case = fixtures.contiguous_case(batch, context, dims, dtype, device)
            api_call = functools.partial(kernels.contiguous_decode, *case.args(), backend=name)
            op, args = "contiguous", (case.q, case.k, case.v, None)  # None: every sequence full
        try:
            api_call()  # validates the input, compiles (Triton, Flex), checks the backend takes it
        except ValueError as e:  # the backend refuses this input (capabilities)
            raise SkipCase(str(e)) from e
        # Timed: the backend's kernel on the validated input, as the kernel sweep times it.
        # The public entry point re-validates on every call (host work and, on a GPU, syncs),
        # which is not what a decode step of an engine pays.
        self.call = kernels.get_backend(name).prepared_call(op, *args, scale)
        if device == "cuda":
            torch.cuda.synchronize()


# ---- CPU: wall clock, small sizes ---------------------------------------------------------
class Batch1Paged:
    """Batch 1, paged: per-step decode attention across context lengths and block sizes (CPU,
    fp32)."""

    params = [list(SHAPES), CPU_CONTEXTS, CPU_BLOCK_SIZES, CPU_PAGED]
    param_names = ["shape", "context", "block_size", "backend"]

    def setup(self, shape, context, block_size, backend):
        require_cpu()
        self.case = DecodeCase(shape, 1, context, block_size, backend, "cpu")

    def time_decode_step(self, shape, context, block_size, backend):
        self.case.call()


class Batch1Contiguous:
    """Batch 1, the contiguous baseline paging is measured against (CPU, fp32)."""

    params = [list(SHAPES), CPU_CONTEXTS, CPU_CONTIGUOUS]
    param_names = ["shape", "context", "backend"]

    def setup(self, shape, context, backend):
        require_cpu()
        self.case = DecodeCase(shape, 1, context, DEFAULT_BLOCK, backend, "cpu")

    def time_decode_step(self, shape, context, backend):
        self.case.call()


class Throughput:
    """Decode step across batch sizes at a fixed context (CPU, fp32), block size 16: time and
    tokens/s."""

    params = [list(SHAPES), CPU_BATCHES, CPU_PAGED + CPU_CONTIGUOUS]
    param_names = ["shape", "batch", "backend"]
    context = CPU_THROUGHPUT_CONTEXT

    def setup(self, shape, batch, backend):
        require_cpu()
        self.case = DecodeCase(shape, batch, self.context, DEFAULT_BLOCK, backend, "cpu")

    def time_decode_step(self, shape, batch, backend):
        self.case.call()

    def track_tokens_per_s(self, shape, batch, backend):
        return batch / (cpu_median_us(self.case.call) * 1e-6)

    track_tokens_per_s.unit = "tokens/s"


# ---- CUDA: event-timed medians, bf16, real sizes -------------------------------------------
class Batch1Cuda:
    """Batch 1 on a GPU, block size 16: decode step time (us) across context lengths."""

    params = [GPU_SHAPES, GPU_CONTEXTS, GPU_BACKENDS]
    param_names = ["shape", "context", "backend"]
    timeout = 900

    def setup(self, shape, context, backend):
        require_gpu()
        self.case = DecodeCase(shape, 1, context, DEFAULT_BLOCK, backend, "cuda")

    def track_decode_us(self, shape, context, backend):
        return gpu_median_us(self.case.call)

    track_decode_us.unit = "us"


class FlexCuda:
    """FlexAttention's paged attention, Llama-3-8B shape, block size 16: batch 1 and 64 at 4,096
    tokens (each case compiles, so the set is small)."""

    params = [[1, 64], ["flex-paged"]]
    param_names = ["batch", "backend"]
    timeout = 900

    def setup(self, batch, backend):
        require_gpu()
        self.case = DecodeCase("llama-3-8b", batch, 4096, DEFAULT_BLOCK, backend, "cuda")

    def track_decode_us(self, batch, backend):
        return gpu_median_us(self.case.call)

    track_decode_us.unit = "us"


class BlockSizeCuda:
    """Batch 1 on a GPU, Llama-3-8B shape, 16,384 tokens: what a small block costs."""

    params = [GPU_BLOCK_SIZES, ["triton-paged", "torch-paged"]]
    param_names = ["block_size", "backend"]
    timeout = 900

    def setup(self, block_size, backend):
        require_gpu()
        self.case = DecodeCase("llama-3-8b", 1, 16384, block_size, backend, "cuda")

    def track_decode_us(self, block_size, backend):
        return gpu_median_us(self.case.call)

    track_decode_us.unit = "us"


class ThroughputCuda:
    """Batch sizes at 4,096 tokens on a GPU, block size 16: tokens/s = batch / step time
    (the step time is batch / tokens_per_s; one tracked number per case keeps GPU runs short)."""

    params = [GPU_SHAPES, GPU_BATCHES, GPU_BACKENDS]
    param_names = ["shape", "batch", "backend"]
    context = GPU_THROUGHPUT_CONTEXT
    timeout = 900

    def setup(self, shape, batch, backend):
        require_gpu()
        self.case = DecodeCase(shape, batch, self.context, DEFAULT_BLOCK, backend, "cuda")

    def track_tokens_per_s(self, shape, batch, backend):
        return batch / (gpu_median_us(self.case.call) * 1e-6)

    track_tokens_per_s.unit = "tokens/s"


# ---- prefill: whole prompts and chunks after a cached prefix -------------------------------
class PrefillCase:
    """One paged-prefill call (or causal SDPA on a contiguous cache), built outside the timed
    body: ``batch`` sequences, each ``query_len`` new tokens after ``cached`` ones."""

    def __init__(self, shape, batch, query_len, cached, backend, device):
        import torch

        fixtures = require("pagebench.measure.kernel_cases", "prefill_case")
        sweep = require("pagebench.measure.prefill_sweep", "sdpa_causal")
        kernels = require("pagebench.kernels", "available_backends", "get_backend")
        name, _, layout = backend.rpartition("-")
        info = kernels.available_backends().get(name, {})
        needs = "prefill" if layout == "paged" else "contiguous"
        if device not in info.get("devices", []) or needs not in info.get("operations", []):
            raise SkipCase(f"backend {name!r} has no {needs} kernel on {device}")
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        point = (batch, query_len, cached)
        if layout == "contiguous":
            self.call = sweep.sdpa_causal(*point, SHAPES[shape], dtype, device, seed=3)
            return
        case = fixtures.prefill_case(*point, SHAPES[shape], DEFAULT_BLOCK, dtype, device, seed=3)
        self.call = kernels.get_backend(name).prepared_call("prefill", *case.args(),
                                                            SHAPES[shape][2] ** -0.5)


CPU_PREFILL_POINTS = ["1x128+0", "1x64+448", "4x32+96"]  # batch x query_len + cached
GPU_PREFILL_POINTS = ["1x2048+0", "1x512+3584", "8x512+0", "16x64+1024", "64x16+2048"]


def _point(text: str) -> tuple[int, int, int]:
    batch, rest = text.split("x")
    query_len, cached = rest.split("+")
    return int(batch), int(query_len), int(cached)


class Prefill:
    """Paged prefill against causal SDPA on a contiguous cache (CPU, fp32, Llama-3-8B shape)."""

    params = [CPU_PREFILL_POINTS, ["torch-paged", "sdpa-contiguous"]]
    param_names = ["point", "backend"]

    def setup(self, point, backend):
        require_cpu()
        self.case = PrefillCase("llama-3-8b", *_point(point), backend, "cpu")

    def time_prefill(self, point, backend):
        self.case.call()


class PrefillCuda:
    """Paged prefill on a GPU (bf16, Llama-3-8B shape, block 16), replayed from a CUDA graph:
    the Triton kernel against causal SDPA (FlashAttention) on a contiguous cache."""

    params = [GPU_PREFILL_POINTS, ["triton-paged", "sdpa-contiguous"]]
    param_names = ["point", "backend"]
    timeout = 900

    def setup(self, point, backend):
        require_gpu()
        self.case = PrefillCase("llama-3-8b", *_point(point), backend, "cuda")

    def track_prefill_us(self, point, backend):
        return gpu_median_us(self.case.call)

    track_prefill_us.unit = "us"
