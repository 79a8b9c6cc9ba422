"""pagebench.triton_setup: where TRITON_INTERPRET is decided (never by `import pagebench`)."""

from __future__ import annotations

import os
import sys

import pytest

from pagebench import triton_setup
from pagebench.errors import ConfigError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(triton_setup, "GPU_DEVICE_FILES", ("/nonexistent/gpu",))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_a_users_setting_is_kept(monkeypatch):
    for value, interpreted in (("1", True), ("0", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert triton_setup.interprets() is interpreted
        assert triton_setup.interpret_without_gpu() is interpreted
        assert os.environ["TRITON_INTERPRET"] == value


def test_no_gpu_and_triton_not_imported_sets_it(no_gpu, monkeypatch):
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    assert triton_setup.interpret_without_gpu() is True
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_no_gpu_after_triton_was_imported_is_an_error_and_sets_nothing(no_gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", object())
    with pytest.raises(ConfigError, match="TRITON_INTERPRET: Triton was imported"):
        triton_setup.interpret_without_gpu()
    assert "TRITON_INTERPRET" not in os.environ


def test_a_gpu_device_leaves_the_environment_alone(monkeypatch, tmp_path):
    device = tmp_path / "nvidia0"
    device.touch()
    monkeypatch.setattr(triton_setup, "GPU_DEVICE_FILES", (str(device),))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert triton_setup.interpret_without_gpu() is False
    assert "TRITON_INTERPRET" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert triton_setup.interprets() is False


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_every_gpu_hidden_interprets(monkeypatch, tmp_path, hidden):
    """The CPU test tier on a GPU machine hides the GPUs: Triton then interprets."""
    device = tmp_path / "nvidia0"
    device.touch()
    monkeypatch.setattr(triton_setup, "GPU_DEVICE_FILES", (str(device),))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    assert triton_setup.interprets() is True
