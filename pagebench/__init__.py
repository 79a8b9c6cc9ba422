"""pagebench: a benchmarking and regression harness for paged KV-cache attention."""

import os as _os

__version__ = "0.1.0"

# Triton reads TRITON_INTERPRET when its kernels are defined, and transformers imports Triton
# while building a model: on a machine without a GPU device, switch Triton to its CPU
# interpreter here, before anything imports it, so the Triton backend runs (slowly) on CPU.
# (A device file, not torch.cuda, so that `import pagebench` does not import torch.)
_GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL2, ROCm
if "TRITON_INTERPRET" not in _os.environ and not any(map(_os.path.exists, _GPU_DEVICE_FILES)):
    _os.environ["TRITON_INTERPRET"] = "1"

from pagebench.errors import ConfigError, OutOfBlocksError, PagebenchError, SequenceError  # noqa: E402

__all__ = ["__version__", "PagebenchError", "ConfigError", "OutOfBlocksError", "SequenceError"]
