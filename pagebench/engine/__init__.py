"""The reference paged engine: block pool, block manager, scheduler, model runner, engine."""

from pagebench.engine.block_manager import BlockManager
from pagebench.engine.block_pool import BlockPool

__all__ = ["BlockManager", "BlockPool", "LLMEngine", "SamplingParams", "RequestOutput",
           "CompletionOutput"]

_LAZY = {"LLMEngine": "pagebench.engine.engine", "SamplingParams": "pagebench.engine.sampling",
         "RequestOutput": "pagebench.engine.sampling",
         "CompletionOutput": "pagebench.engine.sampling"}


def __getattr__(name):  # the engine needs torch: import it only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pagebench.engine' has no attribute {name!r}")
