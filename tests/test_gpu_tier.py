"""The collection rule of the repository's conftest.py: a test that needs a GPU is marked gpu, so
that the GPU tier (``make test-gpu``: ``pytest -m gpu``) runs it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = '''
import pytest

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_cuda():
    pass

@pytest.mark.skipif(True, reason="needs an NVIDIA GPU of compute capability 8.9+")
def test_nvidia():
    pass

@pytest.mark.skipif(False, reason="needs a machine without a GPU")
def test_without_a_gpu():
    pass
'''
MARKED = CASE.replace("\n@pytest.mark.skipif(True", "\n@pytest.mark.gpu\n@pytest.mark.skipif(True")


def collect(pytester, source: str):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    pytester.makepyfile(test_case=source)
    return pytester.runpytest("--collect-only", "-q")


def test_a_test_needing_a_gpu_without_the_mark_is_refused(pytester):
    result = collect(pytester, CASE)
    assert result.ret != 0
    result.stderr.fnmatch_lines(
        ["*without the gpu mark*test_case.py::test_cuda, test_case.py::test_nvidia"])
    assert "test_without_a_gpu" not in result.stderr.str()


def test_marked_tests_are_collected(pytester):
    assert MARKED.count("@pytest.mark.gpu") == 2
    result = collect(pytester, MARKED)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*3 tests collected*"])
