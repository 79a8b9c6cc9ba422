"""The order of the commits result rows were measured at (their ``commit`` column: a short
hash, ``<hash>-dirty`` for uncommitted changes over it, or empty where not recorded), for the
tables that show one run: the newest. A commit is as new as its newest row's ``timestamp``
(the UTC start of the run that measured it). Rows measured before rows carried one have none;
such a commit is placed by its date in the git history of the checkout this package runs
from, the one place git is still asked.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterable

from pagebench.results.collect import repo_root

DIRTY = "-dirty"
HASH = re.compile(r"[0-9a-f]{4,40}")


@functools.cache
def commit_time(commit: str) -> int | None:
    """The committer date (Unix seconds) of the commit whose hash is ``commit`` in this
    checkout's history; None where git, the checkout or the commit is unknown."""
    if not HASH.fullmatch(commit):
        return None
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", commit, "--"], cwd=repo_root(),
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    stamp = out.stdout.strip()
    return int(stamp) if out.returncode == 0 and stamp.isdigit() else None


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
    """The distinct ``commits``, newest first: by when their rows were measured (``measured``,
    from :func:`measured_at`), else by :func:`commit_time`, a ``-dirty`` one just before its
    base; those with neither come after every one dated (older, or from elsewhere), in reverse
    name order so that the choice is the same on every run."""
    measured = measured or {}

    def age(commit: str):
        time = measured.get(commit)
        if time is None:
            time = commit_time(commit.removesuffix(DIRTY))
        return time is not None, time or 0, commit.endswith(DIRTY), commit

    return sorted(set(commits), key=age, reverse=True)
