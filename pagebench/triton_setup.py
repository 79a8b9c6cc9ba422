"""Where the Triton kernels run: compiled for the GPU, or interpreted on the CPU without one.

Triton reads ``TRITON_INTERPRET`` when it is imported (its own helper functions are defined
then) and when a kernel is defined, and transformers imports Triton while it builds a model. So
``import pagebench`` changes no environment variable; instead the entry points (the ``pagebench``
command, the test suites' ``conftest.py``) and a library user who builds a model before calling
a Triton kernel on a machine without a GPU call :func:`interpret_without_gpu` first. The
kernel modules call it too, before they import Triton. A ``TRITON_INTERPRET`` that the user set
(``0`` or ``1``) is kept as it is.
"""

from __future__ import annotations

import os
import sys

from pagebench.errors import ConfigError

# A device file, not torch.cuda: asking the CUDA runtime would initialise it before a fork.
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL2, ROCm


def interprets() -> bool:
    """Whether Triton kernels run interpreted here: ``TRITON_INTERPRET=1``, or the variable is
    unset on a machine without a GPU device or with every GPU hidden (``CUDA_VISIBLE_DEVICES``
    empty or -1, as the CPU test tier runs on a GPU machine)."""
    value = os.environ.get("TRITON_INTERPRET")
    if value is not None:
        return value == "1"
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return True
    return not any(map(os.path.exists, GPU_DEVICE_FILES))


def interpret_without_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when :func:`interprets` says so and it is unset; returns
    :func:`interprets`. Raises ConfigError, setting nothing, when the variable is needed but
    Triton was already imported without it (its kernels would fail when called)."""
    if not interprets():
        return False
    if "TRITON_INTERPRET" not in os.environ:
        if "triton" in sys.modules:
            raise ConfigError(
                "TRITON_INTERPRET: Triton was imported (transformers imports it when it builds a "
                "model) before it was set on this machine without a GPU: call "
                "pagebench.triton_setup.interpret_without_gpu() first, or export "
                "TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"
    return True
