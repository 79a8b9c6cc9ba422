"""The library's error types. A failed operation leaves every object it touched unchanged."""

from numbers import Integral


class PagebenchError(Exception):
    """Base class of every error pagebench raises on purpose."""


class ConfigError(PagebenchError, ValueError):
    """A configuration value is missing, out of range or inconsistent."""


class OutOfBlocksError(PagebenchError):
    """The block pool has too few free blocks for the request."""


class SequenceError(PagebenchError, KeyError):
    """An unknown or duplicate sequence id."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


def check_positive_int(name: str, value) -> int:
    """``value`` as an int if it is an integer >= 1 (numpy's too; not a bool, nor numpy's,
    which is no ``Integral``), else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
    return int(value)
