"""The order of the commits result rows were measured at (their ``commit`` column: a short
hash, ``<hash>-dirty`` for uncommitted changes over it, or empty where not recorded), for the
tables that show one run: the newest. Rows carry no time of their own, so the order is the
commits' dates in the git history of the checkout this package runs from.
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


def newest_first(commits: Iterable[str]) -> list[str]:
    """The distinct ``commits``, newest first: by :func:`commit_time`, a ``-dirty`` one just
    before its base; those git does not know come after every one it knows (older, or from
    elsewhere), in reverse name order so that the choice is the same on every run."""
    def age(commit: str):
        time = commit_time(commit.removesuffix(DIRTY))
        return time is not None, time or 0, commit.endswith(DIRTY), commit

    return sorted(set(commits), key=age, reverse=True)
