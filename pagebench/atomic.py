"""Files and directories replaced whole: a reader, or a run killed half-way, sees the old
version or the new one, never a mixture."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def replace_dir(target, fill: Callable[[Path], None]) -> None:
    """Build a new ``target`` directory with ``fill(new_dir)`` beside it, then swap it in by
    renames (the old one is removed after): ``target`` is never half-written."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".new", dir=target.parent))
    old = None
    try:
        fill(new)
        os.chmod(new, 0o777 & ~_umask())
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old",
                                        dir=target.parent))
            os.replace(target, old)  # an empty directory is replaced by a rename
        try:
            os.rename(new, target)
        except BaseException:
            if old is not None:
                os.replace(old, target)
                old = None
            raise
    finally:
        shutil.rmtree(new, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
