"""KV-cache geometry: how many bytes one token and one block of KV cache take.

Built from a transformers config (a ``PretrainedConfig``, a dict, or a local ``config.json``)
or from a built-in preset holding a model's published config values.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

from pagebench.errors import ConfigError, check_positive_int

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
    "int8": 1,
}

# Published config.json values of common decoder models (attention-relevant fields plus what
# is needed to build a random-weight model of the same shape).
PRESETS: dict[str, dict] = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2", num_hidden_layers=24, hidden_size=896, intermediate_size=4864,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", num_hidden_layers=28, hidden_size=3584, intermediate_size=18944,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    "llama-3-8b": dict(
        model_type="llama", num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "llama-3-70b": dict(
        model_type="llama", num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
        num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "mistral-7b": dict(
        model_type="mistral", num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
}
ALIASES = {
    "qwen2.5-0.5b-instruct": "qwen2.5-0.5b", "qwen/qwen2.5-0.5b": "qwen2.5-0.5b",
    "qwen/qwen2.5-0.5b-instruct": "qwen2.5-0.5b", "qwen2.5-7b-instruct": "qwen2.5-7b",
    "llama3-8b": "llama-3-8b", "meta-llama-3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b", "meta-llama-3-70b": "llama-3-70b",
    "mistral-7b-v0.3": "mistral-7b",
}


def dtype_name(dtype) -> str:
    """A torch dtype's name as results and messages spell it ("bfloat16"); a name as it is."""
    return str(dtype).removeprefix("torch.")


def dtype_bytes(dtype) -> int:
    """Bytes per element of a dtype given as a name ("bf16") or a torch dtype."""
    name = dtype_name(dtype).lower()
    if name not in DTYPE_BYTES:
        raise ConfigError(f"dtype: unknown dtype {dtype!r}; known: {sorted(set(DTYPE_BYTES))}")
    return DTYPE_BYTES[name]


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Shape of one model's KV cache. ``bytes_per_token`` counts K and V over every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_q_heads: int
    dtype: str = "bfloat16"
    name: str = "custom"

    def __post_init__(self):
        for field in ("num_layers", "num_kv_heads", "head_dim", "num_q_heads"):
            check_positive_int(field, getattr(self, field))
        if self.num_q_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_q_heads: {self.num_q_heads} is not a multiple of num_kv_heads "
                f"{self.num_kv_heads}")
        dtype_bytes(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * check_positive_int("block_size", block_size)

    def per_rank(self, tensor_parallel_size: int) -> KVGeometry:
        """The share of one rank under tensor parallelism over attention heads.

        Each rank holds ``num_q_heads / tp`` query heads and ``num_kv_heads / tp`` KV heads;
        when tp exceeds the KV heads, each KV head is replicated on ``tp / num_kv_heads`` ranks
        (one head per rank), as vLLM does.
        """
        tp = check_positive_int("tensor_parallel_size", tensor_parallel_size)
        if self.num_q_heads % tp:
            raise ConfigError(f"tensor_parallel_size: {tp} does not divide the "
                              f"{self.num_q_heads} query heads")
        if (self.num_kv_heads % tp) if tp <= self.num_kv_heads else (tp % self.num_kv_heads):
            raise ConfigError(f"tensor_parallel_size: {tp} neither divides the "
                              f"{self.num_kv_heads} KV heads nor is a multiple of them")
        return KVGeometry(self.num_layers, max(1, self.num_kv_heads // tp), self.head_dim,
                          self.num_q_heads // tp, self.dtype, self.name)

    def kv_replication(self, tensor_parallel_size: int) -> int:
        """Ranks holding a copy of each KV head (1 unless tp exceeds the KV heads)."""
        return max(1, tensor_parallel_size // self.num_kv_heads)

    def with_dtype(self, dtype) -> KVGeometry:
        return KVGeometry(self.num_layers, self.num_kv_heads, self.head_dim, self.num_q_heads,
                          dtype_name(dtype), self.name)

    def to_dict(self) -> dict:
        return asdict(self) | {"bytes_per_token": self.bytes_per_token}

    @classmethod
    def from_config(cls, config, dtype=None, name: str | None = None) -> KVGeometry:
        """From a transformers ``PretrainedConfig``, a dict, or a path to ``config.json``."""
        if isinstance(config, (str, os.PathLike)):
            path = config_json_path(config)
            config = read_config_json(path, "config")
            name = name or os.path.basename(os.path.dirname(os.path.abspath(path))) or "custom"
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        cfg = get("text_config") or config  # multimodal wrappers keep the decoder here
        if cfg is not config:
            get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        if get("kv_lora_rank"):  # DeepSeek's multi-head latent attention
            raise ConfigError("config: multi-head latent attention (kv_lora_rank) caches one "
                              "compressed latent per token, not K and V per head; not modelled")
        try:
            layers = int(get("num_hidden_layers"))
            q_heads = int(get("num_attention_heads"))
            if q_heads < 1:  # checked here: head_dim below divides by it
                raise ValueError(f"num_attention_heads must be >= 1, got {q_heads}")
            kv_heads = int(get("num_key_value_heads") or q_heads)
            head_dim = get("head_dim") or int(get("hidden_size")) // q_heads
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config: missing or invalid attention fields ({e})") from e
        if dtype is None:
            # transformers 5 names it dtype; a config.json of older versions torch_dtype
            # (reading that attribute off a transformers 5 config prints a deprecation warning)
            old = get("torch_dtype") if isinstance(cfg, dict) else None
            dtype = get("dtype") or old or "bfloat16"
        return cls(layers, kv_heads, int(head_dim), q_heads,
                   dtype_name(dtype), name or get("model_type") or "custom")

    @classmethod
    def from_name(cls, name: str, dtype=None) -> KVGeometry:
        """A preset by name (case-insensitive), or a path to a local config.

        ``dtype=None`` takes the config's own dtype (presets: bfloat16).
        """
        key = preset_key(name)
        if key in PRESETS:
            return cls.from_config(PRESETS[key], dtype=dtype, name=key)
        if os.path.exists(name):
            return cls.from_config(name, dtype=dtype)
        raise unknown_model(name)


def unknown_model(name) -> ConfigError:
    """The error for a model that is neither a preset nor an existing path: "not found" for a
    name that looks like a path."""
    name = str(name)
    if "/" in name or os.sep in name or name.endswith(".json"):
        return ConfigError(f"model: {name} not found (a preset, or a config.json or its "
                           "directory)")
    return ConfigError(f"model: unknown model {name!r}; presets: {', '.join(PRESETS)} "
                       "(or give a path to a config.json)")


def preset_key(name: str) -> str:
    """The PRESETS key a model name (any case, or an alias) stands for."""
    return ALIASES.get(name.lower(), name.lower())


def config_json_path(path) -> str:
    """``path`` itself, or the ``config.json`` inside it when it is a folder."""
    path = os.fspath(path)
    return os.path.join(path, "config.json") if os.path.isdir(path) else path


def read_config_json(path: str, arg: str) -> dict:
    """A model's config.json as a dict; unreadable or malformed: ConfigError naming ``arg``."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{arg}: cannot read {path}: {e}") from e


def preset_config(name: str, **overrides):
    """A transformers config object for a preset, for building a random-weight model."""
    from transformers import AutoConfig

    key = preset_key(name)
    if key not in PRESETS:
        raise ConfigError(f"model: unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    values = dict(PRESETS[key]) | overrides
    return AutoConfig.for_model(values.pop("model_type"), **values)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def parse_bytes(text) -> int:
    """'16GiB', '16 GB', '1.5e9', 12345 -> bytes. GiB/MiB are binary, GB/MB decimal."""
    if isinstance(text, (int, float)):
        value = text
    else:
        s = str(text).strip().replace(" ", "").replace("_", "")
        units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
                 "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1}
        mult = 1
        for unit, factor in units.items():
            if s.lower().endswith(unit):
                s, mult = s[: -len(unit)], factor
                break
        try:
            value = float(s) * mult
        except ValueError:
            raise ConfigError(f"bytes: cannot parse {text!r} (try 16GiB, 800MB or 1e9)") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"bytes: must be a finite non-negative size, got {text!r}")
    return int(value)
