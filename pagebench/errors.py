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
    return check_int(name, value, 1)


def check_int(name: str, value, least: int = 0) -> int:
    """``value`` as a plain int if it is an integer >= ``least`` (numpy's too; not a bool,
    nor numpy's, which is no ``Integral``), else ConfigError naming ``name``. Callers keep
    the int it returns: a numpy integer kept as given fails later checks that want an int."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ConfigError(f"{name}: must be {what}, got {value!r}")
    return int(value)
