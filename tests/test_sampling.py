"""The sampler: equal, draw for draw, to the host-synchronising sampler it replaced (kept here
as the reference), and what the seeding rule promises."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pagebench.engine.sampling import (SamplingParams, exponential_race, make_generator, sample,
                                      sample_on_device)


def reference_sample(logits, params, generators):
    """The previous sampler: reads ``(top_p < 1).any()`` back from the device."""
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        index = torch.tensor(rows, device=logits.device)
        temp = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32,
                            device=logits.device).clamp_min(torch.finfo(torch.float32).tiny)
        shifted = logits[index].float()
        shifted = shifted - shifted.amax(dim=-1, keepdim=True)
        probs = torch.softmax(shifted / temp[:, None], dim=-1)
        top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device)
        if (top_p < 1).any():
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = (sorted_p.cumsum(-1) - sorted_p) > top_p[:, None]
            probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        noise = torch.stack([torch.rand(probs.shape[-1], generator=generators[i],
                                        device=logits.device) for i in rows])
        race = probs / -torch.log(noise)
        tokens[index] = race.argmax(dim=-1)
    return tokens.tolist()


row_params = st.builds(SamplingParams,
                       temperature=st.sampled_from([0.0, 0.0, 1e-30, 0.5, 1.0, 1, 1.7]),
                       top_p=st.sampled_from([1.0, 1, 0.9, 0.3, 0.01]),
                       seed=st.integers(0, 2**40))


@given(params=st.lists(row_params, min_size=1, max_size=6), vocab=st.integers(2, 300),
       data_seed=st.integers(0, 2**31))
def test_sampler_equals_previous_sampler(params, vocab, data_seed):
    logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(data_seed)) * 3

    def gens():
        return [make_generator(p.seed, i, "cpu") if not p.greedy else None
                for i, p in enumerate(params)]

    assert sample(logits, params, gens()) == reference_sample(logits.clone(), params, gens())


def test_greedy_rows_take_the_argmax_and_stay_on_the_device():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, -1.0, 0.0]])
    tokens = sample_on_device(logits, [SamplingParams(), SamplingParams()], [None, None])
    assert tokens.dtype == torch.int64 and tokens.tolist() == [1, 0]


def test_a_uniform_draw_of_zero_loses_the_race():
    # torch.rand gives exactly 0 with probability 2^-24 per element: at a 152k vocabulary ~0.9%
    # of sampled tokens. E = -log1p(-u) made E = 0 there, and that token won whatever its p
    probs = torch.tensor([[1 - 1e-9, 1e-9], [1e-9, 1 - 1e-9]])
    uniform = torch.tensor([[0.5, 0.0], [0.0, 0.5]])  # the unlikely token draws 0
    assert exponential_race(probs, uniform).argmax(-1).tolist() == [0, 1]


def test_the_race_draws_from_p():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    draws = 40_000
    uniform = torch.rand(draws, 4, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(exponential_race(probs, uniform).argmax(-1), minlength=4).double()
    sigma = (draws * probs * (1 - probs)).sqrt()
    assert counts[3] == 0 and ((counts - draws * probs).abs() <= 5 * sigma + 1e-9).all(), counts


def test_tiny_top_p_keeps_only_the_top_token():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]]).repeat(20, 1)
    params = [SamplingParams(temperature=1.0, top_p=1e-6, seed=s) for s in range(20)]
    gens = [make_generator(p.seed, 0, "cpu") for p in params]
    assert sample(logits, params, gens) == [1] * 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampler_equals_previous_sampler_gpu():
    params = [SamplingParams(temperature=t, top_p=p, seed=7)
              for t, p in ((0.0, 1.0), (0.8, 0.9), (1.0, 1.0), (1.3, 0.5))]
    logits = torch.randn(len(params), 1000, device="cuda")

    def gens():
        return [make_generator(p.seed, i, "cuda") if not p.greedy else None
                for i, p in enumerate(params)]

    assert sample(logits, params, gens()) == reference_sample(logits.clone(), params, gens())
