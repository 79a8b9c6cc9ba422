"""Backend registry: name -> kernels + capabilities. Third-party kernels plug in here.

A backend supplies any of three operations, each a plain function taking already-validated
tensors and a resolved float ``scale``:

- ``decode(q, k_cache, v_cache, block_tables, seq_lens, scale) -> out`` (paged decode)
- ``prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale) -> out``
  (``query_start_loc``: the queries' cumulative offsets, ``[num_seqs + 1]`` from 0)
- ``contiguous(q, k, v, seq_lens, scale) -> out`` (contiguous cache; ``seq_lens`` is None when
  every sequence fills the cache's max_len)

A backend that reads fp8 caches lists them in ``cache_dtypes``; it is then called with
keywords ``k_scale=``, ``v_scale=`` (float32 tensors ``[num_kv_heads]``, see
``pagebench.kernels.quant``) for such a cache, and without them otherwise, so backends that
only read unquantised caches need not know about scales. Where the hardware decides (Triton
compiles e4m3 only for NVIDIA GPUs of compute capability 8.9+), ``reads_cache_on(device,
cache_dtype)`` says which of them a device reads; the others resolve to another backend.

What the timing sweeps need is declared here too, so they name no backend:

- ``graph_capturable``: the operations whose call can be captured in a CUDA graph (it reads
  nothing back to the host); the sweeps time those replayed from a graph as well, on CUDA;
- ``prepare``: per operation, a function taking the operation's arguments and returning a
  no-argument call with the per-input state built once (FlexAttention's block mask, the
  identity block table of Triton on a contiguous cache), which timing loops call;
- ``auto_devices``: where it runs as a real kernel (elsewhere it is interpreted or a dense
  reference, for tests): ``"auto"`` picks it and the sweeps time it only there;
- ``sweep_block_sizes``: the only block sizes the decode sweep times it at (a backend that
  compiles once per page size); ``scratch_ratio``: the device memory one call allocates, as a
  multiple of the K/V bytes it reads (the sweep skips a point where that would not fit).

Once registered, a backend is used by ``backend="<name>"`` (and by ``"auto"`` by priority),
checked by the property tests and timed by the sweeps, with no other change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Mapping

import torch

from pagebench.config import dtype_name

OPERATIONS = ("decode", "prefill", "contiguous")


def _always() -> bool:
    return True


def _always_true(_value) -> bool:
    return True


def _any_block_size(block_size: int) -> bool:
    return block_size >= 1


def _device_type(device) -> str:
    """``device``'s type ("cuda" for "cuda:1"); a torch.device's own, without building another
    (``resolve`` builds one and asks every backend about it)."""
    return device.type if isinstance(device, torch.device) else torch.device(device).type


@dataclass(frozen=True)
class Backend:
    name: str
    decode: Callable | None = None
    prefill: Callable | None = None
    contiguous: Callable | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    head_dims: str = "any"  # human-readable; `supports_head_dim` decides
    supports_head_dim: Callable[[int], bool] = _always_true
    block_sizes: str = "any >= 1"  # human-readable; `supports_block_size` decides
    supports_block_size: Callable[[int], bool] = _any_block_size
    is_available: Callable[[], bool] = _always
    priority: int = 0  # "auto" picks the highest-priority backend that supports the input
    description: str = ""
    # devices where it runs as a real kernel ("auto" picks it and the sweeps time it only there;
    # e.g. Triton runs on CPU only interpreted: tests, not speed); None: all its devices
    auto_devices: tuple[str, ...] | None = None
    # False: the kernel may multiply non-finite values in slots it must not use by zero weights
    # (NaN * 0 = NaN), so tests poison those slots with large finite values instead of NaN
    nan_safe: bool = True
    # dtypes the paged cache may have: q's own dtype (one of ``dtypes``), or an fp8 dtype read
    # with per-head scales; None: q's dtype only
    cache_dtypes: tuple[torch.dtype, ...] | None = None
    # False: it reads only the fp8 ``cache_dtypes``, not a cache of q's own dtype
    reads_own_dtype: bool = True
    # (device, one of cache_dtypes) -> whether that device reads it; None: every device does
    reads_cache_on: Callable[[torch.device, torch.dtype], bool] | None = None
    graph_capturable: tuple[str, ...] = ()  # operations a CUDA graph can capture
    # operation -> function(the operation's arguments) -> no-argument call, state built once
    prepare: Mapping[str, Callable] = field(default_factory=dict, compare=False)
    sweep_block_sizes: tuple[int, ...] | None = None  # None: every block size swept
    scratch_ratio: float = 0.125  # device memory per call / K/V bytes read
    # query heads per KV head its decode has a kernel for (checked by the kernel itself, which
    # refuses others with a ValueError; the property tests draw only these)
    supports_group: Callable[[int], bool] = _always_true

    def operations(self) -> tuple[str, ...]:
        return tuple(op for op in OPERATIONS if getattr(self, op) is not None)

    def supports_cache_dtype(self, cache_dtype, dtype, device=None) -> bool:
        """Whether a paged cache of ``cache_dtype`` can be read with queries of ``dtype`` (on
        ``device``, where given)."""
        if cache_dtype == dtype:
            return self.reads_own_dtype
        return cache_dtype in (self.cache_dtypes or ()) and (
            device is None or self.reads_cache_on is None
            or self.reads_cache_on(torch.device(device), cache_dtype))

    def supports(self, op: str, device, dtype, block_size: int | None = None,
                 head_dim: int | None = None, cache_dtype=None) -> bool:
        return (getattr(self, op, None) is not None
                and _device_type(device) in self.devices
                and dtype in self.dtypes
                and (op == "contiguous"  # None: a cache of q's dtype
                     or self.supports_cache_dtype(cache_dtype or dtype, dtype, device))
                and (head_dim is None or self.supports_head_dim(head_dim))
                and (block_size is None or self.supports_block_size(block_size)))

    def is_kernel_on(self, device) -> bool:
        """Whether it runs as a real kernel on ``device`` (not interpreted or a reference):
        ``"auto"`` picks it and the sweeps time it only there."""
        return _device_type(device) in (self.auto_devices or self.devices)

    def prepared_call(self, op: str, *args, **scales) -> Callable[[], torch.Tensor]:
        """A no-argument call of ``op`` on already-validated ``args`` (``scales``: the fp8
        keywords), for timing loops: the ``prepare`` hook's when the backend has one for
        ``op``, else the kernel called as it is."""
        if getattr(self, op, None) is None:
            raise ValueError(f"op: {self.name!r} has no {op} kernel (it has "
                             f"{list(self.operations())})")
        hook = self.prepare.get(op)
        if hook is not None:
            return hook(*args, **scales)
        kernel = getattr(self, op)
        return lambda: kernel(*args, **scales)

    def capabilities(self, device=None) -> dict:
        """What it runs; ``device``: list only the cache dtypes that device reads."""
        return {
            "operations": list(self.operations()),
            "devices": list(self.devices),
            "dtypes": [dtype_name(d) for d in self.dtypes],
            "cache_dtypes": [dtype_name(d) for d in (self.cache_dtypes or self.dtypes)
                             if (d in self.dtypes and self.reads_own_dtype)
                             or self.supports_cache_dtype(d, None, device)],
            "block_sizes": self.block_sizes,
            "head_dims": self.head_dims,
            "priority": self.priority,
            "nan_safe": self.nan_safe,
            "graph_capturable": list(self.graph_capturable),
            "description": self.description,
        }


_REGISTRY: dict[str, Backend] = {}


def register_backend(name: str, *, decode=None, prefill=None, contiguous=None,
                     devices=("cpu", "cuda"), dtypes=(torch.float32, torch.float16, torch.bfloat16),
                     head_dims: str = "any", supports_head_dim: Callable[[int], bool] = _always_true,
                     block_sizes: str = "any >= 1",
                     supports_block_size: Callable[[int], bool] = _any_block_size,
                     is_available: Callable[[], bool] = _always, priority: int = 0,
                     description: str = "", auto_devices=None, nan_safe: bool = True,
                     cache_dtypes=None, reads_cache_on=None, graph_capturable=(), prepare=None,
                     sweep_block_sizes=None, scratch_ratio: float = 0.125,
                     reads_own_dtype: bool = True, supports_group: Callable[[int], bool] = _always_true,
                     replace: bool = False) -> Backend:
    """Add a backend. At least one of decode/prefill/contiguous; ``replace=True`` to overwrite.
    ``cache_dtypes``: the paged cache dtypes it reads (default: q's dtype only; list fp8
    dtypes to be called with ``k_scale``/``v_scale`` on fp8 caches; ``reads_cache_on``: which
    of them a device reads, where the hardware decides; ``reads_own_dtype=False``: only those
    fp8 dtypes, not a cache of q's dtype). ``graph_capturable``,
    ``prepare``, ``sweep_block_sizes``, ``scratch_ratio``: what the timing sweeps need (see
    the module docstring). ``supports_group``: the query heads per KV head its decode takes
    (default any)."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name: must be a non-empty string other than 'auto', got {name!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"name: backend {name!r} is already registered (pass replace=True)")
    if decode is None and prefill is None and contiguous is None:
        raise ValueError("decode: a backend needs at least one of decode, prefill, contiguous")
    for op_name, fn in (("decode", decode), ("prefill", prefill), ("contiguous", contiguous)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{op_name}: expected a callable, got {type(fn).__name__}")
    unknown = [d for d in devices if d not in ("cpu", "cuda")]
    if unknown or not devices:
        raise ValueError(f"devices: expected a non-empty subset of ('cpu', 'cuda'), got {devices!r}")
    ops = {op for op, fn in zip(OPERATIONS, (decode, prefill, contiguous)) if fn is not None}
    if isinstance(graph_capturable, str):
        raise ValueError(f"graph_capturable: expected a tuple of operations, got "
                         f"{graph_capturable!r}")
    if prepare is not None and not isinstance(prepare, Mapping):
        raise ValueError(f"prepare: expected a mapping operation -> hook, got "
                         f"{type(prepare).__name__}")
    prepare = dict(prepare or {})
    for arg, named in (("graph_capturable", tuple(graph_capturable)), ("prepare", tuple(prepare))):
        if not set(named) <= ops:
            raise ValueError(f"{arg}: names operations the backend lacks: "
                             f"{sorted(set(named) - ops)} (it has {sorted(ops)})")
    if not reads_own_dtype and not cache_dtypes:
        raise ValueError("reads_own_dtype: a backend that reads no cache of q's dtype must list "
                         "the cache_dtypes it reads")
    if not callable(supports_group):
        raise ValueError(f"supports_group: expected a callable, got {type(supports_group).__name__}")
    if reads_cache_on is not None and not callable(reads_cache_on):
        raise ValueError(f"reads_cache_on: expected a callable, got {type(reads_cache_on).__name__}")
    for op, hook in prepare.items():
        if not callable(hook):
            raise ValueError(f"prepare: the {op} hook is a {type(hook).__name__}, not callable")
    if sweep_block_sizes is not None and (
            not sweep_block_sizes
            or not all(isinstance(b, int) and b >= 1 for b in sweep_block_sizes)):
        raise ValueError(f"sweep_block_sizes: expected block sizes >= 1 or None, "
                         f"got {sweep_block_sizes!r}")
    if isinstance(scratch_ratio, bool) or not isinstance(scratch_ratio, (int, float)) \
            or not scratch_ratio >= 0:
        raise ValueError(f"scratch_ratio: expected a number >= 0, got {scratch_ratio!r}")
    backend = Backend(
        name, decode, prefill, contiguous, tuple(devices), tuple(dtypes), str(head_dims),
        supports_head_dim, block_sizes, supports_block_size, is_available, priority, description,
        None if auto_devices is None else tuple(auto_devices), bool(nan_safe),
        None if cache_dtypes is None else tuple(cache_dtypes), reads_cache_on=reads_cache_on,
        graph_capturable=tuple(graph_capturable), prepare=prepare,
        sweep_block_sizes=None if sweep_block_sizes is None else tuple(sweep_block_sizes),
        scratch_ratio=float(scratch_ratio), reads_own_dtype=bool(reads_own_dtype),
        supports_group=supports_group)
    _REGISTRY[name] = backend
    return backend


def unregister_backend(name: str) -> None:
    if name not in _REGISTRY:
        raise ValueError(f"name: no backend {name!r} registered")
    del _REGISTRY[name]


def backend_available(b: Backend) -> bool:
    try:
        return bool(b.is_available())
    except Exception:  # noqa: BLE001 -- a broken optional dependency means "not available"
        return False


def registered_backends() -> dict[str, Backend]:
    return dict(_REGISTRY)


def get_backend(name: str) -> Backend:
    backend = _REGISTRY.get(name)
    if backend is None:
        raise ValueError(f"backend: unknown backend {name!r} (registered: {sorted(_REGISTRY)})")
    if not backend_available(backend):
        raise ValueError(f"backend: {name!r} is registered but not available on this machine")
    return backend


def available_backends() -> dict[str, dict]:
    """Backends that run on this machine, with their capabilities (devices, dtypes, block sizes)."""
    has_cuda = torch.cuda.is_available()
    out = {}
    for name, b in sorted(_REGISTRY.items(), key=lambda kv: -kv[1].priority):
        if not backend_available(b):
            continue
        caps = b.capabilities("cuda" if has_cuda else None)  # cache dtypes this GPU reads
        caps["devices"] = [d for d in b.devices if d == "cpu" or has_cuda]
        if caps["devices"]:
            out[name] = caps
    return out


def resolve(op: str, backend: str, device, dtype, block_size=None, head_dim=None,
            cache_dtype=None) -> Backend:
    """The backend to run ``op``: the one named, checked against the input, or the best for it.
    ``cache_dtype``: the paged cache's dtype when it may differ from q's (fp8)."""
    if not isinstance(backend, str):
        raise ValueError(f"backend: expected a backend name or 'auto', got {backend!r}")
    device = torch.device(device)  # once: every backend below is asked about it
    device_type = device.type
    if backend != "auto":
        b = get_backend(backend)
        if getattr(b, op) is None:
            raise ValueError(f"backend: {backend!r} has no {op} kernel (it has {list(b.operations())})")
        if not b.supports(op, device, dtype, block_size, head_dim, cache_dtype):
            cache = "" if cache_dtype in (None, dtype) else f", cache {dtype_name(cache_dtype)}"
            raise ValueError(
                f"backend: {backend!r} does not support this input ({device_type}, "
                f"{dtype_name(dtype)}{cache}, block_size={block_size}, "
                f"head_dim={head_dim}); on this device it supports {b.capabilities(device)}")
        return b
    candidates = [b for b in _REGISTRY.values()
                  if b.is_kernel_on(device) and backend_available(b)
                  and b.supports(op, device, dtype, block_size, head_dim, cache_dtype)]
    if not candidates:
        raise ValueError(f"backend: no registered backend runs {op} for {device_type}, "
                         f"{dtype} (cache {cache_dtype or dtype}), block_size={block_size}, "
                         f"head_dim={head_dim}")
    return max(candidates, key=lambda b: b.priority)
