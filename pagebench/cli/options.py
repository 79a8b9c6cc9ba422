"""What every subcommand shares: bounded argument types, output paths checked before any work,
memory estimates checked before allocating, tables for people, JSON/CSV for programs, progress.

Standard library only at module level: the parser must build without importing torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import stat
import sys
import tempfile

from pagebench.atomic import atomic_write_text

# Counts and sizes on the command line fit in int32 (the kernels' index type) unless an option
# says otherwise; larger values are refused by argparse, before anything runs.
MAX_INT = 2**31 - 1
# A process may plan to use at most this share of the memory available when it starts.
MEMORY_SHARE = 0.8


def integer(least: int = 1, most: int = MAX_INT):
    """argparse type: an integer in ``least..most``."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(
                f"expected an integer in {least:,}..{most:,}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def number(least: float = 0.0, most: float = 1e12, *, inclusive: bool = False,
           below: bool = False):
    """argparse type: a finite float above ``least`` (or equal, with ``inclusive``), at most
    ``most`` (below it, with ``below``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = value >= least if inclusive else value > least
        high_ok = value < most if below else value <= most
        if not (math.isfinite(value) and low_ok and high_ok):
            side, top = (">=" if inclusive else ">"), ("<" if below else "<=")
            raise argparse.ArgumentTypeError(
                f"expected a number {side} {least:g} and {top} {most:g}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def int_list(text: str) -> list[int]:
    """argparse type for options such as ``--block-sizes 1,8,16``: distinct integers in
    1..MAX_INT (a value given twice would only repeat its rows)."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or max(values) > MAX_INT:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers in 1..{MAX_INT:,}, got {text!r}")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(str, repeated))} given twice in {text!r}: each value once")
    return values


def name_list(text: str) -> list[str]:
    """argparse type: comma-separated names."""
    values = [x.strip() for x in str(text).split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return values


def torch_device(requested: str | None) -> str:
    """``--device``: the one asked for (``cuda`` only where CUDA is present), else cuda if
    present, else cpu."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but no CUDA device is available")
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def experiment_options(args, command: str, options: dict[str, dict]) -> dict:
    """The options ``args.experiment`` reads (``options``: experiment -> {option: default}),
    defaults filled in; ValueError naming any option given that the experiment would ignore."""
    uses = options[args.experiment]
    every = {name for opts in options.values() for name in opts}
    ignored = sorted(n for n in every if getattr(args, n) is not None and n not in uses)
    if ignored:
        flags = ", ".join("--" + n.replace("_", "-") for n in ignored)
        used = ", ".join("--" + n.replace("_", "-") for n in sorted(uses)) or "none"
        raise ValueError(f"{flags}: not used by {command} {args.experiment} (it takes {used})")
    return {n: default if getattr(args, n) is None else getattr(args, n)
            for n, default in uses.items()}


# ---- files and memory, checked before the work starts --------------------------------------
def check_output_file(option: str, path: str | None) -> None:
    """``path`` can be created as a file: a name (not empty, not ``-``: results go to stdout
    with ``--json``), not a directory, and its nearest existing ancestor is a writable
    directory (so a sweep of minutes does not fail at its last line)."""
    if path is None:
        return
    check_output_name(option, path)
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise ValueError(f"{option}: {path} is a directory; give a file name")
    check_can_create(option, path, os.path.dirname(os.path.abspath(path)))


def check_output_dir(option: str, path: str | None) -> None:
    """``path`` is, or can be made, a directory that takes new files (checked by making an
    unnamed one there), so a run of minutes does not fail at its first write."""
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{option}: {path} exists and is not a directory")
    check_can_create(option, path, os.path.abspath(path))


def check_can_create(option: str, path: str, parent: str) -> None:
    """ValueError naming ``option`` and ``path`` unless the nearest existing ancestor of
    directory ``parent`` (itself included) is a writable directory that takes files."""
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{option}: cannot create {path}: {parent} is a file")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{option}: cannot create {path}: {parent} is not writable")
    try:  # an unnamed file, gone when closed: /proc and read-only mounts refuse it
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise ValueError(f"{option}: cannot create {path}: {parent} takes no files "
                         f"({e.strerror or e})") from None


def check_output_name(option: str, path: str) -> None:
    """``path`` names a file: not empty, not ``-`` (which would create a file named ``-``;
    ``--json`` is what prints results to stdout), and, if it exists, a regular file or a
    directory (which the caller refuses or writes into). Results are written by replacing the
    file (:func:`pagebench.atomic.atomic_write_text`), so a symbolic link, FIFO, device or
    socket there would become a regular file (as root, ``--out /dev/null`` would replace the
    machine's ``/dev/null``); a stream written in place would follow the link or block on the
    FIFO."""
    if not path.strip():
        raise ValueError(f"{option}: empty file name; give a file")
    if path == "-":
        raise ValueError(f"{option}: '-' is not stdout here (it would create a file named "
                         "'-'); use --json to print results, or give a file")
    kind = special_file_kind(path)
    if kind is not None:
        raise ValueError(f"{option}: {path} is {kind}, not a regular file; writing would "
                         "replace it with one: give the path of a regular file")


def special_file_kind(path: str) -> str | None:
    """What ``path`` is when it exists as neither a regular file nor a directory (itself,
    not what a link points to): "a symbolic link", "a FIFO", "a device", "a socket"; else
    None."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):  # absent (or a name the system refuses: reported later)
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


OUTPUT_OPTIONS = ("out", "timeline", "csv", "profile_out", "rows_out", "html")  # the files written


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_outputs_are_not_inputs(args: argparse.Namespace) -> None:
    """Before any work, every output option names a file (:func:`check_output_name`), no two
    name the same file (``simulate --timeline x --out x`` would overwrite the timeline with
    the summary), and none names a file that another argument reads (``simulate --trace t.csv
    --out t.csv`` would replace the trace with its results; a folder argument reads the
    ``config.json`` in it, as ``--model DIR`` does): a ValueError naming both."""
    inputs = {}
    for name, value in vars(args).items():
        if name in OUTPUT_OPTIONS:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, str) and os.path.isdir(v):  # a model folder: its config is read
                v = os.path.join(v, "config.json")
            if isinstance(v, str) and os.path.isfile(v):
                inputs.setdefault(os.path.realpath(v), name)
    outputs = {}
    for name in OUTPUT_OPTIONS:
        path = getattr(args, name, None)
        if not isinstance(path, str):
            continue
        check_output_name(_flag(name), path)
        real = os.path.realpath(path)
        if real in inputs:
            raise ValueError(f"{_flag(name)}: {path} is also the input {_flag(inputs[real])}; "
                             "writing there would replace it: give another file")
        if real in outputs:
            raise ValueError(f"{_flag(outputs[real])}, {_flag(name)}: both name {path}; the "
                             "second would overwrite the first: give each its own file")
        outputs[real] = name


def check_input_dir(option: str, path: str | None) -> None:
    if path is not None and not os.path.isdir(path):
        raise ValueError(f"{option}: {path} is not a directory"
                         if os.path.exists(path) else f"{option}: {path} not found")


def available_memory_bytes() -> int:
    """Memory this process may take now (Linux MemAvailable; else physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**63


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_bytes(option: str, text: str) -> int:
    """A memory size given as ``option`` (``16GiB``, ``800MB``, ``1e9``): its bytes, at least 1;
    ValueError naming ``option`` otherwise."""
    from pagebench.config import parse_bytes

    try:
        size = parse_bytes(text)
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None
    if size < 1:
        raise ValueError(f"{option}: must be positive, got {text!r}")
    return size


def check_memory(option: str, need_bytes: float, what: str, available: int | None = None,
                 where: str = "this machine") -> None:
    """Refuse, before allocating, work whose estimated memory exceeds what is available."""
    available = available_memory_bytes() if available is None else available
    if need_bytes > MEMORY_SHARE * available:
        raise ValueError(f"{option}: {what} needs about {format_bytes(need_bytes)}; "
                         f"{where} has {format_bytes(available)} available")


def check_device_memory(option: str, need_bytes: float, what: str, device) -> None:
    """:func:`check_memory` against what ``device`` (a torch device or its name) has free: the
    GPU's free memory on CUDA, else this machine's available memory."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        check_memory(option, need_bytes, what, torch.cuda.mem_get_info(device)[0], "the GPU")
    else:
        check_memory(option, need_bytes, what)


# what torch says when an allocation fails: the CPU allocator's RuntimeError ("can't allocate
# memory: you tried to allocate N bytes"), CUDA's torch.OutOfMemoryError ("Tried to allocate
# 2.00 GiB")
_CPU_ALLOC_FAILED = "can't allocate memory"
_TRIED_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
_TRIED_SIZE = re.compile(r"tried to allocate ([\d.]+ ?[KMGTP]i?B)", re.IGNORECASE)


def allocation_failure(error: BaseException, what: str | None = None) -> MemoryError | None:
    """``error`` as a MemoryError naming ``what`` (else "a tensor") and the size that did not
    fit, when it is torch's failure to allocate (``torch.OutOfMemoryError``, or a CPU
    ``RuntimeError`` saying it can't allocate memory); None for any other error. Looks torch up
    only if it is already imported (the parser builds without it)."""
    if not isinstance(error, RuntimeError):
        return None
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    text = str(error)
    on_gpu = oom is not None and isinstance(error, oom)
    if not (on_gpu or _CPU_ALLOC_FAILED in text):
        return None
    size = _TRIED_BYTES.search(text)
    if size:
        size = format_bytes(int(size.group(1)))
    else:
        size = _TRIED_SIZE.search(text)
        size = size.group(1) if size else None
    where = "the GPU" if on_gpu else "this machine"
    tried = f" (an allocation of {size})" if size else ""
    return MemoryError(f"{what or 'a tensor'} does not fit in the memory of {where}{tried}; "
                       "make the run smaller")


@contextlib.contextmanager
def allocating(what: str | None = None):
    """Inside, torch's failure to allocate becomes a MemoryError naming ``what`` (e.g. "the KV
    pool of --batch-sizes 64"; else "a tensor"), which the command line prints as one line,
    exit status 2."""
    try:
        yield
    except RuntimeError as e:
        failure = allocation_failure(e, what)
        if failure is None:
            raise
        raise failure from None


# ---- output --------------------------------------------------------------------------------
def add_output_options(p, what: str = "results") -> None:
    """``--json`` and ``--out``, the same on every subcommand that produces results."""
    p.add_argument("--json", action="store_true",
                   help=f"print the {what} as JSON instead of a table")
    p.add_argument("--out", metavar="FILE", default=None,
                   help=f"also write the {what} to FILE: JSON if it ends in .json, else CSV "
                   "(tidy rows, full precision)")


def to_jsonable(value):
    """Numbers a JSON reader understands: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return to_jsonable(value.item())
    return value


def dumps(doc) -> str:
    return json.dumps(to_jsonable(doc), indent=2, allow_nan=False, default=str)


def write_results(path: str | None, records: list[dict], doc=None) -> None:
    """Write ``records`` (tidy rows) to ``path``: JSON (``doc`` when given, else the rows) if it
    ends in .json, else CSV with a header."""
    if path is None:
        return
    if path.endswith(".json"):
        text = dumps(records if doc is None else doc) + "\n"
    else:
        import csv
        import io

        columns = list(dict.fromkeys(k for r in records for k in r))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        text = buf.getvalue()
    try:
        atomic_write_text(path, text)
    except OSError as e:  # it names its temporary file: name the one asked for
        raise ValueError(f"cannot write {path}: {e.strerror or e}") from None
    print(f"wrote {len(records)} rows to {path}", file=sys.stderr)


def format_value(value, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and digits == 0:
            return f"{int(value):,}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# what the CLI tables show beyond the dataset schemas' columns (their legend's words)
TABLE_MEANINGS = {
    "allreduce_ms_per_step": "time in all-reduce per decode step, milliseconds",
    "allreduce_share": "all-reduce time / step time",
    "isolated_allreduce_share": "one all-reduce timed alone x all-reduces per step / step time",
    "bytes_per_block_per_gpu": "KV bytes one block costs each GPU",
    "check": "what the row checks", "chosen": "the launch the tuner keeps for this point",
    "compiled_layers": "decoder layers run through torch.compile",
    "completions": "completions per request (n)",
    "decode_step_wall_ms": "wall time of one decode step, milliseconds",
    "gpu_busy_ms": "time the GPU ran kernels during one step, milliseconds",
    "graph_replay_ms": "time of one CUDA-graph replay, milliseconds",
    "host_ms": "host (Python) time of one step, milliseconds",
    "engine_num_preemptions": "preemptions in the engine's replay",
    "sim_num_preemptions": "preemptions in the simulator's replay of the same requests",
    "engine_peak_blocks": "most KV blocks the engine held at once",
    "engine_prefix_cache_hit_rate": "prompt tokens served from the engine's prefix cache / "
    "prompt tokens", "sim_prefix_cache_hit_rate": "the same in the simulator",
    "lazy_rescale": "the prefill kernel rescales its accumulator only when the max grows",
    "one_loop": "the prefill kernel walks cached and new tokens in one loop",
    "table_ahead": "block-table ids loaded ahead of the walk",
    "tile_n": "tokens per tile of the kernel's walk", "num_warps": "warps per program",
    "num_stages": "software pipelining stages", "maxnreg": "register cap per thread",
    "num_splits": "programs one sequence's context is split over",
    "outputs_equal_engine": "the peer's greedy tokens equal the engine's",
    "points": "sweep points measured",
    "startup_s": "seconds before the first point (processes, compilation)",
    "pool_fraction": "KV pool size / the blocks the requests need at once",
    "prefix_caching": "prefix caching on", "prompt_len": "prompt tokens per request",
    "ranks_agree": "every rank produced the same tokens",
    "step_ms": "one decode step, milliseconds",
    "token_agreement": "share of generated tokens equal to the reference run's",
}


def column_meanings() -> dict[str, str]:
    """Column -> what it holds: :data:`TABLE_MEANINGS`, then the dataset schemas
    (:mod:`pagebench.results.datasets`, first declaration wins): a CLI table's legend."""
    from pagebench.results.datasets import DATASETS, DERIVED

    meanings: dict[str, str] = dict(TABLE_MEANINGS)
    for schema in [*DATASETS.values(), *DERIVED.values()]:
        for column in schema.columns:
            meanings.setdefault(column.name, column.meaning)
    return meanings


def every_column(*tables) -> tuple:
    """The columns of ``tables`` (lists of ``(key, header, decimals)``), each header once, in
    order: a command's ``table_columns`` for its ``--help``."""
    seen: dict[str, tuple] = {}
    for table in tables:
        for column in table:
            seen.setdefault(column[1], column)
    return tuple(seen.values())


def column_legend(columns: list[tuple[str, str, int]]) -> str:
    """``columns:`` and a line per column of a :func:`format_table` table: its header and what
    it holds (the schemas' words, :func:`column_meanings`); a column no schema describes is
    left out."""
    meanings = column_meanings()
    known = [(c[1], c[3] if len(c) > 3 else meanings[c[0]]) for c in columns
             if len(c) > 3 or c[0] in meanings]
    width = max((len(h) for h, _ in known), default=0)
    return "\n".join(["columns:"] + [f"  {h:<{width}}  {m}" for h, m in known])


def format_table(records: list[dict], columns: list[tuple[str, str, int]], *,
                 legend: bool = False) -> str:
    """A table for people: ``columns`` lists (key, header with its unit, decimals[, meaning
    where the key alone does not say it]); numbers
    right-aligned with thousands separators, integers as integers, missing values as ``-``;
    with ``legend``, what each column holds below it (:func:`column_legend`)."""
    cells = [[format_value(r.get(c[0]), c[2]) for c in columns] for r in records]
    headers = [c[1] for c in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r.get(c[0])) for r in records) for c in columns]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    table = "\n".join([line(headers), line(["-" * w for w in widths])] + [line(c) for c in cells])
    return table + ("\n\n" + column_legend(columns) if legend else "")


def _is_number(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def progress(total: int, desc: str):
    """A tqdm bar on stderr when it is a terminal; otherwise an object whose ``update`` does
    nothing (logs and pipes stay clean)."""
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
        except ImportError:
            pass
    return _NoProgress()


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
