"""Every shell and Python example of the README and of every ``docs/*.md`` page runs (an
example that stops working, or moves to another page, fails here).

The fenced ``bash`` and ``python`` blocks of each page are extracted; a page added to ``docs/``
is picked up without a change here. ``pagebench`` commands run in-process
from a scratch directory that sees the repository's ``examples/`` and ``reports/data/``, with the
quick arguments of QUICK appended (a later option overrides an earlier one), and a
``my_runs/`` directory of results of the reader's own; ``make`` commands
are checked with ``make -n`` (what they would run, not running it). NOT_RUN lists, with the
reason, the few commands that are not run here; a command in neither fails the test, and so
does a ``--device cuda`` command on a machine without CUDA only by skipping with that reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from pagebench.cli import main

REPO = Path(__file__).resolve().parents[1]
# every page whose examples run: the front page and every docs/*.md
PAGES = {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
         for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}

# command prefix -> arguments appended so that the example runs in seconds on a CPU
QUICK = {
    "pagebench simulate --dynamic --trace": [],
    "pagebench simulate --dynamic": ["--num-requests", "300"],
    "pagebench bench --prefill": ["--repeat", "1"],
    "pagebench bench --shape": ["--contexts", "64", "--repeat", "1"],
    "pagebench bench": ["--repeat", "1"],
    "pagebench bench-compare": [],  # the README's runs nothing (--base-json/--head-json)
    "pagebench engine-bench throughput": ["--batch-sizes", "1,2", "--block-sizes", "8",
                                          "--prompt-len", "8", "--max-tokens", "2"],
    "pagebench engine-bench compare": ["--batch-sizes", "2", "--prompt-len", "8",
                                       "--max-tokens", "2"],
    "pagebench engine-bench cow": ["--prompt-len", "16", "--max-tokens", "2"],
    "pagebench engine-bench trace": ["--num-requests", "4", "--max-output-len", "4"],
    "pagebench engine-bench equality": ["--num-requests", "2", "--prompt-len", "1-8",
                                        "--max-tokens", "2"],
    "pagebench engine-bench breakdown": ["--prompt-len", "4-8", "--max-tokens", "3"],
    "pagebench engine-bench equal-memory": ["--num-requests", "4", "--prompt-len", "4-8",
                                            "--max-tokens", "2"],
    "pagebench engine-bench throughput --modes": ["--batch-sizes", "1", "--block-sizes", "8",
                                                  "--prompt-len", "8", "--max-tokens", "2"],
    "pagebench engine-bench": ["--max-tokens", "2"],
    "pagebench report": ["--quick", "--no-progress"],
    "pagebench recommend": [],  # reads committed data and simulates: about a second
}
# command -> why the test does not run it
NOT_RUN = {
    ". .venv/bin/activate": "changes the calling shell; `make setup` (checked) creates it",
    "pagebench bench-compare --base main --head HEAD":
        "times the suite on two commits (minutes); tests/test_benchcompare.py runs the gate end "
        "to end on a small repository",
    "pagebench bench-compare --base HEAD --head .": "as above",
    ".venv/bin/python scripts/asv_wheelhouse.py --dest .asv/wheelhouse":
        "downloads wheels; tests/test_asv_suites.py checks the suites",
    'export PIP_FIND_LINKS="$PIP_FIND_LINKS $PWD/.asv/wheelhouse"': "changes the calling shell",
    "asv machine --yes --machine my-box": "asv: builds environments, minutes (make asv-quick)",
    "asv run --quick -b '^(?!.*Cuda)' HEAD~3..HEAD": "asv, as above",
    "asv run -E existing --quick --set-commit-hash $(git rev-parse HEAD)": "asv, as above",
    "asv run -E existing --launch-method spawn -b Cuda --set-commit-hash $(git rev-parse HEAD)":
        "asv on a GPU",
    "asv publish && asv preview ; asv compare A B": "asv, as above; preview serves forever",
    "torchrun --standalone --nproc-per-node 2 -m pagebench bench --device cuda --out k.csv":
        "needs 2 GPUs",
    "torchrun --standalone --nproc-per-node 2 my_script.py": "needs 2 GPUs and a script",
    "torchrun --standalone --nproc-per-node 2 -m pagebench tp-bench equality":
        "two processes; tests/test_parallel.py runs tp-bench under torchrun",
    "torchrun --standalone --nproc-per-node 2 -m pagebench tp-bench throughput --out tp.csv":
        "as above",
    'pagebench tp-bench sweep-wall --bench-args "--device cpu --contexts 32 --batches 1,2"':
        "starts torchrun three times; tests/test_parallel.py runs sweep_wall under torchrun",
}
NEEDS_CUDA = ("--device cuda",)
# commands whose quick form still takes more than ~20 s on 2 CPU cores: the slow tier only
SLOW = ("pagebench report",  # the quick report replays the real traces: ~30 s
        "pagebench simulate --dynamic --trace mooncake-conv")  # a whole real trace: ~11 s
PASSED: set[tuple[str, ...]] = set()  # argv already run: example lines that become the same run
# text replaced in the pages' Python blocks before they run
PYTHON_QUICK = {"max_tokens=16": "max_tokens=4"}


def page_commands(text: str) -> list[str]:
    """The shell commands of one page's ``bash`` blocks, comments and continuations joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            command = re.split(r"\s+#\s", " " + line.strip(), maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(" ".join(command.split()))
    return commands


def shell_commands() -> list[tuple[str, str]]:
    """(page, command) for every page, in page order."""
    return [(page, c) for page, text in PAGES.items() for c in page_commands(text)]


def python_blocks() -> list[tuple[str, str]]:
    return [(page, block) for page, text in PAGES.items()
            for block in re.findall(r"```python\n(.*?)```", text, re.S)]


def with_prefix(prefix: str) -> list:
    return [pytest.param(c, id=f"{page}: {c}",
                         marks=([pytest.mark.slow] if c.startswith(SLOW) else [])
                         + ([pytest.mark.gpu] if any(f in c for f in NEEDS_CUDA) else []))
            for page, c in shell_commands() if c.startswith(prefix)]


def test_pages_include_the_readme_and_docs():
    assert "README.md" in PAGES and "docs/usage.md" in PAGES


def test_every_command_is_run_or_explained():
    commands = [c for _, c in shell_commands()]
    unexplained = [c for c in commands if not c.startswith(("pagebench ", "make "))
                   and c not in NOT_RUN]
    assert not unexplained
    stale = [c for c in NOT_RUN if c not in commands]
    assert not stale, "NOT_RUN names commands no page has any more"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory that sees the repository's examples and committed data."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "data").symlink_to(REPO / "reports" / "data")
    # `--results my_runs/`: a directory of the reader's own results (one run of theirs,
    # `engine-bench cow --out my_runs/engine_cow.csv`, stood for by a committed file's rows)
    (tmp_path / "my_runs").mkdir()
    shutil.copy(REPO / "reports" / "data" / "cpu" / "engine_cow.csv", tmp_path / "my_runs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", with_prefix("pagebench "))
def test_pagebench_command_runs(command, scratch):
    if any(flag in command for flag in NEEDS_CUDA):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    if command in NOT_RUN:
        pytest.skip(NOT_RUN[command])
    argv = shlex.split(command.replace("/tmp/", f"{scratch}/tmp/"))[1:]
    prefix = max((p for p in QUICK if command.startswith(p)), key=len, default=None)
    argv += QUICK.get(prefix, [])
    if argv[0] == "report" and "--out" not in argv:
        argv += ["--out", str(scratch / "site" / "index.html")]
    key = tuple(dict.fromkeys(a.replace(str(scratch), "") for a in argv))  # "--quick" twice
    if argv[0] == "report":  # where the page goes, or the options' order, make no other run
        key = tuple(sorted(a for i, a in enumerate(key) if "--out" not in key[i - 1:i]))
    if key in PASSED:
        return
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, f"{command}\n{err.getvalue()}"
    assert "adds nothing" not in err.getvalue(), f"{command} reads committed data twice"
    PASSED.add(key)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("command", with_prefix("make "))
def test_make_command_is_a_target(command):
    argv = shlex.split(command)
    proc = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, MAKEFLAGS=""))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("page", "code"), [
    pytest.param(page, code, id=f"{page}: python block {i}")
    for i, (page, code) in enumerate(python_blocks())])
def test_python_example_runs(page, code, scratch, capsys):
    for old, new in PYTHON_QUICK.items():
        code = code.replace(old, new)
    exec(compile(code, f"{page} python block", "exec"), {"__name__": "readme"})
