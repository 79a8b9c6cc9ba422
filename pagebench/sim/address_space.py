"""One contiguous address space of token slots with first-fit placement.

Holes (free runs) are kept sorted by address in preallocated numpy arrays, so the first-fit
search is one vectorised pass, and freeing merges a run with its neighbours. The number of holes
never exceeds the number of live allocations plus one.
"""

from __future__ import annotations

import numpy as np

from pagebench.errors import ConfigError


class FirstFitSpace:
    """``capacity`` slots; ``allocate(size)`` returns the lowest address of a hole that fits."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ConfigError(f"capacity: must be a positive integer, got {capacity!r}")
        self.capacity = int(capacity)
        self._starts = np.zeros(64, dtype=np.int64)
        self._sizes = np.zeros(64, dtype=np.int64)
        self._sizes[0] = self.capacity
        self._count = 1
        self.free = self.capacity

    @property
    def num_holes(self) -> int:
        return self._count

    @property
    def holes(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every hole, by address."""
        m = self._count
        return list(zip(self._starts[:m].tolist(), self._sizes[:m].tolist()))

    @property
    def largest_hole(self) -> int:
        return int(self._sizes[:self._count].max()) if self._count else 0

    def allocate(self, size: int) -> int | None:
        """Address of a new run of ``size`` slots, or None (state unchanged) if no hole fits."""
        if size < 1:
            raise ConfigError(f"size: must be positive, got {size}")
        if size > self.free:
            return None
        m = self._count
        fits = self._sizes[:m] >= size
        i = int(fits.argmax())
        if not fits[i]:
            return None
        address = int(self._starts[i])
        if self._sizes[i] == size:
            self._remove(i)
        else:
            self._starts[i] += size
            self._sizes[i] -= size
        self.free -= size
        return address

    def release(self, address: int, size: int) -> None:
        """Return the run ``[address, address + size)``, merging it with adjacent holes."""
        m = self._count
        starts, sizes = self._starts, self._sizes
        i = int(np.searchsorted(starts[:m], address))
        end = address + size
        left_end = int(starts[i - 1] + sizes[i - 1]) if i > 0 else -1
        right_start = int(starts[i]) if i < m else self.capacity + 1
        if address < 0 or end > self.capacity or left_end > address or right_start < end:
            raise ConfigError(f"release: run at {address} of {size} slots is not allocated")
        if left_end == address and right_start == end:
            sizes[i - 1] += size + sizes[i]
            self._remove(i)
        elif left_end == address:
            sizes[i - 1] += size
        elif right_start == end:
            starts[i] = address
            sizes[i] += size
        else:
            self._insert(i, address, size)
        self.free += size

    def _remove(self, i: int) -> None:
        m = self._count
        self._starts[i:m - 1] = self._starts[i + 1:m]
        self._sizes[i:m - 1] = self._sizes[i + 1:m]
        self._count = m - 1

    def _insert(self, i: int, address: int, size: int) -> None:
        m = self._count
        if m == self._starts.size:
            self._starts = np.concatenate([self._starts, np.zeros(m, dtype=np.int64)])
            self._sizes = np.concatenate([self._sizes, np.zeros(m, dtype=np.int64)])
        self._starts[i + 1:m + 1] = self._starts[i:m]
        self._sizes[i + 1:m + 1] = self._sizes[i:m]
        self._starts[i] = address
        self._sizes[i] = size
        self._count = m + 1
