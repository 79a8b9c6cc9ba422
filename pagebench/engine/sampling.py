"""Sampling parameters, request outputs, and the sampler.

Seeding rule: completion ``i`` of a request whose ``seed`` is ``s`` draws its noise from its own
``torch.Generator`` seeded with ``s + i``, one vector of ``vocab_size`` uniforms per sampled
token. So completion ``i`` of an ``n = 4`` request equals the single completion of an ``n = 1``
request with ``seed = s + i``, whatever else is in the batch. Sampling is the exponential race
(``argmax(p / E)`` with ``E ~ Exp(1)``), which draws exactly from ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np
import torch

from pagebench.errors import ConfigError, check_positive_int


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Per-request sampling settings, checked once when built and immutable after (build
    another with ``dataclasses.replace``). Integers and reals may be numpy scalars."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        def store(name, value):
            object.__setattr__(self, name, value)

        store("max_tokens", check_positive_int("max_tokens", self.max_tokens))
        store("n", check_positive_int("n", self.n))
        if not _real(self.temperature) or not self.temperature >= 0:
            raise ConfigError(f"temperature: must be >= 0, got {self.temperature!r}")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        store("temperature", float(self.temperature))
        store("top_p", float(self.top_p))
        if self.seed is not None:
            if isinstance(self.seed, (bool, np.bool_)) or not isinstance(self.seed, Integral):
                raise ConfigError(f"seed: must be an integer or None, got {self.seed!r}")
            store("seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _real(x) -> bool:
    return isinstance(x, Real) and not isinstance(x, (bool, np.bool_))


@dataclass(slots=True)
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "length" or "stop"


@dataclass(slots=True)
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


def make_generator(seed: int | None, index: int, device) -> torch.Generator | None:
    """The generator of completion ``index`` (see the module's seeding rule)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed((seed + index) % 2**63)
    return gen


def exponential_race(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """``p / E`` with ``E = -log(u) ~ Exp(1)`` for uniforms ``u`` in [0, 1): its argmax is a
    draw from ``p``. ``E`` is never 0 (``u < 1``); a draw of exactly 0 (2^-24 per element for
    float32) gives ``E = inf``, so that token loses the race rather than winning it whatever
    its probability."""
    return probs / -torch.log(uniform)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``logits`` [rows, vocab]; greedy rows take the argmax. The tokens
    are drawn on the logits' device; reading them is the step's one device-to-host copy."""
    return sample_on_device(logits, params, generators).tolist()


def sample_on_device(logits: torch.Tensor, params: list[SamplingParams],
                     generators: list[torch.Generator | None]) -> torch.Tensor:
    """``sample`` without the copy: the tokens [rows] int64, on the logits' device. Reads
    nothing back from the device: what differs between rows comes from ``params``."""
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    dev = logits.device
    # temperature and top_p of the sampled rows, in one copy to the device
    settings = torch.tensor([[params[i].temperature for i in rows],
                             [params[i].top_p for i in rows]],
                            dtype=torch.float32).to(dev, non_blocking=True)
    temp, top_p = settings[0].clamp_min(torch.finfo(torch.float32).tiny), settings[1]
    every = len(rows) == len(params)
    index = None if every else torch.tensor(rows).to(dev, non_blocking=True)
    # shifted to max 0 first: a tiny temperature then sends the rest to -inf, never the top to
    # +inf (inf - inf would be NaN), so it acts as greedy
    shifted = (logits if every else logits[index]).float()
    shifted = shifted - shifted.amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted / temp[:, None], dim=-1)
    if any(params[i].top_p < 1 for i in rows):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) > top_p[:, None]  # keeps at least the top
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    noise = torch.stack([torch.rand(probs.shape[-1], generator=generators[i], device=dev)
                         for i in rows])
    race = exponential_race(probs, noise)
    if every:
        return race.argmax(dim=-1)
    tokens[index] = race.argmax(dim=-1)
    return tokens
