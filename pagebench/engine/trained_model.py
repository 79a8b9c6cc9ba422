"""The small trained model shipped with pagebench, its byte-level vocabulary and its text.

A Llama-shaped decoder of about 2.8 million parameters (:data:`CONFIG`), trained by
``scripts/train_tiny_model.py`` on the Python standard library's ``.py`` sources: text every
machine with Python has, so nothing is downloaded. Its vocabulary is the 256 byte values plus
:data:`SPECIALS`, so it needs no tokenizer. The weights (bf16 safetensors) live in
:data:`MODEL_DIR` beside a ``config.json`` and load through
:func:`pagebench.engine.engine.load_model`, the path a user's checkpoint takes.

Random weights measure near-ties, not quality; this model has real structure (held-out
perplexity far below the vocabulary's 260), so an fp8 cache's effect on its predictions is a
measurement (:mod:`pagebench.measure.kv_accuracy`).

Train and held-out files are fixed by a rule on each file's path relative to the standard
library (:func:`is_held_out`), not by Python's version: a file held out on one version is held
out on every version that has it.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

MODEL_NAME = "pagebench-tiny-llama"
MODEL_DIR = Path(__file__).resolve().parent.parent / "data" / "models" / MODEL_NAME
BOS, EOS, PAD = 256, 257, 258
SPECIALS = (BOS, EOS, PAD)
VOCAB_SIZE = 260  # bytes, the specials and one spare id
# the Llama config the training script builds (transformers.LlamaConfig keywords)
CONFIG = dict(vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
HELD_OUT_MODULUS = 20  # one file in 20 is held out


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str) -> bool:
    """Whether a standard-library file (its path relative to the library, '/'-separated) is
    held out: CRC-32 of the path ≡ 0 mod :data:`HELD_OUT_MODULUS`."""
    return zlib.crc32(relative_path.encode()) % HELD_OUT_MODULUS == 0


def corpus_files(held_out: bool, root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files of one split, sorted by relative path (installed
    packages under ``site-packages`` left out)."""
    root = root or stdlib_dir()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel.split("/") or is_held_out(rel) != held_out:
            continue
        files.append(path)
    return files


def encode(text: str) -> list[int]:
    """UTF-8 bytes as token ids."""
    return list(text.encode("utf-8"))


def windows(num: int, length: int, held_out: bool = True, root: Path | None = None
            ) -> list[list[int]]:
    """``num`` token windows of ``length`` tokens, each :data:`BOS` then the start of a file of
    the split (the files long enough, in path order, every k-th so the windows spread over the
    library): deterministic for one Python installation."""
    if num < 1 or length < 2:
        raise ValueError(f"num, length: expected >= 1 and >= 2, got {num}, {length}")
    texts = []
    for path in corpus_files(held_out, root):
        data = path.read_bytes()
        if len(data) >= length - 1:
            texts.append(data)
    if len(texts) < num:
        raise ValueError(f"num: {num} windows of {length} tokens asked, the split has "
                         f"{len(texts)} files that long")
    step = len(texts) // num
    return [[BOS, *texts[i * step][:length - 1]] for i in range(num)]


def load(dtype=None, device=None, path=None):
    """The shipped model (or a retrained one in ``path``), through
    :func:`pagebench.engine.engine.load_model`."""
    from pagebench.engine.engine import load_model

    return load_model(str(path or MODEL_DIR), dtype=dtype, device=device)
