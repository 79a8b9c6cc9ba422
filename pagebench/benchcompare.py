"""`pagebench bench-compare`: the regression gate.

Runs the quick pytest-benchmark suite (``tests/benchmarks``) against two commits on this machine
and fails when any benchmark got more than ``--threshold`` slower. Each commit is checked out into
a temporary ``git worktree`` and its ``pagebench`` is imported from there (``PYTHONPATH``) by the
current interpreter, so both commits run under the same Python and dependencies. The benchmark
files are the head commit's, run against both packages: the same measurement, two codes.

Runs alternate base, head, base, head... (``--repeat``); each benchmark's statistic (the median
of its rounds by default) is combined over the runs by taking the median. Benchmarks that look
slower are then run ``--confirm`` more times on both commits before the verdict: on a shared
machine a single lucky or unlucky run must not decide it.

Exit status: 0 no regression, 1 regressions (listed), 2 usage or git errors.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from pagebench.errors import ConfigError

STATS = ("min", "median", "mean")
WORKTREE = "."  # --head . : the working tree as it is, uncommitted changes included


@dataclass(frozen=True)
class Change:
    name: str
    base_s: float | None
    head_s: float | None

    @property
    def ratio(self) -> float | None:
        if self.base_s and self.head_s is not None:
            return self.head_s / self.base_s
        return None

    def status(self, threshold: float) -> str:
        ratio = self.ratio
        if ratio is None:
            return "new" if self.base_s is None else "missing"
        if ratio > 1 + threshold:
            return "slower"
        if ratio < 1 / (1 + threshold):
            return "faster"
        return "same"

    def to_dict(self, threshold: float) -> dict:
        return {**asdict(self), "ratio": self.ratio, "status": self.status(threshold)}


# ---- comparing results --------------------------------------------------------------------
def timings(doc: dict, stat: str = "median") -> dict[str, float]:
    """Benchmark name -> seconds, from one pytest-benchmark JSON document."""
    if stat not in STATS:
        raise ConfigError(f"stat: expected one of {STATS}, got {stat!r}")
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise ConfigError("results: not a pytest-benchmark JSON document (no 'benchmarks' list)")
    out = {}
    for bench in doc["benchmarks"]:
        stats = bench.get("stats") or {}
        if stat in stats:
            out[bench.get("fullname") or bench["name"]] = float(stats[stat])
    return out


def combine(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per benchmark, the median of its times over several runs."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for name, seconds in run.items():
            values.setdefault(name, []).append(seconds)
    return {name: statistics.median(v) for name, v in values.items()}


def compare(base: dict[str, float], head: dict[str, float]) -> list[Change]:
    names = sorted(set(base) | set(head))
    return [Change(n, base.get(n), head.get(n)) for n in names]


def regressions(changes: list[Change], threshold: float) -> list[Change]:
    return [c for c in changes if c.status(threshold) == "slower"]


def format_table(changes: list[Change], threshold: float, base: str, head: str) -> str:
    width = max([len(c.name) for c in changes] + [9])
    lines = [f"{'benchmark':<{width}}  {base[:12]:>12}  {head[:12]:>12}  {'ratio':>6}  status",
             "-" * (width + 44)]
    for c in sorted(changes, key=lambda c: -(c.ratio or 0)):
        fmt = lambda s: f"{s * 1e3:10.3f}ms" if s is not None else f"{'-':>12}"  # noqa: E731
        ratio = f"{c.ratio:6.2f}" if c.ratio is not None else f"{'-':>6}"
        lines.append(f"{c.name:<{width}}  {fmt(c.base_s)}  {fmt(c.head_s)}  {ratio}  "
                     f"{c.status(threshold)}")
    return "\n".join(lines)


# ---- running the suite on a commit --------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                             check=True)
    except FileNotFoundError as e:
        raise ConfigError("git: not found on PATH") from e
    except subprocess.CalledProcessError as e:
        raise ConfigError(f"git {' '.join(args)}: {e.stderr.strip() or e}") from None
    return out.stdout.strip()


def resolve_rev(repo: Path, rev: str) -> str:
    """The full commit hash of ``rev`` (or ``.``, the working tree)."""
    if rev == WORKTREE:
        return WORKTREE
    if not rev or rev.startswith("-"):
        raise ConfigError(f"rev: not a revision: {rev!r}")
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ConfigError:
        raise ConfigError(f"rev: unknown revision {rev!r} in {repo}") from None


class Checkouts:
    """Temporary worktrees for commits, removed on exit."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.root = Path(tempfile.mkdtemp(prefix="pagebench-compare-"))
        self.paths: dict[str, Path] = {}

    def __enter__(self):
        return self

    def get(self, commit: str) -> Path:
        if commit == WORKTREE:
            return self.repo
        if commit not in self.paths:
            path = self.root / commit[:12]
            _git(self.repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
            self.paths[commit] = path
        return self.paths[commit]

    def __exit__(self, *exc):
        for path in self.paths.values():
            subprocess.run(["git", "-C", str(self.repo), "worktree", "remove", "--force",
                            str(path)], capture_output=True)
        subprocess.run(["git", "-C", str(self.repo), "worktree", "prune"], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def run_suite(package_root: Path, bench_dir: Path, out_json: Path, *, select: str | None,
              marks: str | None, max_time: float, python: str = sys.executable,
              log=None) -> dict:
    """Run the benchmark files in ``bench_dir`` with ``package_root`` first on the import path;
    returns the pytest-benchmark JSON document."""
    files = sorted(bench_dir.glob("test_bench_*.py"))
    if not files:
        raise ConfigError(f"bench-dir: no test_bench_*.py files in {bench_dir}")
    with tempfile.TemporaryDirectory(prefix="pagebench-bench-") as tmp:
        suite = Path(tmp) / "bench"
        suite.mkdir()
        for f in files:  # a copy outside any repo: no conftest or pytest config of either commit
            shutil.copy(f, suite / f.name)
        (Path(tmp) / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n    gpu: gpu\n")
        cmd = [python, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider",
               "--benchmark-enable", f"--benchmark-json={out_json}",
               f"--benchmark-max-time={max_time}", "--benchmark-min-rounds=5",
               "--benchmark-warmup=on", "--benchmark-warmup-iterations=1"]
        if select:
            cmd += ["-k", select]
        if marks:
            cmd += ["-m", marks]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(package_root)] +
                                            [p for p in [env.get("PYTHONPATH")] if p])
        proc = subprocess.run(cmd, cwd=package_root, env=env, capture_output=True, text=True)
        if log is not None:
            log.write(proc.stdout[-2000:] + proc.stderr[-2000:])
        if proc.returncode not in (0, 5) or not out_json.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise ConfigError(f"benchmarks failed on {package_root} (exit {proc.returncode}):\n"
                              + "\n".join(tail))
    return json.loads(out_json.read_text())


def _select_tests(changes: list[Change], select: str | None) -> str:
    """A pytest -k expression that selects the test functions of ``changes``."""
    names = sorted({c.name.split("::")[-1].split("[")[0] for c in changes})
    expr = " or ".join(names)
    return f"({select}) and ({expr})" if select else expr


def bench_compare(repo: Path, base: str, head: str, *, threshold: float = 0.10,
                  repeat: int = 2, confirm: int = 2, stat: str = "median",
                  bench_dir: str = "tests/benchmarks", select: str | None = None,
                  marks: str | None = "not slow", max_time: float = 0.5,
                  out_dir: Path | None = None, log=sys.stderr):
    """Run the suite on both commits; returns (changes, base commit, head commit)."""
    if not 0 < threshold < 10:
        raise ConfigError(f"threshold: expected a fraction such as 0.10, got {threshold!r}")
    for name, value, least in (("repeat", repeat, 1), ("confirm", confirm, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{name}: must be an integer >= {least}, got {value!r}")
    if stat not in STATS:
        raise ConfigError(f"stat: expected one of {STATS}, got {stat!r}")
    repo = Path(_git(Path(repo), "rev-parse", "--show-toplevel"))
    base_c, head_c = resolve_rev(repo, base), resolve_rev(repo, head)
    runs: dict[str, list[dict[str, float]]] = {base_c: [], head_c: []}
    out_dir = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="pagebench-results-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    with Checkouts(repo) as checkouts:
        suite_dir = checkouts.get(head_c) / bench_dir

        def run_both(tag: str, k: str | None) -> None:
            for label, commit in (("base", base_c), ("head", head_c)):
                print(f"bench-compare: {tag}, {label} {commit[:12]}", file=log)
                doc = run_suite(checkouts.get(commit), suite_dir,
                                out_dir / f"{label}-{tag.replace(' ', '-').replace('/', 'of')}.json",
                                select=k, marks=marks, max_time=max_time)
                runs[commit].append(timings(doc, stat))

        for i in range(repeat):
            run_both(f"run {i + 1}/{repeat}", select)
        changes = compare(combine(runs[base_c]), combine(runs[head_c]))
        suspects = regressions(changes, threshold)
        for i in range(confirm if suspects else 0):
            run_both(f"confirm {i + 1}/{confirm} ({len(suspects)} suspect)",
                     _select_tests(suspects, select))
        if suspects and confirm:
            changes = compare(combine(runs[base_c]), combine(runs[head_c]))
    return changes, base_c, head_c


# ---- command line -------------------------------------------------------------------------
def register(sub) -> None:
    p = sub.add_parser(
        "bench-compare", help="regression gate: benchmarks on two commits, fail if slower",
        description="Run the quick benchmark suite (tests/benchmarks) on two commits of this "
        "repository and exit 1 when any benchmark is more than --threshold slower on --head. "
        "With --base-json/--head-json, compare two existing pytest-benchmark JSON files instead.")
    p.add_argument("--base", help="base revision (e.g. main, HEAD~1)")
    p.add_argument("--head", default="HEAD", help="head revision, or '.' for the working tree "
                   "with uncommitted changes (default: HEAD)")
    p.add_argument("--threshold", type=float, default=0.10,
                   help="slowdown that fails, as a fraction (default: 0.10 = 10%%)")
    p.add_argument("--repeat", type=int, default=2,
                   help="alternating runs per commit, combined by their median (default: 2)")
    p.add_argument("--confirm", type=int, default=2,
                   help="extra alternating runs of benchmarks that look slower (default: 2)")
    p.add_argument("--stat", choices=STATS, default="median",
                   help="statistic of each run's rounds that is compared (default: median)")
    p.add_argument("--repo", default=".", help="repository (default: the current one)")
    p.add_argument("--bench-dir", default="tests/benchmarks",
                   help="benchmark files inside the head commit (default: tests/benchmarks)")
    p.add_argument("-k", dest="select", help="only benchmarks matching this pytest -k expression")
    p.add_argument("-m", dest="marks", default="not slow",
                   help="pytest -m marker expression (default: 'not slow')")
    p.add_argument("--max-time", type=float, default=0.5,
                   help="seconds per benchmark per run (pytest-benchmark --benchmark-max-time)")
    p.add_argument("--out-dir", help="keep the raw pytest-benchmark JSON of every run here")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--base-json", help="compare this pytest-benchmark JSON (base) ...")
    p.add_argument("--head-json", help="... with this one (head); runs nothing")
    p.set_defaults(func=_main)


def _load(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"results: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"results: {path} is not JSON ({e})") from None


def _main(args) -> int:
    if not 0 < args.threshold < 10:
        raise ConfigError(f"threshold: expected a fraction such as 0.10, got {args.threshold!r}")
    if args.base_json or args.head_json:
        if not (args.base_json and args.head_json):
            raise ConfigError("base-json: give both --base-json and --head-json")
        changes = compare(timings(_load(args.base_json), args.stat),
                          timings(_load(args.head_json), args.stat))
        base_label, head_label = Path(args.base_json).stem, Path(args.head_json).stem
    else:
        if not args.base:
            raise ConfigError("base: give --base REV (or --base-json/--head-json)")
        changes, base_label, head_label = bench_compare(
            Path(args.repo), args.base, args.head, threshold=args.threshold, repeat=args.repeat,
            confirm=args.confirm, stat=args.stat, bench_dir=args.bench_dir, select=args.select, marks=args.marks,
            max_time=args.max_time, out_dir=args.out_dir)
    slower = regressions(changes, args.threshold)
    if args.json:
        print(json.dumps({"base": base_label, "head": head_label, "threshold": args.threshold,
                          "stat": args.stat,
                          "changes": [c.to_dict(args.threshold) for c in changes],
                          "regressions": [c.name for c in slower]}, indent=2))
    else:
        print(format_table(changes, args.threshold, base_label, head_label))
        if slower:
            print(f"\n{len(slower)} benchmark(s) more than {args.threshold:.0%} slower on "
                  f"{head_label[:12]} than on {base_label[:12]}:")
            for c in slower:
                print(f"  {c.name}: {c.ratio:.2f}x")
        else:
            print(f"\nno benchmark more than {args.threshold:.0%} slower")
    if not changes:
        raise ConfigError("results: no benchmark ran on both commits")
    return 1 if slower else 0
