"""Train pagebench's tiny Llama-shaped model on the Python standard library's sources.

    PYTHONPATH=$PWD python3 scripts/train_tiny_model.py --out pagebench/data/models/pagebench-tiny-llama

The config, the byte vocabulary and the train / held-out rule are
:mod:`pagebench.engine.trained_model`'s. Training windows of ``--seq-len`` bytes start
anywhere in the train files joined end to end (each file after a BOS); every
``--eval-every`` steps the loss on fixed held-out windows is logged. The output directory gets
the bf16 weights (``model.safetensors``), ``config.json``, ``training_loss.csv`` (step,
train_loss, held_out_loss, lr, elapsed_s) and ``training.json`` (seed, Python and library
versions, corpus sizes, steps). The shipped model was trained on one GPU; ``--device cpu
--steps 3`` checks the script in seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pagebench.engine import trained_model as tm


def train_stream(root: Path | None) -> torch.Tensor:
    """The train files' bytes joined, each after a BOS (int16: ids up to 259)."""
    parts = []
    for path in tm.corpus_files(held_out=False, root=root):
        data = path.read_bytes()
        if data:
            parts += [torch.tensor([tm.BOS]), torch.frombuffer(bytearray(data), dtype=torch.uint8)]
    return torch.cat([p.to(torch.int16) for p in parts])


def loss_of(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--log-every", type=int, default=50, help="steps between loss rows")
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--max-seconds", type=float, default=float("inf"),
                   help="stop early (the cosine schedule is the full run's) after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    stream = train_stream(None)
    held = torch.tensor(tm.windows(args.eval_windows, args.seq_len + 1), device=device)
    config = LlamaConfig(**tm.CONFIG, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, start, step = [], time.perf_counter(), 0
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(stream) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([stream[s:s + args.seq_len + 1] for s in starts.tolist()])
        with autocast:
            loss = loss_of(model, batch.to(device=device, dtype=torch.int64))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = step == args.steps - 1 or time.perf_counter() - start > args.max_seconds
        if step % args.log_every == 0 or last:
            row = dict(step=step, train_loss=round(loss.item(), 4), held_out_loss="",
                       lr=lr, elapsed_s=round(time.perf_counter() - start, 1))
            if step % args.eval_every == 0 or last:
                model.eval()
                with torch.no_grad(), autocast:
                    row["held_out_loss"] = round(float(loss_of(model, held)), 4)
                model.train()
            rows.append(row)
            print(row, flush=True)
        if last:
            break
    model = model.to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None  # a byte model: generate every token asked for
    model.save_pretrained(out)
    with open(out / "training_loss.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import transformers

    info = dict(model=tm.MODEL_NAME, seed=args.seed, steps_run=step + 1, steps=args.steps,
                batch=args.batch, seq_len=args.seq_len, lr=args.lr, warmup=args.warmup,
                parameters=sum(p.numel() for p in model.parameters()),
                train_files=len(tm.corpus_files(False)), train_bytes=int(stream.numel()),
                held_out_files=len(tm.corpus_files(True)),
                held_out_rule=f"crc32(path relative to the stdlib) % {tm.HELD_OUT_MODULUS} == 0",
                python_version=platform.python_version(), torch_version=torch.__version__,
                transformers_version=transformers.__version__,
                device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                train_seconds=rows[-1]["elapsed_s"], final_held_out_loss=rows[-1]["held_out_loss"])
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
