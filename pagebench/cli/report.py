"""`pagebench report`: one self-contained HTML page with a verdict on every article claim;
`pagebench claims`: the verdicts alone, judged from committed data without measuring."""

from __future__ import annotations

import sys

from pagebench.cli.options import check_input_dir, check_output_file, write_results
from pagebench.sim.columns import LENGTHS_FILE_HELP


def add_data_options(p) -> None:
    """``--results`` and ``--data-dir``: where committed and extra results are read from."""
    p.add_argument("--results", action="append", default=[], metavar="DIR",
                   help="extra directory of results (CSV/JSON, asv, pytest-benchmark); repeatable")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="committed data directory (default: reports/data in the repository)")


def check_data_options(args) -> None:
    for path in args.results:
        check_input_dir("--results", path)
    check_input_dir("--data-dir", args.data_dir)


def register(sub) -> None:
    register_claims(sub)
    p = sub.add_parser(
        "report", help="build the HTML report (sweeps here + committed GPU data)",
        description="Run the quick sweeps this machine affords, read committed data under "
        "reports/data/ plus asv and pytest-benchmark results, and write one self-contained "
        "HTML page with the tidy data (CSV) beside it.")
    p.add_argument("--quick", action="store_true",
                   help="run only the simulators (about 47 s on 2 CPU cores); skip the CPU kernel "
                   "and engine sweeps")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="device for the sweeps run here (default: cuda if available, else cpu)")
    add_data_options(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--lengths", metavar="FILE", default=None,
                     help="recommend the block size for these requests (as for `pagebench "
                     "recommend`: " + LENGTHS_FILE_HELP + "); default: the article's lengths")
    src.add_argument("--trace", metavar="NAME|FILE", default=None,
                     help="recommend for a trace (azure-code, azure-conv, mooncake-conv or a "
                     "FILE, as for `pagebench recommend`)")
    p.add_argument("--out", default="reports/index.html",
                   help="output page, or a directory for its index.html (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="do not print progress lines")
    p.set_defaults(func=run_report)


def run_report(args) -> int:
    check_data_options(args)
    from pagebench.report.outputs import check_report_output
    from pagebench.results.collect import input_dirs
    from pagebench.suite import build_report, page_path

    from pagebench.sim.user_workload import load

    # read before the sweeps: a bad file fails in a second, not after them
    workload = None if args.lengths is None and args.trace is None else load(args.lengths,
                                                                             args.trace)
    out = page_path(args.out)  # out/index.html when --out is a directory
    check_output_file("--out", str(out))
    # before the sweeps: replace only a page and data directory pagebench wrote, and write
    # nothing inside a directory the report reads
    check_report_output(out, input_dirs(args.data_dir, args.results))
    path, results = build_report(out, device=args.device, quick=args.quick,
                                 results_dirs=args.results, data_dir=args.data_dir,
                                 progress=not args.no_progress, workload=workload)
    for w in results.warnings:
        print(f"pagebench report: warning: {w}", file=sys.stderr)
    print(f"wrote {path} ({len(results.frames)} datasets, {len(results.warnings)} warnings)")
    return 0


def register_claims(sub) -> None:
    p = sub.add_parser(
        "claims", help="judge every claim from committed data (no measuring; seconds)",
        description="Read committed data under reports/data/ and any --results directories "
        "(as `pagebench report` does, without running a sweep or a simulator), judge every "
        "claim, and print one line per claim (id, verdict, measured headline) and the tally. "
        "Claims whose data only a simulator run makes are 'not measured here' unless "
        "--simulate runs them.")
    add_data_options(p)
    p.add_argument("--simulate", action="store_true",
                   help="also run the simulators `pagebench report --quick` runs (memory, "
                   "capacity, and the first 2,000 requests of each real trace, which the "
                   "verdicts name; `pagebench report` replays whole traces; about 15 s on 2 "
                   "CPU cores)")
    p.add_argument("--csv", default=None, metavar="FILE",
                   help="also write the verdicts (dataset claims: one row per claim) to FILE")
    p.set_defaults(func=run_claims)


def run_claims(args) -> int:
    check_data_options(args)
    check_output_file("--csv", args.csv)
    from pagebench.analysis import analyse
    from pagebench.report.outputs import check_outside_inputs
    from pagebench.results.collect import collect, input_dirs
    from pagebench.results.derived import KINDS, VERDICTS, tally

    check_outside_inputs("--csv", args.csv, input_dirs(args.data_dir, args.results))

    steps = ()
    if args.simulate:
        from pagebench.suite import plan

        steps = plan(run_sweeps=False)
    results = collect(quick=True, steps=steps, data_dir=args.data_dir, results_dirs=args.results,
                      progress=False)
    analyse(results)
    verdicts = results.get("claims")
    key_width, verdict_width = max(map(len, verdicts["key"])), max(map(len, VERDICTS))
    kind_width = max(map(len, KINDS))
    for v in verdicts.itertuples(index=False):
        print(f"{v.key:<{key_width}}  {v.kind:<{kind_width}}  {v.verdict:<{verdict_width}}  "
              f"{v.headline}")
    print(tally(verdicts["verdict"], verdicts["kind"]))
    for w in results.warnings:
        print(f"pagebench claims: warning: {w}", file=sys.stderr)
    write_results(args.csv, verdicts.to_dict("records"))
    return 0
