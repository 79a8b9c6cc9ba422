"""Processes launched by ``torchrun``: who am I, and splitting a sweep over the ranks.

``pagebench bench`` under ``torchrun --nproc-per-node N`` times every N-th (shape, point) of
its sweep on each rank, one GPU per rank (``LOCAL_RANK``), and rank 0 writes the merged rows.
The rows are gathered as Python objects over gloo, which every build of torch has.
"""

from __future__ import annotations

import os


def world_from_environment() -> tuple[int, int]:
    """(rank, world size) of the default process group, or of torchrun's environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class SweepRanks:
    """This process's share of a sweep: ``(rank, world)``; world 1 outside torchrun."""

    def __init__(self, device: str = "cpu"):
        import torch

        self.rank, self.world = world_from_environment()
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.gpu = "cpu"
        self.owns_group = False
        if torch.device(device).type == "cuda":
            if self.local_rank >= torch.cuda.device_count():
                raise ValueError(f"--device: local rank {self.local_rank} has no GPU "
                                 f"({torch.cuda.device_count()} visible)")
            torch.cuda.set_device(self.local_rank)
            self.gpu = f"cuda:{self.local_rank}"
        if self.world > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo")
                self.owns_group = True

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
        if self.owns_group:
            dist.barrier()
            dist.destroy_process_group()
        if self.rank != 0:
            return None, None
        return (pd.concat([f for f, _ in parts], ignore_index=True),
                [s for _, part in parts for s in part])


def take_share(index: int, share: tuple[int, int]) -> bool:
    """Whether the work unit numbered ``index`` belongs to rank ``share[0]`` of ``share[1]``."""
    rank, world = share
    return index % world == rank
