"""`pagebench bench-compare`: the regression gate (see :mod:`pagebench.measure.regression_gate`)."""

from __future__ import annotations

import json

from pagebench.measure import regression_gate as d  # standard library only: cheap to import
from pagebench.cli.options import (check_output_dir, check_output_file, dumps, integer, number,
                                   write_results)

# options of a run on two commits (dest -> (flag, default)): refused with --base-json/--head-json,
# which run nothing
RUN_OPTIONS = {"base": ("--base", None), "head": ("--head", "HEAD"),
               "repeat": ("--repeat", d.REPEAT), "confirm": ("--confirm", d.CONFIRM),
               "repo": ("--repo", "."), "bench_dir": ("--bench-dir", "tests/benchmarks"),
               "select": ("-k", None), "marks": ("-m", "not slow"),
               "max_time": ("--max-time", d.MAX_TIME), "out_dir": ("--out-dir", None)}


def register(sub) -> None:
    p = sub.add_parser(
        "bench-compare", help="regression gate: benchmarks on two commits, fail if slower",
        description="Run the quick benchmark suite (tests/benchmarks) on two commits of this "
        "repository and exit 1 when any benchmark is more than --threshold slower on --head. "
        "With --base-json/--head-json, compare two existing pytest-benchmark JSON files instead. "
        "Exit status: 0 no regression, 1 regressions or benchmarks that ran on base but not "
        "on head, 2 an error or results it cannot judge.")
    p.add_argument("--base", help="base revision (e.g. main, HEAD~1)")
    p.add_argument("--head", default=None, help="head revision, or '.' for the working tree "
                   "with uncommitted changes (default: HEAD; refused when the working tree has "
                   "uncommitted changes)")
    p.add_argument("--threshold", type=number(0, d.MAX_THRESHOLD), default=d.THRESHOLD,
                   help=f"slowdown that fails, as a fraction: 0.1 = more than 10%% slower "
                   f"(at most {d.MAX_THRESHOLD:g}; default: {d.THRESHOLD})")
    p.add_argument("--allow-missing", action="store_true",
                   help="pass benchmarks that ran on base but not on head (removed, renamed or "
                   "skipped there); by default they fail the gate")
    p.add_argument("--repeat", type=integer(1, 100), default=None,
                   help=f"alternating runs per commit (default: {d.REPEAT})")
    p.add_argument("--confirm", type=integer(0, 100), default=None,
                   help=f"extra alternating runs of benchmarks that look slower "
                   f"(default: {d.CONFIRM})")
    p.add_argument("--stat", choices=d.STATS, default=d.STAT,
                   help=f"statistic of the rounds that is compared: min over every round of "
                   f"every run, or the median or mean of each run's rounds combined by the median "
                   f"of runs (default: {d.STAT})")
    p.add_argument("--repo", default=None, help="repository (default: the current one)")
    p.add_argument("--bench-dir", default=None,
                   help="benchmark files inside the head commit (default: tests/benchmarks)")
    p.add_argument("-k", dest="select", help="only benchmarks matching this pytest -k expression")
    p.add_argument("-m", dest="marks", default=None,
                   help="pytest -m marker expression (default: 'not slow')")
    p.add_argument("--max-time", type=number(0, 600), default=None,
                   help=f"seconds per benchmark per run (pytest-benchmark --benchmark-max-time; "
                   f"default: {d.MAX_TIME})")
    p.add_argument("--out-dir", help="keep the raw pytest-benchmark JSON of every run here")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--out", metavar="FILE", help="also write the comparison to FILE: JSON if "
                   "it ends in .json, else CSV (one row per benchmark)")
    p.add_argument("--base-json", metavar="FILE",
                   help="compare this pytest-benchmark JSON (base) ...")
    p.add_argument("--head-json", metavar="FILE", help="... with this one (head); runs nothing "
                   "(the options of a run on two commits, --base to --out-dir, are refused)")
    p.set_defaults(func=run)


def _load(path: str) -> dict:
    from pathlib import Path

    from pagebench.errors import ConfigError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"results: cannot read {path}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"results: {path} is not JSON ({e})") from None


def run(args) -> int:
    from pathlib import Path

    from pagebench.measure.regression_gate import (bench_compare, compare, format_table, missing,
                                        printable, regressions, timings)
    from pagebench.errors import ConfigError

    check_output_file("--out", args.out)
    if args.base_json or args.head_json:
        if not (args.base_json and args.head_json):
            raise ConfigError("--base-json, --head-json: give both")
        given = [flag for dest, (flag, _) in RUN_OPTIONS.items()
                 if getattr(args, dest) is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: not with --base-json/--head-json (they "
                              "compare two files and run nothing)")
        changes = compare(timings(_load(args.base_json), args.stat),
                          timings(_load(args.head_json), args.stat))
        base_label, head_label = (printable(Path(f).stem) for f in (args.base_json,
                                                                   args.head_json))
    else:
        run = {dest: default if getattr(args, dest) is None else getattr(args, dest)
               for dest, (_, default) in RUN_OPTIONS.items()}
        if not run["base"]:
            raise ConfigError("--base: give --base REV (or --base-json/--head-json)")
        check_output_dir("--out-dir", run["out_dir"])
        changes, base_label, head_label = bench_compare(
            Path(run["repo"]), run["base"], run["head"], threshold=args.threshold,
            repeat=run["repeat"], confirm=run["confirm"], stat=args.stat,
            bench_dir=run["bench_dir"], select=run["select"], marks=run["marks"],
            max_time=run["max_time"], out_dir=run["out_dir"])
    slower = regressions(changes, args.threshold)
    gone = missing(changes)
    failed = bool(slower or (gone and not args.allow_missing))
    doc = {"base": base_label, "head": head_label, "threshold": args.threshold,
           "stat": args.stat, "changes": [c.to_dict(args.threshold) for c in changes],
           "regressions": [c.name for c in slower], "missing": [c.name for c in gone],
           "allow_missing": args.allow_missing, "passed": not failed}
    write_results(args.out, doc["changes"], doc)
    if args.json:
        print(dumps(doc))
        return 1 if failed else 0
    print(format_table(changes, args.threshold, base_label, head_label))
    new = [c for c in changes if c.base_s is None]
    if new:
        print(f"\n{len(new)} benchmark(s) new on {head_label[:12]}: not judged")
    if gone:
        verdict = ("passed (--allow-missing)" if args.allow_missing
                   else "the gate fails (--allow-missing passes them)")
        print(f"\n{len(gone)} benchmark(s) ran on {base_label[:12]} but not on "
              f"{head_label[:12]} (removed, renamed or skipped there): {verdict}")
        for c in gone:
            print(f"  {printable(c.name)}")
    if slower:
        print(f"\n{len(slower)} benchmark(s) more than {args.threshold:.0%} slower on "
              f"{head_label[:12]} than on {base_label[:12]}:")
        for c in slower:
            print(f"  {printable(c.name)}: {c.ratio:.2f}x")
    else:
        print(f"\nno benchmark more than {args.threshold:.0%} slower "
              f"({sum(c.ratio is not None for c in changes)} compared)")
    return 1 if failed else 0
