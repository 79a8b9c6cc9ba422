"""One rank of the ``pagebench tp-bench`` test (tests/test_parallel.py runs it under torchrun):
each experiment that needs two ranks, at tiny sizes, through the command line, in one process
group (the command uses a group already initialised as it is)."""

import sys

import torch.distributed as dist

from pagebench.cli import main

TINY = ["--kv-memory", "1MiB", "--batch-sizes", "1,2", "--prompt-len", "8", "--max-tokens", "3"]
EXPERIMENTS = {
    "equality": ["--kernel", "torch", "--prompt-len", "12", "--max-tokens", "4"],
    "capacity": ["--kv-memory", "1MiB"],
    "throughput": TINY,
    "allreduce": TINY + ["--repeat", "3"],
    "allreduce-bw": ["--batch-sizes", "8,1,2", "--repeat", "2"],
}


def run(out_dir):
    dist.init_process_group("gloo")
    for experiment, options in EXPERIMENTS.items():
        code = main(["tp-bench", experiment, "--device", "cpu", *options,
                     "--out", f"{out_dir}/{experiment}.csv"])
        if code:
            raise SystemExit(f"tp-bench {experiment}: exit status {code}")
    dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1])
