"""The variants of an A/B run: named backends with launch options, read from a file or named.

A variants file (TOML or JSON, by its suffix) lists ``variant`` records in order; the first is
the baseline the others are compared with::

    import = ["my_decode.py"]        # optional: Python files that register backends
    [[variant]]
    name = "triton"                  # letters, digits, '.', '_', '-' (a command-line word)
    backend = "triton"               # a registered backend
    [[variant]]
    name = "triton-2-splits"
    backend = "triton"
    launch = { num_splits = 2 }      # the kernel's launch fields (optional)
    [[variant]]
    name = "sdpa"
    backend = "sdpa"
    layout = "contiguous"            # optional: "paged" (the default) or "contiguous"

JSON has the same shape: ``{"variant": [{"name": ..., "backend": ..., "launch": {...}}]}``.

- ``layout = "contiguous"`` (decode only) runs the backend's contiguous kernel on the same
  values, copied out of the blocks before the timed calls: the baseline that paging is
  measured against. On the command line ``NAME-contiguous`` (``NAME-paged``) is a backend in
  that layout, as the sweeps label it.
- ``import``: a kernel of your own (an edited copy of one, say) joins through Python files,
  paths relative to the variants file, run once per process before the variants are read,
  that call ``pagebench.kernels.register_backend``; its backend is then a variant like any
  other.

Every mistake (a bad file, an unknown key, backend or launch field, a backend without the
routine's operation, a repeated name) is a ``ConfigError`` naming the option, the file and the
variant, raised before anything runs.

:func:`variant_call` is the one place a variant becomes a call; :data:`LAUNCH_KERNELS` says
which backends take launch fields, where their kernels are and what declares the fields.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pagebench.errors import ConfigError
from pagebench.kernels import registry

# --routine -> the registry operation its call runs (mixed: prefill chunks and decodes, one
# query each, in one prefill call)
ROUTINE_OPS = {"decode": "decode", "prefill": "prefill", "mixed": "prefill"}
VARIANT_KEYS = ("name", "backend", "launch", "layout")
FILE_KEYS = ("variant", "import")
LAYOUTS = ("paged", "contiguous")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# (backend, operation) -> (module, the kernel a variant with launch fields calls, what declares
# the fields): a launch dataclass (the kernel is called with ``launch=`` one built from them)
# or a function (its keyword-only parameters, passed as keywords)
LAUNCH_KERNELS = {
    ("triton", "decode"): ("pagebench.kernels.triton_decode", "triton_paged_decode",
                           "DecodeLaunch"),
    ("triton", "prefill"): ("pagebench.kernels.triton_prefill", "triton_paged_prefill",
                            "PrefillLaunch"),
}
_imported: dict[Path, object] = {}  # resolved path -> module: each file runs once per process


@dataclass(frozen=True)
class Variant:
    name: str
    backend: str
    launch: dict = field(default_factory=dict, hash=False)  # launch field -> value
    layout: str = "paged"  # or "contiguous": the backend's contiguous kernel (decode)


def variant_op(variant: Variant, routine: str) -> str:
    """The registry operation ``variant`` runs for ``routine``."""
    return "contiguous" if variant.layout == "contiguous" else ROUTINE_OPS[routine]


def _launch_kernel(backend: str, op: str):
    """(the kernel, what declares its launch fields) of ``LAUNCH_KERNELS``, or None."""
    where = LAUNCH_KERNELS.get((backend, op))
    if where is None:
        return None
    module = importlib.import_module(where[0])
    return getattr(module, where[1]), getattr(module, where[2])


def launch_fields(backend: str, op: str) -> tuple[str, ...]:
    """The launch fields a variant of ``backend`` may set for ``op`` (none: it takes none)."""
    found = _launch_kernel(backend, op)
    if found is None:
        return ()
    declares = found[1]
    if dataclasses.is_dataclass(declares):
        return tuple(f.name for f in dataclasses.fields(declares))
    return tuple(p.name for p in inspect.signature(declares).parameters.values()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY)


def variant_call(variant: Variant, op: str, args: tuple, scale: float,
                 scales: dict) -> Callable[[], object]:
    """A no-argument call of ``variant`` on already-validated ``args`` (the operation's
    positional tensors) with ``scale`` and the fp8 ``scales`` keywords: the backend's prepared
    call (``Backend.prepared_call``), or with launch fields its kernel called with them (as
    one ``launch=`` record where a dataclass declares them)."""
    backend = registry.get_backend(variant.backend)
    if not variant.launch:
        return backend.prepared_call(op, *args, scale, **scales)
    kernel, declares = _launch_kernel(variant.backend, op)
    launch = ({"launch": declares(**variant.launch)} if dataclasses.is_dataclass(declares)
              else dict(variant.launch))
    return lambda: kernel(*args, scale, **scales, **launch)


def check_variant(variant: Variant, routine: str, where: str) -> Variant:
    """``variant`` if its backend is registered and available, has the routine's operation and
    takes each launch field it sets; else a ConfigError that starts with ``where``."""
    if variant.layout not in LAYOUTS:
        raise ConfigError(f"{where}: layout must be one of {', '.join(LAYOUTS)}, got "
                          f"{variant.layout!r}")
    if variant.layout == "contiguous" and routine != "decode":
        raise ConfigError(f"{where}: a contiguous layout is a decode baseline; --routine "
                          f"{routine} runs paged kernels only")
    op = variant_op(variant, routine)
    try:
        backend = registry.get_backend(variant.backend)
    except ValueError as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('backend: ')}") from None
    if getattr(backend, op) is None:
        hint = (f"; {variant.backend}-contiguous is its contiguous decode"
                 if backend.contiguous is not None and routine == "decode" else "")
        raise ConfigError(f"{where}: backend {variant.backend!r} has no {op} kernel, which "
                          f"--routine {routine} calls (it has {list(backend.operations())})"
                          f"{hint}")
    if variant.launch:
        fields = launch_fields(variant.backend, op)
        if not fields:
            raise ConfigError(f"{where}: backend {variant.backend!r} takes no launch fields "
                              f"for {op}")
        unknown = sorted(set(variant.launch) - set(fields))
        if unknown:
            raise ConfigError(f"{where}: unknown launch field(s) {', '.join(unknown)} for "
                              f"{variant.backend} {op} (it takes {', '.join(fields)})")
    return variant


def read_variants(path: str, routine: str, only: list[str] | None = None) -> list[Variant]:
    """The variants listed in ``path`` (``only``: those named, in the file's order), each
    checked for ``routine`` (:func:`check_variant`: only the selected ones, so that one file
    can hold decode and prefill variants); the first is the baseline."""
    option = "--variants"
    records, imports = _records(path)
    for module in imports:
        import_kernels(path, module)
    if not isinstance(records, list) or not records:
        raise ConfigError(f"{option}: {path}: expected a non-empty list of [[variant]] "
                          "records")
    variants: list[Variant] = []
    where_of: dict[str, str] = {}
    for i, record in enumerate(records, 1):
        where = f"{option}: {path}: variant {i}"
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected a table of {', '.join(VARIANT_KEYS)}")
        unknown = sorted(set(record) - set(VARIANT_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (a variant has "
                              f"{', '.join(VARIANT_KEYS)})")
        name, backend = record.get("name"), record.get("backend")
        launch, layout = record.get("launch", {}), record.get("layout", "paged")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError(f"{where}: name must be letters, digits, '.', '_' or '-', got "
                              f"{name!r}")
        where = f"{option}: {path}: variant {name!r}"
        if not isinstance(backend, str):
            raise ConfigError(f"{where}: backend must be a backend's name, got {backend!r}")
        if not isinstance(launch, dict):
            raise ConfigError(f"{where}: launch must be a table of launch fields, got "
                              f"{launch!r}")
        if any(v.name == name for v in variants):
            raise ConfigError(f"{option}: {path}: two variants are named {name!r}")
        variants.append(Variant(name, backend, launch, layout))
        where_of[name] = where
    return [check_variant(v, routine, where_of[v.name])
            for v in _select(variants, only, f"{option}: {path}")]


def named_variants(names: list[str], routine: str) -> list[Variant]:
    """``--backends a,b``: one variant per name, without launch fields: a backend (paged), or
    a backend's label ``NAME-paged`` / ``NAME-contiguous`` (that layout)."""
    if len(set(names)) != len(names):
        raise ConfigError(f"--backends: a backend is named twice in {','.join(names)}")
    return [check_variant(_labelled(n), routine, f"--backends: {n}") for n in names]


def _labelled(label: str) -> Variant:
    """The variant a ``--backends`` name stands for (a registered name is taken as it is)."""
    registered = registry.registered_backends()
    for layout in LAYOUTS:
        backend = label.removesuffix(f"-{layout}")
        if backend != label and label not in registered and backend in registered:
            return Variant(label, backend, layout=layout)
    return Variant(label, label)


def _select(variants: list[Variant], only: list[str] | None, where: str) -> list[Variant]:
    if not only:
        return variants
    missing = [n for n in only if n not in {v.name for v in variants}]
    if missing:
        raise ConfigError(f"--only: {where} has no variant {', '.join(map(repr, missing))} "
                          f"(it has {', '.join(v.name for v in variants)})")
    return [v for v in variants if v.name in only]


def _records(path: str):
    """The ``variant`` list and the ``import`` list of a TOML or JSON file; a ConfigError for
    an unreadable or malformed file."""
    option = "--variants"
    suffix = Path(path).suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ConfigError(f"{option}: {path}: expected a .toml or .json file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{option}: {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{option}: cannot read {path}: {getattr(e, 'strerror', None) or e}") \
            from None
    try:
        if suffix == ".toml":
            import tomllib

            doc = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except ValueError as e:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        kind = "TOML" if suffix == ".toml" else "JSON"
        raise ConfigError(f"{option}: {path}: bad {kind}: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict) or "variant" not in doc or not set(doc) <= set(FILE_KEYS):
        raise ConfigError(f"{option}: {path}: expected a 'variant' list (TOML [[variant]] "
                          "tables) and optionally an 'import' list, nothing else")
    imports = doc.get("import", [])
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise ConfigError(f"{option}: {path}: import must be a list of Python files")
    return doc["variant"], imports


def import_kernels(variants_path: str, module: str) -> None:
    """Run the Python file ``module`` (relative to the variants file) once per process: it
    registers the backends the variants name."""
    import importlib.util
    import sys

    path = (Path(variants_path).parent / module).resolve()
    if path in _imported:
        return
    where = f"--variants: {variants_path}: import {module}"
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(f"{where}: not a Python file")
    name = f"pagebench_ab_import_{len(_imported)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    try:
        spec.loader.exec_module(loaded)
    except Exception as e:  # noqa: BLE001 -- any failure of the user's file is one line
        del sys.modules[name]
        raise ConfigError(f"{where}: {type(e).__name__}: {' '.join(str(e).split())}") \
            from None
    _imported[path] = loaded
