"""`pagebench` command line: one module per subsystem registers its subcommands.

Building the parser imports only the standard library (``--help`` answers at once); a command
imports torch, pandas or matplotlib when it runs. Errors a user can fix, and torch failing to
allocate memory (a run too large for this machine or GPU), print one line on stderr and exit
with status 2; output to a closed pipe (``pagebench ... | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from pagebench.errors import PagebenchError

# module -> its `register(subparsers)` adds one or more subcommands
COMMAND_MODULES = (
    "pagebench.cli.sim",
    "pagebench.cli.kernels",
    "pagebench.cli.engine",
    "pagebench.cli.accuracy",
    "pagebench.cli.parallel",
    "pagebench.cli.report",
    "pagebench.cli.recommend",
    "pagebench.cli.benchcompare",
    "pagebench.cli.serve",
    "pagebench.cli.ab",
)
# what a user can fix: one line and exit status 2 (anything else is a bug: a traceback); torch
# failing to allocate becomes a MemoryError (options.allocating): a run too large for here
USER_ERRORS = (PagebenchError, ValueError, OSError, OverflowError, MemoryError)


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (``pagebench simulate: error: ...``), exit status 2. A
    subcommand that prints tables sets ``table_columns`` (``(key, header, decimals)``) and its
    ``--help`` ends with what each column holds (looked up only when help is asked for)."""

    table_columns: tuple = ()

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        text = super().format_help()
        if not self.table_columns:
            return text
        from pagebench.cli.options import column_legend

        legend = column_legend(list(self.table_columns))
        return text + "\n" + legend.replace("columns:", "columns of its tables:", 1) + "\n"


def build_parser() -> argparse.ArgumentParser:
    import pagebench

    parser = Parser(
        prog="pagebench", description="Benchmarks and regression harness for paged KV-cache "
        "attention: memory simulation, capacity planning, kernels, engine, reports.")
    parser.add_argument("--version", action="version", version=f"pagebench {pagebench.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def error_line(error: BaseException, flags: dict[str, str] | None = None) -> str:
    """One line for a user error; an OSError names its file. A library message that starts
    with a parameter's name (``step_ms: ...``) starts with its option instead (``--step-ms:
    ...``) when ``flags`` (identifier -> option, :func:`option_flags`) has it."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror}"
    if isinstance(error, MemoryError):
        return f"not enough memory{': ' + str(error) if str(error) else ''}"
    text = " ".join((str(error).strip() or type(error).__name__).split())  # one line
    name, sep, rest = text.partition(": ")
    if sep and flags and name in flags:
        text = f"{flags[name]}: {rest}"
    return text


def option_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """identifier -> option of ``parser``'s long options: each option's dest and each of its
    names as an identifier (``max_model_len`` -> ``--max-model-len``)."""
    flags: dict[str, str] = {}
    for action in parser._actions:
        names = [s for s in action.option_strings if s.startswith("--")]
        for s in names:
            flags.setdefault(s[2:].replace("-", "_"), s)
        if names:
            flags.setdefault(action.dest, names[0])
    return flags


def subcommand_parser(parser: argparse.ArgumentParser, command: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None


def main(argv=None) -> int:
    from pagebench.triton_setup import interpret_without_gpu

    interpret_without_gpu()  # before any command builds a model (transformers imports Triton)
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # the reader (e.g. `head`) has what it wanted: stop quietly, and keep Python's own
        # flush at exit from failing again on the same pipe
        if sys.stdout is sys.__stdout__:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        sub = subcommand_parser(parser, getattr(args, "command", None) or "")
        if extra:  # named by the subcommand (`pagebench claims: error: ...`), not pagebench
            (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from pagebench.cli.options import allocating, check_outputs_are_not_inputs

    try:
        check_outputs_are_not_inputs(args)
        # torch's failures to allocate become MemoryError; any other RuntimeError is a bug
        with allocating():
            return int(args.func(args) or 0)
    except BrokenPipeError:
        raise
    except USER_ERRORS as e:
        flags = option_flags(sub) if sub is not None else None
        print(f"pagebench {args.command}: error: {error_line(e, flags)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pagebench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
