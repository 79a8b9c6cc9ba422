"""The CUDA fp8 decode (backend ``cuda-fp8``): what it declares and refuses, its split count, and
on an NVIDIA GPU of compute capability 8.9+ its output against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from pagebench.config import ceil_div
from pagebench.kernels import paged_decode, register_backend, registered_backends
from pagebench.kernels import cuda_fp8_decode as cf
from pagebench.measure.kernel_cases import make_paged_inputs, quantized_inputs, relative_error
from pagebench.kernels.quant import FP8_DTYPES
from pagebench.kernels.reference import reference_decode
from pagebench.kernels.registry import resolve, unregister_backend

E4M3 = torch.float8_e4m3fn
HAS_KERNEL = cf.available(torch.device("cuda"))


def test_declares_fp8_caches_only():
    b = registered_backends()["cuda-fp8"]
    assert b.operations() == ("decode",) and b.devices == ("cuda",)
    assert b.capabilities()["cache_dtypes"] == ["float8_e4m3fn", "float8_e5m2"]
    assert b.supports_cache_dtype(E4M3, torch.bfloat16)
    assert not b.supports_cache_dtype(torch.bfloat16, torch.bfloat16)
    assert not b.supports("decode", "cuda", torch.bfloat16, 16, 128)  # no cache dtype: q's
    assert not b.supports("decode", "cuda", torch.float32, 16, 128, E4M3)
    assert not b.supports("decode", "cuda", torch.bfloat16, 16, 80, E4M3)
    assert registered_backends()["triton"].priority > b.priority  # "auto" keeps Triton


def test_a_backend_reading_only_fp8_is_resolved_for_fp8_caches_only():
    def decode(*args, **scales):
        return args[0]
    with pytest.raises(ValueError, match="reads_own_dtype"):
        register_backend("fp8-only", decode=decode, reads_own_dtype=False)
    register_backend("fp8-only", decode=decode, devices=("cpu",), cache_dtypes=FP8_DTYPES,
                     reads_own_dtype=False, priority=99)
    try:
        assert resolve("decode", "fp8-only", "cpu", torch.float32, 16, 64, E4M3).name == \
            "fp8-only"
        assert resolve("decode", "auto", "cpu", torch.float32, 16, 64, E4M3).name == "fp8-only"
        assert resolve("decode", "auto", "cpu", torch.float32, 16, 64).name != "fp8-only"
        with pytest.raises(ValueError, match="does not support this input"):
            resolve("decode", "fp8-only", "cpu", torch.float32, 16, 64, torch.float32)
    finally:
        unregister_backend("fp8-only")


def _args(q_dtype=torch.bfloat16, cache_dtype=E4M3, head_dim=64, transpose=False):
    q = torch.zeros(2, 4, head_dim, dtype=q_dtype)
    k = torch.zeros(3, 16, 2, head_dim, dtype=torch.float32)
    if transpose:
        k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    k = k.to(cache_dtype)
    return q, k, k, torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)


@pytest.mark.parametrize("kwargs, message", [
    (dict(cache_dtype=torch.bfloat16), "k_cache: the cuda-fp8 backend reads fp8"),
    (dict(q_dtype=torch.float32), "q: the cuda-fp8 backend takes fp16 or bf16"),
    (dict(head_dim=80), r"q: the cuda-fp8 backend takes head dims \(64, 128, 256\)"),
    (dict(transpose=True), "k_cache: the last dimension must have unit stride"),
])
def test_refuses_what_it_cannot_read_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cf.cuda_fp8_paged_decode(*_args(**kwargs), 0.125, None, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_refuses_a_cpu_tensor():
    with pytest.raises(ValueError, match="runs on NVIDIA GPUs"):
        cf.cuda_fp8_paged_decode(*_args(), 0.125, None, None)
    with pytest.raises(ValueError, match="cuda-fp8"):  # not available here: named, refused
        q, k, v, tables, lens = _args()
        paged_decode(q, k, v, tables, lens, backend="cuda-fp8", k_scale=1.0, v_scale=1.0)


@settings(max_examples=200, deadline=None)
@given(units=st.integers(1, 4096), capacity=st.integers(1, 1 << 17),
       slots=st.integers(32, 8192))
def test_splits_cover_the_table_in_whole_steps(units, capacity, slots):
    splits, per_split = cf.choose_splits(units, capacity, slots)
    assert 1 <= splits <= cf.MAX_SPLITS and per_split % cf.STEP == 0
    assert (splits - 1) * per_split < capacity <= splits * per_split  # no empty split


def test_splits_fill_one_wave_when_the_pairs_are_few():
    # H200, Llama-3-8B shape: 12 warps on each of 132 SMs (146 registers, blocks of 4 warps)
    for units, splits in ((256, 6), (512, 3), (128, 12)):
        assert cf.choose_splits(units, 4096, 1584)[0] == splits
        assert units * splits <= 1584


def test_merged_splits_make_the_combine_cheaper_in_the_wave_model():
    # 1 x 65,536, Llama-3-8B shape: 187 and 196 splits both fit one wave; with a partial per
    # split their combines tie them (fewest wins), with a partial per 4 the shorter splits win
    assert cf.choose_splits(8, 65536, 1584)[0] == 187
    assert cf.choose_splits(8, 65536, 1584, merged=4)[0] == 196
    # a block's empty split warps take slots: 4 x 16,384 has 49 splits unmerged (1,568 warps),
    # but 13 blocks of 4 per pair would be 1,664 warps, a second wave (54 us against 43 on
    # the H200); merged, it takes 47 (12 blocks per pair)
    for units, capacity in ((32, 16384), (16, 32768), (8, 65536)):
        splits = cf.choose_splits(units, capacity, 1584, merged=4)[0]
        assert units * ceil_div(splits, 4) * 4 <= 1584, (units, capacity, splits)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_KERNEL, reason="needs an NVIDIA GPU of compute capability 8.9+")
def test_a_block_merges_splits_from_merge_from_splits_on_cuda():
    build = cf.CudaBuild(head_dim=128, group=4, block_size=16, fp8_name="e4m3", q_bf16=True,
                         table_t="int", seq_t="int", heads_per_block=1)
    for num_seqs, capacity, merged in ((1, 65536, True), (32, 4096, False), (128, 4096, False)):
        _, _, chosen, splits, _ = cf._plan(build, num_seqs, 32, 8, capacity,
                                           cf.CudaDecodeLaunch())
        assert (chosen.split_warps == cf.MERGED_SPLIT_WARPS) == merged, (num_seqs, capacity)
        assert chosen.block_warps <= 4 and (splits >= cf.MERGE_FROM_SPLITS) == merged


@pytest.mark.parametrize("kv_heads, most, warps", [(8, 4, 4), (6, 4, 2), (7, 4, 1), (2, 8, 2)])
def test_heads_per_block_divides_the_kv_heads(kv_heads, most, warps):
    assert cf.heads_per_block(kv_heads, most) == warps


def _misaligned(x: torch.Tensor, offset: int) -> torch.Tensor:
    """``x`` copied into a byte buffer at ``offset`` bytes past a 16-byte boundary."""
    raw = torch.zeros(x.numel() + 16, dtype=torch.uint8, device=x.device)
    view = raw[offset:offset + x.numel()].view(x.dtype).view(x.shape)
    view.copy_(x)
    return view


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_KERNEL, reason="needs an NVIDIA GPU of compute capability 8.9+")
def test_matches_float64_reference_cuda():
    """Head dims, groups of 1 to 16 query heads (chunks of 8 past 8), block sizes with and
    without 16 | block, int32 / int64 tables and lengths, forced split counts, caches moved off
    16-byte alignment (the byte-load build), q far outside fp16's range, either combine kernel
    (empty splits included: short sequences in a wide table): NaN-poisoned caches."""
    @settings(max_examples=60, deadline=None)
    @given(head_dim=st.sampled_from(cf.HEAD_DIMS), kv_heads=st.sampled_from([1, 2, 8]),
           group=st.sampled_from([1, 4, 5, 7, 8, 16]), block=st.sampled_from([1, 3, 16, 128]),
           lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=5),
           index=st.sampled_from([torch.int32, torch.int64]),
           q_dtype=st.sampled_from([torch.float16, torch.bfloat16]),
           cache=st.sampled_from(FP8_DTYPES), splits=st.sampled_from([None, 1, 2, 7, 40, 187]),
           combine=st.sampled_from([None, *cf.COMBINES]), offset=st.sampled_from([0, 0, 1, 8]),
           layout=st.sampled_from([(4, None), (4, 1), (4, 4), (4, 2), (2, 2)]),
           exponent=st.integers(-20, 20), seed=st.integers(0, 2 ** 16))
    def prop(head_dim, kv_heads, group, block, lengths, index, q_dtype, cache, splits, combine,
             offset, layout, exponent, seed):
        inp = make_paged_inputs(lengths, kv_heads * group, kv_heads, head_dim, block, q_dtype,
                                "cuda", seed=seed)
        fp8 = quantized_inputs(inp, cache, seed=seed)
        q = (fp8.q.double() * 2.0 ** (exponent if q_dtype == torch.bfloat16 else 0)).to(q_dtype)
        k, v = (_misaligned(x, offset) if offset else x for x in (fp8.k_cache, fp8.v_cache))
        args = (q, k, v, fp8.block_tables.to(index), fp8.seq_lens.to(index))
        note(f"k aligned={cf._aligned(k)} splits={splits} warps, split warps per block={layout}")
        launch = cf.CudaDecodeLaunch(num_splits=splits, warps_per_block=layout[0],
                                     split_warps=layout[1], combine=combine)
        out = cf.cuda_fp8_paged_decode(*args, head_dim ** -0.5, fp8.k_scale, fp8.v_scale,
                                       launch=launch)
        ref = reference_decode(*args, head_dim ** -0.5, **fp8.scales())
        assert out.shape == q.shape and out.dtype == q.dtype
        assert torch.isfinite(out).all(), "a poisoned slot or table entry was read"
        assert relative_error(out, ref) < 1e-2
    prop()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_KERNEL, reason="needs an NVIDIA GPU of compute capability 8.9+")
@pytest.mark.parametrize("splits", [5, 40])  # either combine kernel
@pytest.mark.parametrize("split_warps", [1, 4])  # splits merged in the block or not
def test_graph_replay_equals_eager_cuda(splits, split_warps):
    inp = make_paged_inputs([700, 1, 4096], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=3)
    fp8 = quantized_inputs(inp, E4M3, seed=3)
    args = (*fp8.args(), 128 ** -0.5, fp8.k_scale, fp8.v_scale)
    launch = cf.CudaDecodeLaunch(num_splits=splits, split_warps=split_warps)
    eager = cf.cuda_fp8_paged_decode(*args, launch=launch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cf.cuda_fp8_paged_decode(*args, launch=launch)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def _nvrtc():
    """NVRTC from the ``nvidia-cuda-nvrtc`` wheel (a test dependency: no GPU needed)."""
    import ctypes
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("nvidia")
    libs = sorted(p for base in (spec.submodule_search_locations if spec else [])
                  for p in Path(base).glob("**/libnvrtc.so*") if "builtins" not in p.name)
    if not libs:
        pytest.fail("NVRTC not found: install the test extras (pip install -e '.[test]')")
    return ctypes.CDLL(str(libs[-1]))


def _compile(nvrtc, source: str, arch: int) -> tuple[int, str]:
    """Compile ``source`` to SASS for sm_``arch``: (NVRTC's result, its log)."""
    import ctypes

    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None,
                                    None) == 0
    options = [f"--gpu-architecture=sm_{arch}".encode()]
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc == 0:
        assert nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == 0 and size.value > 0
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace")


# builds the backend makes (CudaBuild's fields in order): every head dim, both formats and q
# dtypes, int32/int64 tables and lengths, block sizes with and without 16 | block, groups of
# 1-16 (two warps' chunks past 8), the byte-load build for unaligned caches, a register cap,
# a block's warps on the splits of one KV head (the in-block merge)
BUILDS = [(128, 4, 16, "e4m3", True, "int", "int", 4, 1, True, 1),
          (128, 4, 1, "e5m2", False, "long long", "long long", 4, 1, True, 1),
          (64, 7, 3, "e4m3", True, "int", "long long", 2, 1, False, 1),
          (256, 8, 128, "e5m2", True, "long long", "int", 2, 1, True, 1),
          (128, 16, 32, "e4m3", False, "int", "int", 1, 4, False, 1),
          (64, 1, 16, "e4m3", True, "int", "int", 4, 1, True, 1),
          (128, 4, 16, "e4m3", True, "int", "int", 1, 1, True, 4),
          (256, 16, 1, "e5m2", False, "long long", "int", 2, 1, False, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [89, 90])  # L4/L40S/RTX 4090, H100/H200
def test_source_compiles_for_every_kind_of_build(arch):
    """The CUDA source compiles (NVRTC, no GPU) for the builds the backend asks for: CI has no
    GPU, so this is what guards an edit of the source there."""
    nvrtc = _nvrtc()
    failed = []
    for build in BUILDS:
        rc, log = _compile(nvrtc, cf.kernel_source(cf.CudaBuild(*build)), arch)
        if rc != 0 or "warning" in log.lower():
            failed.append(f"{build}: rc={rc}\n{log[-2000:]}")
    assert not failed, "\n".join(failed)


def test_a_broken_source_fails_to_compile():
    source = cf.kernel_source(cf.CudaBuild(*BUILDS[0]))
    rc, log = _compile(_nvrtc(), source.replace("mma16816(st.acc[j]", "mma16816(st.acc[j][0]"),
                       90)
    assert rc != 0 and "error" in log


def test_the_cuda_source_ships_as_package_data():
    """The .cu file is read from the installed package (importlib.resources), and the wheel's
    package-data globs carry it."""
    import fnmatch
    import tomllib
    from pathlib import Path

    pyproject = Path(cf.__file__).resolve().parents[2] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch.fnmatch(f"kernels/{cf.SOURCE_FILE}", g) for g in globs["pagebench"])
    source = cf.kernel_source(cf.CudaBuild(*BUILDS[0]))
    assert source.startswith("#define HEAD_DIM 128\n")
    assert 'extern "C" __global__' in source and all(name in source for name in cf.KERNELS)


def test_launch_records_are_keyword_only_and_checked():
    with pytest.raises(TypeError):
        cf.CudaDecodeLaunch(4)  # keyword only
    with pytest.raises(ValueError, match="^combine: "):
        cf.CudaDecodeLaunch(combine="none")  # skipping the merge is no launch
    with pytest.raises(ValueError, match="^num_splits: "):
        cf.CudaDecodeLaunch(num_splits=0)
    assert not hasattr(cf, "COMBINE")
