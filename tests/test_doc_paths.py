"""Every ``scripts/...`` and ``reports/data/...`` path that the package, the README, the docs or
the runbooks cite exists in this checkout, or is cited as ``git show <commit>:path`` (a file
that left the tree: docs/experiments.md). A deleted file must not live on as a pointer that
leads nowhere. (Tests are left out: they name made-up files on purpose, and one that reads a
deleted file fails by itself.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"(?<![\w/.-])(?:scripts|reports/data)/[\w./<>{},*-]*")
# `git show 969152e:scripts/x.py` (any short or full hash, a `HEAD~1`, a branch name)
FROM_HISTORY = re.compile(r"git show [\w~^.-]+:$")


def sources() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for folder, pattern in (("pagebench", "*.py"), ("scripts", "*")):
        files += sorted(p for p in (REPO / folder).rglob(pattern) if p.is_file()
                        and "__pycache__" not in p.parts)
    return [p for p in files if p.suffix in (".py", ".md", ".sh", "")]


def expand(path: str) -> list[str]:
    """``a/{b,c}.csv`` -> ``a/b.csv``, ``a/c.csv`` (one level, as the docs write them)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",")
            for x in expand(path[:m.start()] + alt + path[m.end():])]


def exists(path: str) -> bool:
    if "<" in path:  # a placeholder (reports/data/<machine>/): the folder before it
        path = path[:path.index("<")]
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists()


def cited_paths(text: str) -> list[tuple[int, str]]:
    found = []
    for m in CITED.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if FROM_HISTORY.search(text[line_start:m.start()]):
            continue
        line = text.count("\n", 0, m.start()) + 1
        found += [(line, p) for p in expand(m.group(0).rstrip(".,:;"))]
    return found


def test_the_check_sees_a_deleted_path_and_accepts_one_from_history():
    text = ("see scripts/no_such_probe.py, reports/data/h200/{kernels,gone}.csv and\n"
            "`git show 969152e:scripts/h200_prefill_ab.py`")
    missing = [p for _, p in cited_paths(text) if not exists(p)]
    assert missing == ["scripts/no_such_probe.py", "reports/data/h200/gone.csv"]


@pytest.mark.parametrize("source", sources(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_cited_path_exists(source):
    text = source.read_text(encoding="utf-8", errors="replace")
    missing = [f"{line}: {p}" for line, p in cited_paths(text) if not exists(p)]
    assert not missing, f"{source.relative_to(REPO)} cites paths that are not in the tree: {missing}"
