"""A dataset's schema: its columns, each with a type and a meaning, and the one check that a
table (a file read back, or rows a sweep just measured) has them.

Writers build rows with :meth:`Schema.row` (a columnar table, such as a simulator's timeline,
with :meth:`Schema.table`), readers pass frames through :meth:`Schema.validate`; both read the
same :class:`Column` list, so a renamed column fails at the writer, not in a report section
months later. Extra columns (the environment, notes) are kept: tidy rows may carry context the
schema does not name. pandas is imported by the reader only: the simulators that write rows
load numpy alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pagebench.errors import PagebenchError

if TYPE_CHECKING:
    import pandas as pd

DTYPES = ("str", "int", "float", "bool")
TIME_UNITS = ("_us", "_ms", "_s")  # a float column whose name ends so is a time ("_per_s": a rate)
TRUE_WORDS, FALSE_WORDS = ("true", "1", "1.0", "yes", "on"), ("false", "0", "0.0", "no", "off")


class DataError(PagebenchError, ValueError):
    """A results file or frame that cannot be used; the message names the source and column."""


@dataclass(frozen=True)
class Column:
    """One column: ``dtype`` is ``str``, ``int`` (a missing value allowed: a contiguous row's
    ``block_size``), ``float`` or ``bool``; ``nullable``: an empty value in a required column
    is a value (its meaning says what it means), not a gap in the data."""

    name: str
    dtype: str
    meaning: str
    required: bool = True
    nullable: bool = False

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")


def optional(*columns: Column) -> tuple[Column, ...]:
    """The same columns, not required (a row may leave them out)."""
    return tuple(replace(c, required=False) for c in columns)


def nullable(column: Column) -> Column:
    """The same column, whose empty values mean something (:attr:`Column.nullable`)."""
    return replace(column, nullable=True)


@dataclass(frozen=True)
class Schema:
    """A dataset: its name (the report's key, and the ``experiment`` of engine rows), what one
    row is, and its columns."""

    name: str
    meaning: str
    columns: tuple[Column, ...]

    def __post_init__(self):
        names = [c.name for c in self.columns]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"columns: {self.name} names {', '.join(twice)} twice")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def required(self) -> list[str]:
        return [c.name for c in self.columns if c.required]

    def row(self, **fields) -> dict:
        """One row of this dataset; ``ValueError`` naming the required fields left out."""
        self._check_names(fields, "row")
        return fields

    def table(self, data):
        """``data`` (column name -> values: a dict of arrays or a DataFrame) as a table of this
        dataset; ``ValueError`` naming the required columns left out."""
        self._check_names(data, "table")
        return data

    def _check_names(self, names: Iterable[str], what: str) -> None:
        present = set(names)
        missing = [n for n in self.required if n not in present]
        if missing:
            raise ValueError(f"{self.name} {what}: missing {', '.join(missing)}")

    def validate(self, frame: pd.DataFrame, source: str,
                 warn: Callable[[str], None] | None = None) -> pd.DataFrame:
        """``frame`` with every declared column coerced to its type and exact duplicate rows
        dropped; :class:`DataError` naming ``source`` and the column when a required column is
        missing or a value has the wrong type. ``warn`` (a message) is told of the rows kept
        that are suspect: an empty value in a required column that is not ``nullable``, a
        time that is negative or not finite, and of the duplicates dropped."""
        missing = [n for n in self.required if n not in frame.columns]
        if missing:
            raise DataError(f"{self.name}: {source}: missing column(s) {', '.join(missing)}")
        where = f"{self.name}: {source}"
        frame = frame.copy()
        for col in self.columns:
            if col.name in frame.columns:
                frame[col.name] = coerce(frame[col.name], col, where)
        problems = [f"column {c.name}: {n} {what}" for c, n, what in self._suspect(frame) if n]
        twice = frame.astype(str).duplicated()
        if twice.any():
            problems.append(f"{int(twice.sum())} exact duplicate rows dropped")
            frame = frame[~twice]
        if problems and warn is not None:
            warn(f"{where}: " + "; ".join(problems))
        return frame

    def _suspect(self, frame: pd.DataFrame):
        """(column, rows, what is wrong) of the checks :meth:`validate` warns about."""
        for col in self.columns:
            if col.name not in frame.columns:
                continue
            values = frame[col.name]
            if col.required and not col.nullable:
                yield col, int(values.isna().sum()), "empty value(s) in a required column"
            if is_time(col):
                yield col, int(((values < 0) | (values == float("inf"))).sum()), \
                    "negative or infinite time(s)"


def is_time(col: Column) -> bool:
    """A float column whose unit (its name's ending, :data:`TIME_UNITS`) is a time."""
    return col.dtype == "float" and col.name.endswith(TIME_UNITS) \
        and not col.name.endswith("_per_s")

def coerce(values: pd.Series, col: Column, where: str) -> pd.Series:
    import pandas as pd

    if col.dtype == "str":
        return values
    if col.dtype == "bool":
        if values.dtype == bool:
            return values
        words = values.map(lambda v: v if pd.isna(v) else str(v).strip().lower())
        bad = words.notna() & ~words.isin(TRUE_WORDS + FALSE_WORDS)
        if bad.any():
            raise DataError(f"{where}: column {col.name}: {values[bad].iloc[0]!r} is not a "
                            "boolean")
        return words.map(lambda w: w if pd.isna(w) else w in TRUE_WORDS).astype("boolean")
    numbers = pd.to_numeric(values, errors="coerce")
    bad = numbers.isna() & values.notna() & (values.astype(str).str.strip() != "")
    if bad.any():
        raise DataError(f"{where}: column {col.name}: {values[bad].iloc[0]!r} is not a number")
    if col.dtype == "float":
        return numbers.astype(float)
    fractional = numbers.notna() & (numbers != numbers.round())
    if fractional.any():
        raise DataError(f"{where}: column {col.name}: {numbers[fractional].iloc[0]:g} is not "
                        "an integer")
    # int64 would wrap a larger value around (2**70 read as -2**63) without a word; compared
    # as floats (above 2**53 a value is read as one), so -2**63 itself is refused too
    outside = numbers.notna() & (numbers.abs() >= 2**63)
    if outside.any():
        raise DataError(f"{where}: column {col.name}: {values[outside].iloc[0]} (row "
                        f"{int(outside.to_numpy().argmax()) + 1}) does not fit a 64-bit "
                        "integer")
    # plain int64 where nothing is missing (what pandas reads back), nullable Int64 otherwise
    return numbers.astype("int64" if numbers.notna().all() else "Int64")
