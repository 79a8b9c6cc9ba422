"""Processes launched by ``torchrun``: who am I, joining the group, splitting a sweep over the
ranks, and timing a whole torchrun job.

``pagebench bench`` under ``torchrun --nproc-per-node N`` times every N-th (shape, point) of
its sweep on each rank, one GPU per rank (``LOCAL_RANK``), and rank 0 writes the merged rows.
The rows are gathered as Python objects over gloo, which every build of torch has.
``pagebench tp-bench`` joins one group of the world (NCCL for CUDA, which tensor parallelism
needs; gloo on the CPU) and runs every measurement on every rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pagebench.engine.parallel import world_from_environment
from pagebench.errors import PagebenchError


class SweepRanks:
    """This process's share of a sweep: ``(rank, world)``; world 1 outside torchrun."""

    def __init__(self, device: str = "cpu"):
        self.rank, self.world = world_from_environment()
        self.gpu = str(rank_device(device))  # "cpu", or this rank's "cuda:LOCAL_RANK"
        # the rows are gathered as Python objects, over gloo whatever the device
        self.owns_group = join_group("cpu")

    @property
    def share(self) -> tuple[int, int]:
        return self.rank, self.world

    def merge(self, frame, skipped: list):
        """Every rank's rows (each naming its rank and GPU) and skipped points, on rank 0:
        ``(frame, skipped)``; ``(None, None)`` on the other ranks.

        The last collective: a group this object started is shut down here (a gloo group left
        to the interpreter's exit can abort the process)."""
        import pandas as pd

        frame = frame.assign(rank=self.rank, gpu=self.gpu)
        if self.world == 1:
            return frame, skipped
        import torch.distributed as dist

        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object((frame, skipped), parts, dst=0)
        leave_group(self.owns_group)
        if self.rank != 0:
            return None, None
        return (pd.concat([f for f, _ in parts], ignore_index=True),
                [s for _, part in parts for s in part])


def take_share(index: int, share: tuple[int, int]) -> bool:
    """Whether the work unit numbered ``index`` belongs to rank ``share[0]`` of ``share[1]``."""
    rank, world = share
    return index % world == rank


def rank_device(device: str):
    """This process's device: ``cuda:LOCAL_RANK`` for ``cuda`` (one GPU per rank), else
    ``device``; ValueError when the rank has no GPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    rank, _ = world_from_environment()
    local = int(os.environ.get("LOCAL_RANK", rank))
    if local >= torch.cuda.device_count():
        raise ValueError(f"--device: local rank {local} has no GPU "
                         f"({torch.cuda.device_count()} visible)")
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def join_group(device) -> bool:
    """Initialise the default process group of torchrun's world for ``device`` (NCCL on CUDA,
    gloo on the CPU); whether it was started here (False: one process, or a group already
    initialised, used as it is)."""
    import torch
    import torch.distributed as dist

    _, world = world_from_environment()
    if world == 1 or dist.is_initialized():
        return False
    device = torch.device(device)
    if device.type == "cuda":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return True


def leave_group(started: bool) -> None:
    """Shut down a group :func:`join_group` started, once every rank is done with it (a group
    left to the interpreter's exit can abort the process)."""
    import torch.distributed as dist

    if started and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def time_torchrun(nproc: int, argv: list[str], env: dict | None = None) -> tuple[float, str]:
    """(wall seconds, output) of ``torchrun --standalone --nproc-per-node nproc argv``, started
    from a fresh interpreter: torchrun's start, the workers' imports and their work. The workers
    import the ``pagebench`` this process runs. PagebenchError with the output's tail if it fails."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        out = proc.stdout
        launcher = out.rfind("Traceback (most recent call last)")
        if "ChildFailedError" in out[launcher:]:  # torchrun's own report: the workers' is above
            out = out[:launcher]
        raise PagebenchError(f"torchrun --nproc-per-node {nproc} {' '.join(argv)}: exit status "
                             f"{proc.returncode}: {out.strip()[-1500:]}")
    return seconds, proc.stdout


def sweep_wall(gpus, bench_args: list[str]):
    """Wall time of ``pagebench bench *bench_args`` under torchrun on each number of ``gpus``,
    each with a cold Triton cache (every run pays its compiles): (``sweep_wall`` rows, the
    sweeps' merged rows, each naming ``gpus``). ``startup_s``, the fixed cost inside each wall
    time, is torchrun starting one ``pagebench bench --list-backends``."""
    import csv

    from pagebench.results import datasets

    startup, _ = time_torchrun(1, ["-m", "pagebench", "bench", "--list-backends"])
    walls, rows = [], []
    for n in gpus:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "sweep.csv")
            seconds, _ = time_torchrun(n, ["-m", "pagebench", "bench", *bench_args, "--out", out],
                                       env={"TRITON_CACHE_DIR": os.path.join(tmp, "triton")})
            with open(out, newline="") as f:
                sweep = [r | {"gpus": n} for r in csv.DictReader(f)]  # cells as bench wrote them
        rows += sweep
        walls.append(datasets.SWEEP_WALL.row(
            gpus=n, wall_s=seconds, startup_s=startup, rows=len(sweep),
            points=len({(r["model_shape"], r["batch"], r["context"]) for r in sweep})))
    return walls, rows
