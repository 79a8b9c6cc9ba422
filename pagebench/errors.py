"""The library's error types. A failed operation leaves every object it touched unchanged."""


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
    """``value`` if it is an int >= 1 (not a bool), else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
    return value
