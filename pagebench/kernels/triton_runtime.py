"""The Triton runtime the kernels share: whether they run interpreted, a launcher that skips
Triton's per-call launch path, and small host helpers.

On a machine without a GPU the kernels run interpreted on CPU tensors: this module sets
``TRITON_INTERPRET=1`` before it imports Triton (:mod:`pagebench.triton_setup`), so every kernel
module imports it before Triton.
"""

from __future__ import annotations

from pagebench.triton_setup import interpret_without_gpu

# Triton's interpreter (3.9) computes bf16 tl.dot wrongly: where INTERPRETED, the dots run in fp32.
INTERPRETED = interpret_without_gpu()  # before Triton is imported: it reads the variable then
import triton  # noqa: E402 (after TRITON_INTERPRET is decided)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (plain Python: ``triton.next_power_of_2`` and ``triton.cdiv``
    are constexpr-function wrappers that cost microseconds per call on the launch path)."""
    return 1 << max(0, n - 1).bit_length()


def _launch_hooks_set() -> bool:
    """Whether a profiler (Proton, a user) hooked Triton's launches: then every launch goes
    through Triton so the hooks see it."""
    runtime = triton.knobs.runtime
    return any(h is not None and getattr(h, "calls", True)
               for h in (runtime.launch_enter_hook, runtime.launch_exit_hook))


# Launch compiled kernels directly where this Triton's launcher convention is known (3.4+ has
# ``triton.knobs``; checked against 3.6 and 3.9) and kernels are compiled, not interpreted.
DIRECT_LAUNCH = hasattr(triton, "knobs") and not INTERPRETED


class Launcher:
    """One Triton kernel with its grid, scalars and constexprs fixed, launched on tensors.

    Triton's own launch (``kernel[grid](...)``) re-derives the kernel's specialisation from
    every argument on each call: 26-40 us of host time per launch with Triton 3.6 on an H200's
    host, where launching the compiled kernel takes 10-16 us (docs/kernels.md, the host path). The
    scalars here never change, so only the tensors' 16-byte alignment (a specialisation Triton
    makes) can pick a different compiled kernel: the first launch of each alignment pattern goes
    through Triton, which compiles and returns the kernel; later ones call its launcher
    directly. A launcher serves one plan, whose key fixes every tensor's dtype (or one key of
    ``launch``'s). A call may give another ``grid``: Triton does not specialise on it.
    """

    def __init__(self, kernel, grid, scalars, constexprs, options, num_tensors):
        names = kernel.arg_names
        if list(names[num_tensors + len(scalars):]) != list(constexprs):
            raise AssertionError(f"{kernel}: arguments must be tensors, scalars, constexprs")
        self.kernel, self.scalars = kernel, tuple(scalars)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.kwargs = {**constexprs, **options}
        self.tail = self.scalars + tuple(constexprs.values())
        self.compiled = {}  # tensors' alignment -> (CompiledKernel, launcher, function, metadata)

    def __call__(self, *tensors, grid=None):
        g = self.grid if grid is None else tuple(grid) + (1,) * (3 - len(grid))
        key = tuple(t.data_ptr() % 16 == 0 for t in tensors) if DIRECT_LAUNCH else None
        hit = self.compiled.get(key)
        if hit is None or _launch_hooks_set():
            kernel = self.kernel[g](*tensors, *self.scalars, **self.kwargs)
            if key is not None and hasattr(kernel, "packed_metadata"):
                self.compiled[key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata)
            return
        _, run, function, metadata = hit
        run(g[0], g[1], g[2], _current_stream(tensors[0].device.index), function, metadata,
            None, None, None, *tensors, *self.tail)


_LAUNCHERS: dict = {}
MAX_LAUNCHERS = 1024


def launch(kernel, grid, tensors, scalars, constexprs, options) -> None:
    """``kernel[grid](*tensors, *scalars, **constexprs, **options)`` (arguments in that order)
    through a ``Launcher`` cached per device, tensor dtypes, scalars, constexprs and options:
    a kernel launched with arguments it has seen before skips Triton's launch path."""
    key = (kernel, tensors[0].device, *(t.dtype for t in tensors), *scalars,
           *constexprs.items(), *options.items())
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        if len(_LAUNCHERS) >= MAX_LAUNCHERS:
            _LAUNCHERS.clear()
        launcher = _LAUNCHERS[key] = Launcher(kernel, grid, scalars, constexprs, options,
                                               len(tensors))
    launcher(*tensors, grid=grid)


def _current_stream(device_index: int) -> int:
    return triton.runtime.driver.active.get_current_stream(device_index)
