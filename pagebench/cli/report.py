"""`pagebench report`: one self-contained HTML page with a verdict on every article claim."""

from __future__ import annotations

import os
import sys

from pagebench.cli.options import check_input_dir, check_output_file


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="build the HTML report (sweeps here + committed GPU data)",
        description="Run the quick sweeps this machine affords, read committed data under "
        "reports/data/ plus asv and pytest-benchmark results, and write one self-contained "
        "HTML page with the tidy data (CSV) beside it.")
    p.add_argument("--quick", action="store_true",
                   help="run only the simulators (seconds); skip the CPU kernel and engine sweeps")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="device for the sweeps run here (default: cuda if available, else cpu)")
    p.add_argument("--results", action="append", default=[], metavar="DIR",
                   help="extra directory of results (CSV/JSON, asv, pytest-benchmark); repeatable")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="committed data directory (default: reports/data in the repository)")
    p.add_argument("--out", default="reports/index.html",
                   help="output page, or a directory for its index.html (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="do not print progress lines")
    p.set_defaults(func=run_report)


def page_path(out: str) -> str:
    """``out``, or ``out/index.html`` when it names a directory (existing, or ending in /)."""
    if out.endswith(("/", os.sep)) or os.path.isdir(out):
        return os.path.join(out, "index.html")
    return out


def run_report(args) -> int:
    for path in args.results:
        check_input_dir("--results", path)
    check_input_dir("--data-dir", args.data_dir)
    out = page_path(args.out)
    check_output_file("--out", out)
    from pagebench.suite import build_report

    path, results = build_report(out, device=args.device, quick=args.quick,
                                 results_dirs=args.results, data_dir=args.data_dir,
                                 progress=not args.no_progress)
    for w in results.warnings:
        print(f"pagebench report: warning: {w}", file=sys.stderr)
    print(f"wrote {path} ({len(results.frames)} datasets, {len(results.warnings)} warnings)")
    return 0
