"""pagebench: a benchmarking and regression harness for paged KV-cache attention."""

import os as _os

__version__ = "0.1.0"

# Triton reads TRITON_INTERPRET when its kernels are defined, and transformers imports Triton
# while building a model: on a machine without an NVIDIA GPU, switch Triton to its CPU
# interpreter here, before anything imports it, so the Triton backend runs (slowly) on CPU.
if "TRITON_INTERPRET" not in _os.environ and not _os.path.exists("/dev/nvidia0"):
    _os.environ["TRITON_INTERPRET"] = "1"

from pagebench.errors import ConfigError, OutOfBlocksError, PagebenchError, SequenceError  # noqa: E402

__all__ = ["__version__", "PagebenchError", "ConfigError", "OutOfBlocksError", "SequenceError"]
