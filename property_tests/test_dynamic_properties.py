"""Properties of the time-stepped memory simulator (pagebench.sim.dynamic).

The simulator computes tokens in closed form, tracks paged block needs with a phase histogram and
skips quiet steps of contiguous runs. The reference model below does the same policy the slow,
obvious way (per request, per step, a bitmap for the address space) and must agree exactly.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pagebench.sim.dynamic import CATEGORIES, run_dynamic, simulate_allocator
from pagebench.sim.static import reserved_slots
from pagebench.sim.trace import Workload

MAX_LEN = 48


@st.composite
def scenarios(draw):
    count = draw(st.integers(1, 14))
    gaps = draw(st.lists(st.integers(0, 4), min_size=count, max_size=count))
    prompts = draw(st.lists(st.integers(1, 20), min_size=count, max_size=count))
    outputs = draw(st.lists(st.integers(1, 20), min_size=count, max_size=count))
    ns = draw(st.lists(st.integers(1, 3), min_size=count, max_size=count))
    w = Workload(np.cumsum(gaps), np.array(prompts), np.array(outputs), np.array(ns))
    block_size = draw(st.integers(1, 8))
    need = int(max((w.n * MAX_LEN).max(),
                   (w.n * (-(-w.length // block_size)) * block_size).max()))
    budget = need + draw(st.integers(0, 3 * MAX_LEN))
    return w, budget, block_size, draw(st.booleans())


def reference(w, budget, allocator, bs=None, cow=False):
    """Per-step rows (dicts) of the documented model, computed request by request."""
    paged = allocator == "paged"
    arrival, P, OUT, N = (a.tolist() for a in (w.arrival, w.prompt_len, w.output_len, w.n))
    count = len(arrival)
    shared = [P[i] // bs if paged and cow and N[i] > 1 else 0 for i in range(count)]
    reserve = reserved_slots(allocator, w.length, MAX_LEN).tolist() if not paged else None
    num_blocks = budget // bs if paged else 0
    cells = [False] * budget  # contiguous address space
    prompt, out = list(P), [0] * count
    waiting, running, rows, nxt, s = [], {}, [], 0, arrival[0]

    def blocks(i, toks):
        return shared[i] + N[i] * -(-(toks - shared[i] * bs) // bs)

    def physical(i, toks):
        return N[i] * toks - (N[i] - 1) * shared[i] * (bs or 0)

    def first_fit(size):
        run = 0
        for address, used in enumerate(cells):
            run = 0 if used else run + 1
            if run == size:
                return address - size + 1
        return None

    while nxt < count or waiting or running:
        while nxt < count and arrival[nxt] <= s:
            waiting.append(nxt)
            nxt += 1
        preempted = False
        if paged and running:
            while True:
                used = sum(blocks(i, r["toks"]) for i, r in running.items())
                grow = sum(blocks(i, r["toks"] + 1) - blocks(i, r["toks"])
                           for i, r in running.items())
                if grow <= num_blocks - used:
                    break
                victim = list(running)[-1]
                prompt[victim] = running.pop(victim)["toks"]
                waiting.insert(0, victim)
                preempted = True
        for r in running.values():
            r["toks"] += 1
        for i in running:
            out[i] += 1
        blocked_with_enough_free = False
        while waiting and not preempted:
            i = waiting[0]
            if paged:
                used = sum(blocks(j, r["toks"]) for j, r in running.items())
                if blocks(i, prompt[i] + 1) > num_blocks - used:
                    break
                running[i] = {"toks": prompt[i] + 1}
            else:
                got = []
                for _ in range(N[i]):
                    address = first_fit(reserve[i])
                    if address is None:
                        break
                    cells[address:address + reserve[i]] = [True] * reserve[i]
                    got.append(address)
                if len(got) < N[i]:
                    for address in got:
                        cells[address:address + reserve[i]] = [False] * reserve[i]
                    blocked_with_enough_free = cells.count(False) >= N[i] * reserve[i]
                    break
                running[i] = {"toks": prompt[i] + 1, "addresses": got}
            waiting.pop(0)
            out[i] += 1
        tokens = sum(physical(i, r["toks"]) for i, r in running.items())
        if paged:
            allocated = sum(blocks(i, r["toks"]) for i, r in running.items()) * bs
            row = dict(token_state=tokens, reserved_unused=0,
                       internal_frag=allocated - tokens + budget % bs, external_frag=0,
                       free=budget - allocated - budget % bs)
        else:
            final = sum(N[i] * (P[i] + OUT[i]) for i in running)
            free = cells.count(False)
            ext = free if blocked_with_enough_free else 0
            row = dict(token_state=tokens, reserved_unused=final - tokens,
                       internal_frag=budget - free - final, external_frag=ext, free=free - ext)
        rows.append(dict(step=s, concurrency=len(running), waiting=len(waiting), **row))
        for i in [i for i in running if out[i] == OUT[i]]:
            for address in running.pop(i).get("addresses", []):
                cells[address:address + reserve[i]] = [False] * reserve[i]
        s += 1
        if not running and not waiting and nxt < count:
            for idle in range(s, arrival[nxt]):
                rows.append(dict(step=idle, concurrency=0, waiting=0, token_state=0,
                                 reserved_unused=0, internal_frag=budget % bs if paged else 0,
                                 external_frag=0, free=budget - (budget % bs if paged else 0)))
            s = max(s, arrival[nxt])
    return rows


def plans(block_size):
    return [("naive", None), ("pow2", None), ("oracle", None), ("paged", block_size)]


@given(scenarios())
def test_matches_the_per_step_reference_model(case):
    w, budget, bs, cow = case
    for allocator, b in plans(bs):
        _, cols = simulate_allocator(w, budget, allocator, b, max_len=MAX_LEN, cow=cow)
        expected = reference(w, budget, allocator, b, cow)
        for key in ("step", "concurrency", "waiting") + CATEGORIES:
            assert cols[key].tolist() == [r[key] for r in expected], (allocator, key)


@given(scenarios())
def test_breakdown_sums_to_budget_and_paged_has_no_external_fragmentation(case):
    w, budget, bs, cow = case
    result = run_dynamic(w, budget, block_sizes=(bs,), max_len=MAX_LEN, cow=cow,
                         timeline_every=1)
    cols = result.timeline_columns
    total = sum(cols[c] for c in CATEGORIES)
    assert (total == budget).all()
    assert all((cols[c] >= 0).all() for c in CATEGORIES)
    paged = cols["allocator"] == "paged"
    assert (cols["external_frag"][paged] == 0).all()
    assert (cols["reserved_unused"][paged] == 0).all()
    tail = cols["internal_frag"][paged] - budget % bs
    assert (tail <= cols["running_seqs"][paged] * (bs - 1)).all()
    for row in result.summary:
        parts = [row[k] for k in ("token_state_fraction", "reserved_unused_fraction",
                                  "internal_fragmentation_fraction",
                                  "external_fragmentation_fraction", "free_fraction")]
        assert abs(sum(parts) - 1.0) < 1e-9
        if row["allocator"] == "paged":
            assert row["external_fragmentation_fraction"] == 0
            assert row["refused_with_enough_free"] == 0
        # every request completes: generated tokens / steps is the throughput
        assert round(row["tokens_per_step"] * row["num_steps"]) == int((w.output_len * w.n).sum())


@given(scenarios(), st.booleans())
def test_paged_utilisation_at_least_oracle_minus_tail_when_holding_the_same_requests(case, roomy):
    w, budget, bs, cow = case
    if roomy:  # nothing is ever refused: both hold the same requests at every step
        budget = int((w.n * (w.length + bs)).sum())
    oracle, o = simulate_allocator(w, budget, "oracle", max_len=MAX_LEN, with_running_key=True)
    paged, p = simulate_allocator(w, budget, "paged", bs, max_len=MAX_LEN,
                                  with_running_key=True)
    o_at = {step: i for i, step in enumerate(o["step"].tolist())}
    matched = 0
    for j, step in enumerate(p["step"].tolist()):
        i = o_at.get(step)
        if i is None or o["running_key"][i] != p["running_key"][j] or not p["concurrency"][j]:
            continue
        assert o["token_state"][i] == p["token_state"][j]
        tokens = int(p["token_state"][j])
        paged_held = tokens + int(p["internal_frag"][j]) - budget % bs
        oracle_held = tokens + int(o["reserved_unused"][i]) + int(o["internal_frag"][i])
        tail = int(p["running_seqs"][j]) * (bs - 1)
        assert tokens / paged_held >= tokens / (oracle_held + tail) - 1e-12
        matched += 1
    if roomy:
        assert matched == int((p["concurrency"] > 0).sum()) == int((o["concurrency"] > 0).sum())


@given(scenarios(), st.integers(0, 3))
def test_deterministic_for_a_seed(case, seed):
    from pagebench.sim.trace import poisson_workload

    w, budget, bs, cow = case
    a = run_dynamic(w, budget, block_sizes=(bs,), max_len=MAX_LEN, cow=cow)
    b = run_dynamic(w, budget, block_sizes=(bs,), max_len=MAX_LEN, cow=cow)
    assert a.summary == b.summary
    assert all((a.timeline_columns[k] == b.timeline_columns[k]).all() for k in a.timeline_columns)
    p1 = poisson_workload(50, 2.0, "uniform:2,40", seed=seed, max_len=MAX_LEN)
    p2 = poisson_workload(50, 2.0, "uniform:2,40", seed=seed, max_len=MAX_LEN)
    assert all((getattr(p1, f) == getattr(p2, f)).all()
               for f in ("arrival", "prompt_len", "output_len", "n"))
