"""pagebench: a benchmarking and regression harness for paged KV-cache attention."""

from pagebench.errors import ConfigError, OutOfBlocksError, PagebenchError, SequenceError

__version__ = "0.1.0"

__all__ = ["__version__", "PagebenchError", "ConfigError", "OutOfBlocksError", "SequenceError"]
