"""What ``pagebench report`` may write over: its own page and data directory, nothing else.

The page (``<stem>.html``) carries :data:`GENERATOR_META` in its head, and its data directory
(``<stem>_data/``) a :data:`MARKER` file listing the CSVs written there. Before writing, the
report refuses (ValueError: one line, exit status 2 on the command line) a page path that
exists and is not a pagebench page, a data directory that exists and holds anything pagebench
did not write, and a page or data directory inside (or over) a directory the report reads.

Reports written before the marker are recognised by what pagebench always wrote: a page whose
head has the title ``pagebench: ...``, and beside it a data directory of CSVs only, each named
after a dataset or linked from that page; so re-running over an older report works.
"""

from __future__ import annotations

import re
from pathlib import Path

from pagebench.results.datasets import DATASETS, DERIVED, report_data_dir

GENERATOR = "pagebench report"
GENERATOR_META = f'<meta name="generator" content="{GENERATOR}">'
# the head of every page pagebench wrote before GENERATOR_META: the template's first line and
# the title ("pagebench: paged KV-cache report")
LEGACY_PAGE_START, LEGACY_TITLE = "<!DOCTYPE html>", "<title>pagebench: "
MARKER = ".pagebench-report"
MARKER_HEADER = "pagebench report data"
HEAD_BYTES = 16384  # the head, style sheet included, is about 4 KB


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        text = f.read(HEAD_BYTES).decode("utf-8", errors="replace")
    return text.split("</head>", 1)[0]


def is_report_page(path) -> bool:
    """``path`` is a regular file that pagebench wrote as a report page (this version's
    generator tag, or an earlier version's head). A symbolic link is not, whatever it points
    to: writing the page replaces the link itself with a file."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():  # a FIFO or a device is never read (it could block)
        return False
    try:
        head = _head(path)
    except OSError:
        return False
    return GENERATOR_META in head or (head.startswith(LEGACY_PAGE_START)
                                      and LEGACY_TITLE in head)


def marker_text(files) -> str:
    """The :data:`MARKER` of a data directory holding ``files`` (names)."""
    return (f"{MARKER_HEADER}\n# written by `pagebench report` beside its page, with the files "
            "below; the next run replaces this directory whole, so keep nothing else here\n"
            + "".join(f"{name}\n" for name in sorted(files)))


def marked_files(data_dir) -> set[str] | None:
    """The file names ``data_dir``'s marker lists; None without a (valid) marker."""
    path = Path(data_dir) / MARKER
    if path.is_symlink() or not path.is_file():
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0] != MARKER_HEADER:
        return None
    return {ln for ln in lines[1:] if ln and not ln.startswith("#")}


def _legacy_names(page: Path) -> set[str]:
    """CSV names an earlier version may have written beside ``page``: every dataset and
    derived table, and every CSV the page links to in its data directory."""
    names = {f"{n}.csv" for n in (*DATASETS, *DERIVED)}
    prefix = re.escape(report_data_dir(page).name + "/")
    try:
        text = page.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return names
    return names | set(re.findall(rf'href="{prefix}([^"/]+\.csv)"', text))


def foreign(data_dir, page) -> str | None:
    """Why ``data_dir`` (existing), the data directory of ``page``, is not pagebench's to
    replace; None when it is: every entry is a file pagebench wrote there (listed in its
    marker; without one, beside a pagebench page, a CSV an earlier version wrote)."""
    data_dir, page = Path(data_dir), Path(page)
    if data_dir.is_symlink():
        return "is a symbolic link"
    if not data_dir.is_dir():
        return "is not a directory"
    listed = marked_files(data_dir)
    if listed is None:
        if not is_report_page(page):
            return (f"has no pagebench marker ({MARKER}) and no pagebench page {page.name} "
                    "beside it")
        listed = _legacy_names(page)
    strays = sorted(p.name for p in data_dir.iterdir() if p.name != MARKER and not (
        p.name in listed and p.is_file() and not p.is_symlink()))
    if not strays:
        return None
    more = f" and {len(strays) - 3} more" if len(strays) > 3 else ""
    return f"holds {', '.join(strays[:3])}{more}, which pagebench did not write"


def check_outside_inputs(option: str, path, inputs, data_dir=None) -> None:
    """ValueError (naming ``option``) unless ``path``, a file to write, lies outside every
    directory of ``inputs`` ((what, directory) pairs, e.g.
    :func:`pagebench.results.collect.input_dirs`), and ``data_dir``, a directory to replace
    whole, neither is nor holds one of them. Real paths are compared (a link counts)."""
    if path is None or str(path) == "-":
        return
    real_path = Path(path).resolve()
    real_data = Path(data_dir).resolve() if data_dir is not None else None
    for what, directory in inputs:
        directory = Path(directory)
        if not directory.exists():
            continue
        real = directory.resolve()
        if real == real_path or real in real_path.parents:
            raise ValueError(f"{option}: {path} is inside {what} {directory}, which is read "
                             "as input; writing there would replace or add to the input: give "
                             "a path outside it")
        if real_data is not None and (real == real_data or real_data in real.parents):
            raise ValueError(f"{option}: the page's data directory {data_dir} would replace "
                             f"{what} {directory}, which is read as input: give another "
                             "page name")


def check_report_output(page, inputs=(), option: str = "--out") -> None:
    """ValueError (one line, naming ``option``) unless writing report page ``page`` and its
    data directory replaces only what pagebench wrote: ``page`` absent or a pagebench page,
    its data directory absent or a pagebench data directory (:func:`foreign`), and neither
    inside, nor holding, a directory of ``inputs`` (:func:`check_outside_inputs`). Reads, and
    writes nothing."""
    page = Path(page)
    data = report_data_dir(page)
    check_outside_inputs(option, page, inputs, data)
    if (page.exists() or page.is_symlink()) and not is_report_page(page):
        what = "is a symbolic link, not" if page.is_symlink() else "exists and is not"
        raise ValueError(f"{option}: {page} {what} a pagebench report page; pagebench will "
                         "not overwrite it: give another path, or remove it first")
    if data.exists() or data.is_symlink():
        why = foreign(data, page)
        if why is not None:
            raise ValueError(f"{option}: {data} (the page's data directory, replaced whole on "
                             f"each run) exists and {why}: move it away or give another "
                             f"{option}")
