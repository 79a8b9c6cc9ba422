"""pagebench: a benchmarking and regression harness for paged KV-cache attention."""

__version__ = "0.1.0"

from pagebench.errors import ConfigError, OutOfBlocksError, PagebenchError, SequenceError

__all__ = ["__version__", "PagebenchError", "ConfigError", "OutOfBlocksError", "SequenceError"]
