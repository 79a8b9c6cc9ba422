"""The reference paged engine: block pool, block manager, scheduler, model runner, engine."""

from pagebench.engine.block_manager import BlockManager
from pagebench.engine.block_pool import BlockPool

__all__ = ["BlockManager", "BlockPool"]
