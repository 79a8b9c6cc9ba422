"""What the H200 A/B scripts (``h200_prefill_ab.py``, ``h200_decode_ab.py``) share: their common
options, forced launch options parsed from ``key=value,...``, another version of a kernel module
loaded beside the package's, and the two CSVs each writes."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from pagebench.defaults import SHAPES


def ab_parser(description: str, module: str, launch_help: str,
              points_help: str) -> argparse.ArgumentParser:
    """The options every A/B script takes; ``module`` names the kernel file ``--copy`` replaces."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--copy", default="", help=f"a copy of {module} to time too")
    parser.add_argument("--launch", action="append", default=[], help=launch_help)
    parser.add_argument("--shape", default="llama-3-8b", choices=sorted(SHAPES))
    parser.add_argument("--points", default="", help=points_help)
    return parser


def parse_launch(text: str) -> dict:
    """``rows=64,one_loop=True,maxnreg=None`` -> keyword arguments (ints, booleans, None)."""
    def value(v: str):
        if v in ("True", "False"):
            return v == "True"
        return None if v == "None" else int(v)
    return {key: value(v) for key, v in (item.split("=", 1) for item in text.split(","))}


def parse_points(text: str, default: list) -> list:
    """``8x512x0,1x2048x0`` -> tuples of ints (``default`` for an empty text)."""
    return [tuple(int(n) for n in p.split("x")) for p in text.split(",")] if text else default


def load_copy(path: str, name: str):
    """The module in ``path`` under ``name``, registered in ``sys.modules`` (dataclasses look
    their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_results(out_dir: str, stem: str, times, checks) -> None:
    """``stem``.csv (timings) and ``stem``_checks.csv (errors) under ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem)
    times.to_csv(path + ".csv", index=False)
    checks.to_csv(path + "_checks.csv", index=False)
