"""The report's one device naming scheme: a short label for every table, plot and claim.

A GPU is named by its model without the vendor prefix (``H200``), a CPU by its core count and
architecture (``CPU (2-core x86_64)``); rows measured by the report run itself carry
`` · this run`` so they are never mixed with committed data from the same kind of machine. The
full description (device name, versions, commit, where the data came from) is shown once, in
the Environment section.

:func:`device_label` names one device; :func:`frame_labels` names every row of a results
frame (``read.Results.add`` applies it, so every dataset's ``machine`` column holds labels).
"""

from __future__ import annotations

import re

import pandas as pd

THIS_RUN = " · this run"  # no comma: device lists are comma-separated
GPU_VENDOR_PREFIXES = ("NVIDIA ", "AMD ")
# a CPU label, or a GPU model name (starts with a capital or digit: "H200", "RTX 4090",
# "2× H200"); either may end with THIS_RUN
LABEL_PATTERN = re.compile(r"(CPU \((\d+-core )?[^()\[\]]+\)"
                           r"|(?!NVIDIA |AMD |CPU)[A-Z0-9][^()\[\]]*)"
                           + "(?:" + re.escape(THIS_RUN) + ")?")
# machine names seen without device columns (asv machines, data directories): a GPU model
GPU_NAME = re.compile(r"(nvidia[-_ ]?)?((gh|gb)?[abhlv]\d{2,3}[a-z0-9]*|mi\d{3}[a-z]*)",
                      re.IGNORECASE)
CORES = re.compile(r"(\d+)[-_ ]?cores?", re.IGNORECASE)


def device_label(device: str = "cpu", device_name: str = "", cpu_count=None, *,
                 num_devices: int = 1, this_run: bool = False) -> str:
    """The short label of one device.

    Args:
        device: ``cpu`` or ``cuda[:n]`` (as result rows record it).
        device_name: the GPU's name (``NVIDIA H200``), or the CPU's architecture (``x86_64``).
        cpu_count: logical CPUs (CPU only; left out of the label when unknown).
        num_devices: GPUs used together (tensor parallel): ``2× H200``.
        this_run: measured by the report run itself rather than read from committed data.
    """
    device, name = str(device or "").strip(), str(device_name or "").strip()
    if device.startswith("cuda") or (device != "cpu" and name and not is_cpu_arch(name)):
        for prefix in GPU_VENDOR_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        label = name or "GPU"
        if int(num_devices) > 1:
            label = f"{int(num_devices)}× {label}"
    else:
        cores = _int_or_none(cpu_count)
        parts = [f"{cores}-core"] if cores else []
        if name and name.lower() != "cpu":
            parts.append(name)
        label = f"CPU ({' '.join(parts)})" if parts else "CPU (unknown)"
    return label + (THIS_RUN if this_run else "")


def run_label(env: dict) -> str:
    """The label of the machine a report is built on, from ``pagebench.measure.timing.environment``."""
    import os

    return device_label(env.get("device", "cpu"), env.get("device_name", ""), os.cpu_count())


def is_cpu_arch(name: str) -> bool:
    return name.lower() in ("x86_64", "amd64", "i386", "i686", "arm", "arm64", "aarch64",
                            "ppc64le", "s390x", "riscv64") or name.lower().startswith("cpu")


def is_device_label(text) -> bool:
    """Whether ``text`` is a label of this scheme (a raw machine name such as ``h200`` or
    ``this machine (cpu)`` is not)."""
    return isinstance(text, str) and LABEL_PATTERN.fullmatch(text) is not None


def label_from_name(name) -> str:
    """A label from a machine name alone (asv machine, data directory): a GPU model name
    (``h200`` -> ``H200``), or a CPU (``cpu-epyc-2core`` -> ``CPU (2-core)``); a name that
    says neither is returned as it is."""
    name = str(name).strip()
    if is_device_label(name):
        return name
    gpu = GPU_NAME.fullmatch(name)
    if gpu:
        return gpu.group(2).upper()
    if "cpu" in name.lower():
        cores = CORES.search(name)
        return device_label("cpu", "", cores.group(1) if cores else None)
    return name


def label_from_asv_machine(info: dict, name: str) -> str:
    """A label from an asv ``machine.json`` (``cpu``, ``arch``, ``num_cpu``); a GPU machine
    names the GPU first in ``cpu`` (``NVIDIA H200, <driver>; host ...``)."""
    cpu = str(info.get("cpu") or "")
    gpu_name = cpu.split(",")[0].split(";")[0].strip()
    if gpu_name.startswith("NVIDIA ") or GPU_NAME.fullmatch(gpu_name):
        return device_label("cuda", gpu_name)
    if info.get("arch") or info.get("num_cpu"):
        return device_label("cpu", info.get("arch") or "", info.get("num_cpu"))
    return label_from_name(name)


def frame_labels(frame: pd.DataFrame) -> pd.Series:
    """The label of every row: a ``machine`` value that already is a label is kept (whoever
    wrote it knew the device); else from the ``device``, ``device_name`` and ``cpu_count``
    columns; else from the ``machine`` name alone."""
    cols = [c for c in ("machine", "device", "device_name", "cpu_count") if c in frame.columns]
    if not cols:
        return pd.Series(None, index=frame.index, dtype=object)
    keys = list(zip(*(frame[c].map(_text) for c in cols)))
    labels = {key: _label(dict(zip(cols, key))) for key in set(keys)}
    return pd.Series([labels[k] for k in keys], index=frame.index, dtype=object)


def frame_devices(frame: pd.DataFrame | None, default: str = "GPU") -> str:
    """The device labels of a frame's rows (its ``machine`` column, as ``Results.add`` set
    them), joined; ``default`` where there are none."""
    if frame is None or "machine" not in frame:
        return default
    return ", ".join(frame["machine"].dropna().astype(str).unique()) or default


def _label(row: dict):
    machine = row.get("machine", "")
    if is_device_label(machine):
        return machine
    if row.get("device") or row.get("device_name"):
        return device_label(row.get("device", ""), row.get("device_name", ""),
                            row.get("cpu_count"))
    return label_from_name(machine) if machine else None


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _int_or_none(value):
    try:
        n = int(float(value))
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None
