"""The command line for people: fast --help, help on every option, --json/--out on every command
that produces results, readable tables, progress only on a terminal."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pagebench.cli import build_parser, main, options

REPO = Path(__file__).resolve().parents[1]
RESULT_COMMANDS = ("simulate", "capacity", "bench", "engine-bench", "tp-bench", "bench-compare",
                   "serve-bench", "step-cost-fit", "kv-accuracy")
HEAVY = ("torch", "numpy", "pandas", "matplotlib", "transformers")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_help_imports_no_heavy_module():
    """``--help`` of every command answers without importing torch, numpy, pandas or
    matplotlib (each costs seconds); measured with `time`: about 0.15 s on 2 CPU cores."""
    code = ("import sys\nfrom pagebench.cli import main\n"
            f"for c in ([], *([n] for n in {tuple(subcommands())!r})):\n"
            "    assert main([*c, '--help']) == 0\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_every_option_has_help_text():
    for name, parser in subcommands().items():
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings or action.dest}"


@pytest.mark.parametrize("command", RESULT_COMMANDS)
def test_every_results_command_has_json_and_out(command):
    flags = {s for a in subcommands()[command]._actions for s in a.option_strings}
    assert {"--json", "--out"} <= flags


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_simulate_out_writes_csv_or_json_and_json_prints_json(tmp_path):
    base = ["simulate", "--num-seqs", "100", "--block-sizes", "16"]
    code, table, err = run(base + ["--out", str(tmp_path / "s.csv")])
    assert code == 0 and "allocator" in table and "wrote 4 rows" in err
    header = (tmp_path / "s.csv").read_text().splitlines()[0]
    assert header == "allocator,block_size,allocated_slots,utilisation,wasted_slots_per_seq"
    code, printed, _ = run(base + ["--json", "--out", str(tmp_path / "s.json")])
    assert json.loads(printed) == json.loads((tmp_path / "s.json").read_text())


def test_capacity_out(tmp_path):
    code, _, _ = run(["capacity", "--article", "--out", str(tmp_path / "c.csv")])
    rows = (tmp_path / "c.csv").read_text().splitlines()
    assert code == 0 and len(rows) == 2 and "max_concurrency_naive" in rows[0]


def test_engine_bench_prints_a_rounded_table_by_default(tmp_path):
    pytest.importorskip("transformers")
    argv = ["engine-bench", "throughput", "--batch-sizes", "2", "--block-sizes", "8",
            "--prompt-len", "4", "--max-tokens", "2", "--kernel", "torch"]
    code, out, err = run(argv + ["--out", str(tmp_path / "t.json")])
    assert code == 0, err
    header, rule, row, blank, legend, *meanings = out.splitlines()
    assert header.split()[:3] == ["block", "(tokens)", "batch"] and "tokens/s" in header
    assert (blank, legend) == ("", "columns:")  # then a line per column: what it holds
    assert [m.split()[0] for m in meanings][:2] == ["block", "batch"]
    assert any("generated tokens per second" in m for m in meanings)
    assert set(rule) <= {"-", " "} and "," not in row.split()[0]
    tokens_per_s = row.split()[-2]
    assert len(tokens_per_s.replace(",", "").split(".")[1]) == 1  # one decimal
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved[0]["batch"] == 2 and saved[0]["block_size"] == 8


def test_format_table_rounds_and_keeps_integers():
    rows = [{"bs": 16.0, "t": 17.5234, "name": "a"}, {"bs": float("nan"), "t": 1234.5, "name": "bb"}]
    text = options.format_table(rows, [("bs", "block (tokens)", 0), ("t", "time (us)", 1),
                                       ("name", "backend", 0)])
    lines = text.splitlines()
    assert lines[2].split() == ["16", "17.5", "a"] and lines[3].split() == ["-", "1,234.5", "bb"]


@pytest.mark.parametrize("text, message", [
    ("lots", "--kv-memory: bytes: cannot parse 'lots'"),
    ("0", "--kv-memory: must be positive, got '0'"),
    ("-1GB", "--kv-memory: bytes: must be a finite non-negative size")])
def test_check_bytes_names_the_option_it_refuses(text, message):
    assert options.check_bytes("--kv-memory", "2MiB") == 2 * 2**20
    with pytest.raises(ValueError, match=message):
        options.check_bytes("--kv-memory", text)


def test_progress_bar_only_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert type(options.progress(3, "x")).__name__ == "_NoProgress"
    monkeypatch.setattr(sys, "stderr", Terminal())
    with options.progress(3, "x") as bar:
        bar.update()
    assert "x" in sys.stderr.getvalue()


@pytest.mark.parametrize("command, tables", [
    ("bench", ("DECODE_TABLE", "PREFILL_TABLE", "FP8_TABLE", "TUNE_TABLE")),
    ("engine-bench", ("COMMON_TABLE",)), ("tp-bench", ())])
def test_help_explains_every_column_of_the_tables_a_command_prints(command, tables):
    """Each header of the command's tables has a legend line in its --help (the schemas' words,
    or the table's own where a key means something else there)."""
    from pagebench.cli import engine, kernels, parallel

    code, text, _ = run([command, "--help"])
    assert code == 0
    legend = text.split("columns of its tables:\n", 1)[1].splitlines()
    module = {"bench": kernels, "engine-bench": engine, "tp-bench": parallel}[command]
    columns = [c for name in tables for c in getattr(module, name)]
    columns += [c for t in getattr(module, "TABLES", {}).values() for c in t]
    described = {line[2:].split("  ")[0].strip() for line in legend if line.startswith("  ")}
    assert {c[1] for c in columns} <= described
