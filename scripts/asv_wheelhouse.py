"""Repack installed pure-Python distributions as wheels, so asv can build its environments offline.

asv installs ``asv_runner`` and ``pympler`` into every environment it creates. On a machine with
no package index they cannot be downloaded, but the development ``.venv`` already holds them:
this script writes ``NAME-VERSION-py3-none-any.whl`` files for them into a folder that pip then
finds through ``PIP_FIND_LINKS`` (the Makefile's asv targets add ``.asv/wheelhouse``).

    .venv/bin/python scripts/asv_wheelhouse.py [--dest .asv/wheelhouse] [NAME ...]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata as metadata
import os
import re
import sys
import zipfile

DEFAULT_NAMES = ("asv_runner", "pympler")
SKIP_METADATA = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(name: str, dest: str) -> str:
    """Write a wheel of the installed distribution ``name`` into ``dest``; returns its path."""
    dist = metadata.distribution(name)
    wheel_meta = dist.read_text("WHEEL") or ""
    if "Root-Is-Purelib: true" not in wheel_meta:
        raise SystemExit(f"{name}: not a pure-Python distribution; download its wheel instead")
    project = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    version = dist.version
    path = os.path.join(dest, f"{project}-{version}-py3-none-any.whl")
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        dist_info = None
        for file in dist.files or []:
            rel = str(file)
            parts = rel.split("/")
            if rel.startswith("..") or "__pycache__" in parts or rel.endswith(".pyc"):
                continue
            if parts[0].endswith(".dist-info"):
                dist_info = parts[0]
                if parts[-1] in SKIP_METADATA:
                    continue
            data = file.read_binary()
            whl.writestr(rel, data)
            records.append(f"{rel},{_digest(data)},{len(data)}")
        if dist_info is None:
            raise SystemExit(f"{name}: installed without a .dist-info folder")
        records.append(f"{dist_info}/RECORD,,")
        whl.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(DEFAULT_NAMES))
    parser.add_argument("--dest", default=".asv/wheelhouse")
    args = parser.parse_args(argv)
    os.makedirs(args.dest, exist_ok=True)
    for name in args.names:
        try:
            print(repack(name, args.dest))
        except metadata.PackageNotFoundError:
            print(f"{name}: not installed in {sys.prefix}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
