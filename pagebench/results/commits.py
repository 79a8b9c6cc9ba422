"""The order of the commits result rows were measured at (their ``commit`` column: a short
hash, ``<hash>-dirty`` for uncommitted changes over it, or empty where not recorded), for the
tables that show one run: the newest. A commit is as new as its newest row's ``timestamp``
(the UTC start of the run that measured it; rows committed before rows carried one were given
their commit's date). Git is never asked: the rows alone decide.
"""

from __future__ import annotations

from collections.abc import Iterable

DIRTY = "-dirty"


def measured_at(rows) -> dict[str, float]:
    """Commit -> Unix time of its newest row's ``timestamp``, for the commits of ``rows`` (a
    DataFrame with ``commit`` and perhaps ``timestamp`` columns) that have one."""
    import pandas as pd

    if "timestamp" not in rows.columns:
        return {}
    times = pd.to_datetime(rows["timestamp"], utc=True, errors="coerce")
    stamped = pd.DataFrame({"commit": rows["commit"], "t": times}).dropna()
    return {str(c): t.timestamp() for c, t in stamped.groupby("commit")["t"].max().items()}


def newest_first(commits: Iterable[str], measured: dict[str, float] | None = None) -> list[str]:
    """The distinct ``commits``, newest first by when their rows were measured (``measured``,
    from :func:`measured_at`), a ``-dirty`` one before its base at the same time; those without
    a time come after every one dated, in reverse name order so that the choice is the same on
    every run."""
    measured = measured or {}

    def age(commit: str):
        time = measured.get(commit)
        return time is not None, time or 0, commit.endswith(DIRTY), commit

    return sorted(set(commits), key=age, reverse=True)
