"""Architecture rules, checked by parsing the source with `ast` (nothing is imported or executed).

1. No import cycle among the modules of `pagebench`. Only module-level imports count (those
   outside any function or class body, `if TYPE_CHECKING:` blocks included): an import inside a
   function runs when it is called, after every module has loaded, so it cannot deadlock the
   import and is the sanctioned way to break a cycle (with a comment saying why).
2. No `_private` name is imported from another module, anywhere in pagebench/, benchmarks/,
   scripts/, tests/ and property_tests/ (imports at any depth, `from m import _x` and `m._x`
   attribute use after `import m` / `from pkg import m` / `m = optional("m")` / `require("m")`
   alike; the last two are benchmarks/common.py's importers). One exception: a test file
   `tests/**/test_X.py` or `property_tests/test_X.py` may use private names of any module whose
   file is `X.py` or that lies in a package directory `X/` (the module or package it tests).
   Dunder names are not private.
3. The report imports no subsystem that measures (sim, engine, kernels, measure) and not the
   analysis: it renders an analysed `Results`; the analysis computes from a `Results` and
   imports neither the report nor a subsystem that measures; `results` imports only `errors`
   (imports inside functions included).
4. The measured systems (`kernels`, `engine`, `sim`) import nothing from `results` or the
   measuring package `measure` (timing included), imports inside functions included: the
   measuring code times them and names their rows as datasets.
5. No import cycle between packages, imports inside functions included (rule 1 allows such an
   import to break a cycle between modules, never between packages).
6. The engine's step path (`engine/engine.py`, `scheduler.py`, `model_runner.py`,
   `decode_graphs.py`, `parallel.py`) does no block-boundary arithmetic: no `//` or `%` by a
   block size and no `ceil_div` call; blocks for n tokens and a token's cache slot come from
   `engine/block_manager.py`, the one owner of a sequence's KV state.

Run `python tests/test_architecture.py` to print the import graph of `pagebench` (by package,
then by module); docs/architecture.md shows that output.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pagebench"
DYNAMIC_IMPORTERS = ("optional", "require")  # benchmarks/common.py: import a module by name
CHECKED_DIRS = ("pagebench", "benchmarks", "scripts", "tests", "property_tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_files(dirs=None) -> list[Path]:
    return sorted(p for d in (dirs or CHECKED_DIRS) for p in (ROOT / d).rglob("*.py"))


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (resolves `from . import x`, `from ..a import b`)."""
    if node.level == 0:
        return node.module or ""
    base = module_name(path).split(".")
    if not _is_package(path):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known_modules() -> set[str]:
    return {module_name(p) for p in python_files()}


def imports(path: Path, top_level_only: bool):
    """Yield (node, imported module, imported name or None, local name or None) per import.

    `from pkg import sub` where `pkg.sub` is a module yields (pkg.sub, None, local). The local
    name is None for `import a.b` without `as` (it binds `a`, whose attributes are not followed)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    known = _known_modules()
    if top_level_only:
        nodes = list(_module_level(tree.body))
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or (None if "." in alias.name else alias.name)
                yield node, alias.name, None, local
        else:
            module = _absolute(path, node)
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    yield node, f"{module}.{alias.name}", None, alias.asname or alias.name
                else:
                    yield node, module, alias.name, None


def _module_level(body):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                          *[h.body for h in getattr(node, "handlers", [])]):
                yield from _module_level(block)


def import_graph(top_level_only: bool = True) -> dict[str, set[str]]:
    """Imports among pagebench modules (module-level ones unless told): module -> imported."""
    known = _known_modules()
    graph: dict[str, set[str]] = {}
    for path in python_files((PACKAGE,)):
        src = module_name(path)
        targets = graph.setdefault(src, set())
        for _, module, _, _ in imports(path, top_level_only):
            if module.startswith(PACKAGE) and module in known and module != src:
                targets.add(module)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _tested_module_allowed(path: Path, module: str) -> bool:
    """tests/**/test_X.py may use the privates of a module `X.py` or of one in a package `X/`."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] not in ("tests", "property_tests") or not path.stem.startswith("test_"):
        return False
    return path.stem[len("test_"):] in module.split(".")[1:]


def private_imports() -> list[str]:
    known = _known_modules()
    violations = []
    for path in python_files():
        src = module_name(path)
        aliases: dict[str, str] = {}  # local name -> checked module it refers to
        for node, module, name, local in imports(path, top_level_only=False):
            if module not in known:
                continue
            if name is not None and _is_private(name) and module != src:
                if not _tested_module_allowed(path, module):
                    violations.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}.{name}")
            if local is not None:
                aliases[local] = module
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)
                    and node.value.func.id in DYNAMIC_IMPORTERS and node.value.args
                    and isinstance(node.value.args[0], ast.Constant)
                    and node.value.args[0].value in known):
                aliases[node.targets[0].id] = node.value.args[0].value
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and _is_private(node.attr)):
                module = aliases[node.value.id]
                if module != src and not _tested_module_allowed(path, module):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    violations.append(f"{where}: {module}.{node.attr}")
    return sorted(set(violations))


def test_no_import_cycle_inside_pagebench():
    assert find_cycles(import_graph()) == []


def test_no_private_name_imported_across_modules():
    assert private_imports() == []


def test_checker_sees_relative_and_attribute_imports(tmp_path, monkeypatch):
    """The checker itself: a relative private import and a `module._x` use are both found."""
    pkg = tmp_path / "pagebench"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\nfrom .b import _hidden\n")
    (pkg / "sub" / "b.py").write_text("from pagebench.sub import a\n_hidden = 1\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_b.py").write_text("from pagebench.sub import b\nb._hidden\n")
    (tests / "test_c.py").write_text("from pagebench.sub import b\nb._hidden\n")
    (tests / "test_d.py").write_text("m = optional('pagebench.sub.b')\nm._hidden\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "CHECKED_DIRS", ("pagebench", "tests"))
    assert find_cycles(import_graph()) == [["pagebench.sub.a", "pagebench.sub.b"]]
    assert private_imports() == ["pagebench/sub/a.py:2: pagebench.sub.b._hidden",
                                 "tests/test_c.py:2: pagebench.sub.b._hidden",
                                 "tests/test_d.py:2: pagebench.sub.b._hidden"]


# what each layer may import, imports inside functions included: the analysis computes derived
# tables and verdicts from a Results, the report renders them (measuring is pagebench.suite's,
# through sim, engine and kernels); results gathers and checks data and imports no subsystem
# (steps that measure are passed in)
LAYERS = {"pagebench.report": {"pagebench.results", "pagebench.atomic", "pagebench.config"},
          "pagebench.analysis": {"pagebench.results", "pagebench.config", "pagebench.errors"},
          "pagebench.results": {"pagebench.errors"}}


def test_analysis_computes_the_report_renders_and_results_gather_without_measuring():
    graph = package_graph(import_graph(top_level_only=False))
    assert {layer: graph[layer] - allowed for layer, allowed in LAYERS.items()} == \
        {layer: set() for layer in LAYERS}


# the systems measured: what they may not import, imports inside functions included (the
# measuring package times and records them, and names their rows as datasets)
MEASURED = ("pagebench.kernels", "pagebench.engine", "pagebench.sim")
MEASURING = {"pagebench.results", "pagebench.measure"}  # timing lives in pagebench.measure


def test_the_measured_systems_import_neither_results_nor_the_measuring_package():
    """kernels, engine and sim are measured by pagebench.measure, never the other way round."""
    graph = package_graph(import_graph(top_level_only=False))
    assert {layer: graph.get(layer, set()) & MEASURING for layer in MEASURED} == \
        {layer: set() for layer in MEASURED}


def test_no_import_cycle_between_packages_counting_imports_inside_functions():
    """A function-level import breaks a module cycle at load time, but between packages (say
    kernels -> engine -> kernels) it still ties two layers together: none is allowed."""
    assert find_cycles(package_graph(import_graph(top_level_only=False))) == []


def test_layering_checkers_see_imports_inside_functions(tmp_path, monkeypatch):
    """The checkers themselves: an import in a function body is an edge of the package graph,
    and two packages importing each other that way are a cycle."""
    pkg = tmp_path / "pagebench"
    for sub in ("kernels", "engine", "measure"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "a.py").write_text("def f():\n    from pagebench.engine import b\n")
    (pkg / "engine" / "b.py").write_text("from pagebench.kernels import a\n"
                                          "def g():\n    import pagebench.measure.c\n")
    (pkg / "measure" / "c.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "CHECKED_DIRS", ("pagebench",))
    graph = package_graph(import_graph(top_level_only=False))
    assert graph["pagebench.engine"] & MEASURING == {"pagebench.measure"}
    assert find_cycles(graph) == [["pagebench.engine", "pagebench.kernels"]]
    assert find_cycles(package_graph(import_graph())) == []


STEP_PATH = ("engine.py", "scheduler.py", "model_runner.py", "decode_graphs.py", "parallel.py")
BLOCK_SIZE_NAMES = {"block_size", "bs"}


def block_arithmetic(path: Path) -> list[str]:
    """`x // block_size`, `x % block_size` (or `bs`) and `ceil_div(...)` calls in a file."""
    def names_block_size(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in BLOCK_SIZE_NAMES) or \
            (isinstance(node, ast.Attribute) and node.attr in BLOCK_SIZE_NAMES)

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)) \
                and names_block_size(node.right):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ceil_div":
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_engine_step_path_leaves_block_arithmetic_to_the_block_manager(tmp_path):
    engine = ROOT / PACKAGE / "engine"
    assert [hit for name in STEP_PATH for hit in block_arithmetic(engine / name)] == []
    sample = tmp_path / "sample.py"
    sample.write_text("a = p // self.block_size\nb = p % bs\nc = ceil_div(n, k)\nd = n // 2\n")
    assert block_arithmetic(sample) == ["sample.py:1: p // self.block_size",
                                        "sample.py:2: p % bs", "sample.py:3: ceil_div(n, k)"]


def format_graph(graph: dict[str, set[str]]) -> str:
    """One line per module: `module -> imported modules` (pagebench. prefix dropped)."""
    def short(m):
        return m[len(PACKAGE) + 1:] or PACKAGE

    lines = []
    for module in sorted(graph):
        targets = ", ".join(sorted(short(t) for t in graph[module]))
        lines.append(f"{short(module)} -> {targets}" if targets else short(module))
    return "\n".join(lines)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to subpackages (cli, engine, ...) and top-level modules."""
    def group(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2])
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(group(module), set()).update(
            group(t) for t in targets if group(t) != group(module))
    return out


if __name__ == "__main__":
    print("# packages, module-level imports\n" + format_graph(package_graph(import_graph())))
    print("\n# packages, imports inside functions included\n"
          + format_graph(package_graph(import_graph(top_level_only=False))))
    print("\n# modules\n" + format_graph(import_graph()))
