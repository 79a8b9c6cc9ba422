"""`pagebench` command line. Each subsystem registers its own subcommands.

Errors a user can fix print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pagebench.errors import PagebenchError

# module -> its `register(subparsers)` adds one or more subcommands
COMMAND_MODULES = (
    "pagebench.sim.cli",
    "pagebench.kernels.cli",
    "pagebench.engine.cli",
    "pagebench.report.cli",
    "pagebench.benchcompare",
)


def int_list(text: str) -> list[int]:
    """argparse type for options such as ``--block-sizes 1,8,16``: positive integers."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}")
    return values


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``pagebench simulate: error: ...``), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    import pagebench

    parser = _Parser(
        prog="pagebench", description="Benchmarks and regression harness for paged KV-cache "
        "attention: memory simulation, capacity planning, kernels, engine, reports.")
    parser.add_argument("--version", action="version", version=f"pagebench {pagebench.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # subsystem not present in this build
                continue
            raise
        module.register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (PagebenchError, ValueError, FileNotFoundError) as e:
        print(f"pagebench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pagebench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
