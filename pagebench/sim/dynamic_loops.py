"""The step loops of :mod:`pagebench.sim.dynamic`: one for contiguous allocators, one for paging.

Both turn a workload into :class:`Window` records, each a run of steps over which memory changes
only by the one token every running sample adds per step, and a :class:`RunStats`. The model
(arrivals, growth, preemption, admission, recording, finishing, in that order each step) is
described in :mod:`pagebench.sim.dynamic`; its callers validate the inputs.

Each running request's samples hold ``token_base + t + 1`` tokens at step ``t``, with
``token_base = prompt_len - admission step``: one number per request describes its growth,
and the sum of those numbers (weighted by samples) describes all token states of a window.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pagebench.config import ceil_div
from pagebench.errors import ConfigError
from pagebench.sim.address_space import FirstFitSpace
from pagebench.sim.prefix_cache import PrefixBlockCache, PrefixNames
from pagebench.sim.static import reserved_slots
from pagebench.sim.trace import Workload

RUNNING_KEY_MOD = (1 << 61) - 1


class Window(NamedTuple):
    """Steps ``start..end`` (inclusive); token states at step ``t`` of it are
    ``token_base + running_seqs * (t + 1)``. Memory in token slots."""

    start: int
    end: int
    token_base: int
    running_seqs: int
    allocated: int  # held by running requests (paged: whole blocks plus the unusable remainder)
    final: int  # contiguous: slots the running requests will have filled when they finish
    external_frag: int
    free: int
    concurrency: int  # running requests
    waiting: int
    stranded_free: int  # contiguous: free slots outside the largest hole
    running_key: int


WINDOW_FIELDS = Window._fields


class PagedFinish(NamedTuple):
    """Heap entry: request ``request`` finishes at ``step`` unless preempted since (its
    ``version`` then no longer matches)."""

    step: int
    version: int
    request: int


class ContiguousFinish(NamedTuple):
    step: int
    request: int
    token_base: int


class Admission(NamedTuple):
    admitted_at: int
    token_base: int


def request_key(request: int, token_base: int) -> int:
    """Fingerprint of ``request`` holding ``token_base + t + 1`` tokens per sample at step
    ``t``; the sum over running requests (mod :data:`RUNNING_KEY_MOD`) names who runs how far."""
    return (((request + 1) * 0x9E3779B97F4A7C15)
            ^ ((token_base + (1 << 40)) * 0xBF58476D1CE4E5B9)) % RUNNING_KEY_MOD


@dataclass(slots=True)
class RunStats:
    """Counts of one run, for its summary row (the module doc of :mod:`pagebench.sim.dynamic`
    defines them)."""

    first_admit: np.ndarray  # step of each request's first admission
    refused: int = 0  # requests refused at the head of the queue at least once
    refused_with_enough_free: int = 0
    num_preemptions: int = 0
    recomputed_tokens: int = 0
    cow_copies: int = 0
    prefix_hit_tokens: int = 0
    prefix_blocks_saved: int = 0


@dataclass(slots=True)
class RunningTotals:
    """What the running requests hold together, as a :class:`Window` needs it."""

    token_base: int = 0
    running_seqs: int = 0
    concurrency: int = 0
    running_key: int = 0

    def add(self, request: int, token_base: int, samples: int, tokens: int) -> None:
        """``tokens``: the request's share of ``token_base`` (all samples; shared tokens once)."""
        self.token_base += tokens
        self.running_seqs += samples
        self.concurrency += 1
        self.running_key = (self.running_key + request_key(request, token_base)) % RUNNING_KEY_MOD

    def remove(self, request: int, token_base: int, samples: int, tokens: int) -> None:
        self.token_base -= tokens
        self.running_seqs -= samples
        self.concurrency -= 1
        self.running_key = (self.running_key - request_key(request, token_base)) % RUNNING_KEY_MOD


class ArrivalQueue:
    """What both step loops share: requests (sorted by ``arrival``) join ``waiting`` once their
    arrival step has come."""

    def enqueue_arrivals(self, step: int) -> None:
        arrival, count, nxt = self.arrival, self.count, self.next_arrival
        while nxt < count and arrival[nxt] <= step:
            self.waiting.append(nxt)
            nxt += 1
        self.next_arrival = nxt


class ContiguousSimulation(ArrivalQueue):
    """The contiguous step loop: one window per stretch of steps without admission or finish
    (between those events a contiguous allocator's memory only fills its reservations)."""

    def __init__(self, w: Workload, budget: int, allocator: str, max_len: int,
                 max_num_seqs: int | None):
        reserve = reserved_slots(allocator, w.length, max_len)
        if int((reserve * w.n).max()) > budget:
            i = int((reserve * w.n).argmax())
            raise ConfigError(f"budget_tokens: {budget} slots cannot hold request {i} under "
                              f"{allocator} ({int(w.n[i])} x {int(reserve[i])} slots)")
        self.max_num_seqs = max_num_seqs
        self.arrival, self.prompt = w.arrival.tolist(), w.prompt_len.tolist()
        self.output, self.samples = w.output_len.tolist(), w.n.tolist()
        self.final_len, self.reservation = w.length.tolist(), reserve.tolist()
        count = self.count = len(self.arrival)
        self.space = FirstFitSpace(budget)
        self.stats = RunStats(first_admit=np.full(count, -1, dtype=np.int64))
        self.refused = bytearray(count)
        self.refused_with_enough_free = bytearray(count)
        self.next_arrival = 0
        self.waiting: deque[int] = deque()
        self.finishing: list[ContiguousFinish] = []
        self.addresses: dict[int, list[int]] = {}
        self.records: list[Window] = []
        self.totals = RunningTotals()
        self.allocated = self.final = 0
        self.blocked_with_enough_free = False

    def run(self) -> tuple[list[Window], RunStats]:
        step = self.arrival[0]
        while True:
            self.enqueue_arrivals(step)
            self.admit_waiting(step)
            if not self.finishing:
                if self.waiting:  # cannot happen: an empty space fits any validated request
                    raise AssertionError("contiguous simulation stalled with an empty space")
                if self.next_arrival >= self.count:
                    break
            end = self.window_end()
            self.record(step, end)
            self.finish_at(end)
            if not self.finishing and not self.waiting and self.next_arrival >= self.count:
                break
            step = end + 1
        self.stats.refused = sum(self.refused)
        self.stats.refused_with_enough_free = sum(self.refused_with_enough_free)
        return self.records, self.stats

    def admit_waiting(self, step: int) -> None:
        """First come, first served, until the head of the queue does not fit."""
        self.blocked_with_enough_free = False
        waiting = self.waiting
        while waiting and self.admit(waiting[0], step):
            waiting.popleft()

    def admit(self, i: int, step: int) -> bool:
        """Reserve a run per sample of request ``i`` if they fit. Refused although the free
        slots add up to enough, it sets ``blocked_with_enough_free`` (external fragmentation)."""
        n, r = self.samples[i], self.reservation[i]
        if self.max_num_seqs is not None and self.totals.running_seqs + n > self.max_num_seqs:
            return False
        got = reserve_runs(self.space, n, r)
        if got is None:
            self.refused[i] = 1
            if self.space.free >= n * r:
                self.refused_with_enough_free[i] = 1
                self.blocked_with_enough_free = True
            return False
        self.addresses[i] = got
        self.stats.first_admit[i] = step
        b = self.prompt[i] - step
        heapq.heappush(self.finishing, ContiguousFinish(step + self.output[i] - 1, i, b))
        self.totals.add(i, b, n, n * b)
        self.allocated += n * r
        self.final += n * self.final_len[i]
        return True

    def window_end(self) -> int:
        """The last step before the next finish or arrival changes memory."""
        nxt = self.next_arrival
        end = self.finishing[0].step if self.finishing else self.arrival[nxt] - 1
        if nxt < self.count:
            end = min(end, self.arrival[nxt] - 1)
        return end

    def record(self, start: int, end: int) -> None:
        space, totals = self.space, self.totals
        ext = space.free if self.blocked_with_enough_free else 0  # no hole fits the head
        self.records.append(Window(start, end, totals.token_base, totals.running_seqs,
                                   self.allocated, self.final, ext, space.free - ext,
                                   totals.concurrency, len(self.waiting),
                                   space.free - space.largest_hole, totals.running_key))

    def finish_at(self, step: int) -> None:
        finishing = self.finishing
        while finishing and finishing[0].step == step:
            _, i, b = heapq.heappop(finishing)
            n, r = self.samples[i], self.reservation[i]
            for address in self.addresses.pop(i):
                self.space.release(address, r)
            self.totals.remove(i, b, n, n * b)
            self.allocated -= n * r
            self.final -= n * self.final_len[i]


def simulate_contiguous(w: Workload, budget: int, allocator: str, max_len: int,
                        max_num_seqs: int | None) -> tuple[list[Window], RunStats]:
    return ContiguousSimulation(w, budget, allocator, max_len, max_num_seqs).run()


def reserve_runs(space: FirstFitSpace, runs: int, size: int) -> list[int] | None:
    """Addresses of ``runs`` runs of ``size`` slots, or None (and nothing taken)."""
    got = []
    for _ in range(runs):
        address = space.allocate(size)
        if address is None:
            for taken in got:
                space.release(taken, size)
            return None
        got.append(address)
    return got


class PagedSimulation(ArrivalQueue):
    """The paged step loop. Blocks are counted, not named: ``free`` blocks in the pool,
    ``used`` blocks held by running requests or cached (prefix caching), and the cache's
    evictable blocks count as free memory.

    A sample with ``token_base % block_size == phase`` takes a block at the steps
    ``t = -phase mod block_size``, so ``phase_samples[phase]`` says how many blocks a step
    needs without visiting every request.
    """

    def __init__(self, w: Workload, budget: int, block_size: int, cow: bool,
                 max_num_seqs: int | None, prefix_caching: bool = False):
        bs = self.block_size = block_size
        self.num_blocks, self.remainder = divmod(budget, bs)
        shared = np.where(cow & (w.n > 1), w.prompt_len // bs, 0)  # prompt blocks shared by cow
        need_final = shared + w.n * ceil_div(w.length - shared * bs, bs)
        if self.num_blocks < 1 or int(need_final.max()) > self.num_blocks:
            i = int(need_final.argmax())
            raise ConfigError(f"budget_tokens: {budget} slots ({self.num_blocks} blocks of {bs}) "
                              f"cannot hold request {i} ({int(need_final[i])} blocks)")
        self.workload = w
        self.max_num_seqs = max_num_seqs
        self.arrival, self.samples = w.arrival.tolist(), w.n.tolist()
        self.shared_blocks = shared.tolist()
        # both change on preemption: the tokens so far become the prompt to recompute
        self.prompt, self.remaining = w.prompt_len.tolist(), w.output_len.tolist()
        count = self.count = len(self.arrival)
        self.stats = RunStats(first_admit=np.full(count, -1, dtype=np.int64))
        self.refused = bytearray(count)
        self.version = [0] * count
        self.next_arrival = 0
        self.waiting: deque[int] = deque()
        self.finishing: list[PagedFinish] = []
        self.running: dict[int, Admission] = {}  # insertion order = age
        self.phase_samples = [0] * bs
        self.records: list[Window] = []
        self.free, self.used = self.num_blocks, 0
        self.totals = RunningTotals()
        self.cache = PrefixBlockCache() if prefix_caching else None
        self.names = PrefixNames()
        self.block_keys: dict[int, list[int]] = {}  # request -> its full prompt blocks' keys
        self.held_keys: dict[int, list[int]] = {}  # running request -> cached blocks it holds

    def run(self) -> tuple[list[Window], RunStats]:
        running, waiting, finishing = self.running, self.waiting, self.finishing
        step = self.arrival[0]
        while True:
            self.enqueue_arrivals(step)
            if not (running and self.grow(step)) and waiting:
                self.admit_waiting(step)
            self.record(step)
            if finishing and finishing[0].step <= step:
                self.finish_due(step)
            if running or waiting:
                step += 1
            elif self.next_arrival < self.count:
                step = self.skip_idle(step)
            else:
                break
        self.check_no_leak()
        self.stats.refused = sum(self.refused)
        return self.records, self.stats

    def evictable(self) -> int:
        return self.cache.num_evictable if self.cache else 0

    def tokens(self, i: int, token_base: int) -> int:
        """Request ``i``'s share of the window's ``token_base`` (cow-shared prompt blocks once)."""
        n = self.samples[i]
        return n * token_base - (n - 1) * self.shared_blocks[i] * self.block_size

    def blocks_for(self, i: int, tokens_per_sample: int) -> int:
        bs, sh = self.block_size, self.shared_blocks[i]
        return sh + self.samples[i] * ceil_div(tokens_per_sample - sh * bs, bs)

    def grow(self, step: int) -> bool:
        """Give a new block to every sample whose last block is full, preempting the newest
        requests while the pool (cache evictions included) cannot; True if any was."""
        due = (-step) % self.block_size
        need = self.phase_samples[due]
        if not need:
            return False
        preempted = False
        while need > self.free + self.evictable():
            i, admission = self.running.popitem()  # newest
            self.preempt(i, admission, step)
            if admission.token_base % self.block_size == due:
                need -= self.samples[i]
            preempted = True
        if need > self.free:
            self.cache.evict(need - self.free)
            self.free = need
        self.free -= need
        self.used += need
        return preempted

    def preempt(self, i: int, admission: Admission, step: int) -> None:
        """Free request ``i``'s blocks (it held ``token_base + step`` tokens per sample) and put
        it at the front of the queue to recompute them."""
        b = admission.token_base
        self.release(i, b, b + step)
        done = step - admission.admitted_at
        self.prompt[i] += done
        self.remaining[i] -= done
        self.version[i] += 1
        self.waiting.appendleft(i)
        self.stats.num_preemptions += 1
        self.stats.recomputed_tokens += self.tokens(i, b + step)

    def release(self, i: int, token_base: int, tokens_per_sample: int) -> None:
        """Give back what running request ``i`` holds; its cached blocks stay in the cache."""
        held = self.blocks_for(i, tokens_per_sample)
        if self.cache:
            keys = self.held_keys.pop(i)
            held -= len(keys)
            self.used -= self.cache.release(keys)
        self.free += held
        self.used -= held
        self.phase_samples[token_base % self.block_size] -= self.samples[i]
        self.totals.remove(i, token_base, self.samples[i], self.tokens(i, token_base))

    def admit_waiting(self, step: int) -> None:
        """First come, first served, until the head of the queue does not fit."""
        waiting = self.waiting
        while waiting and self.admit(waiting[0], step):
            waiting.popleft()

    def admit(self, i: int, step: int) -> bool:
        """Admit request ``i`` with its prompt and first output token if it fits."""
        n = self.samples[i]
        if self.max_num_seqs is not None and self.totals.running_seqs + n > self.max_num_seqs:
            return False
        blocks = self.blocks_for(i, self.prompt[i] + 1)
        if self.cache:
            blocks = self.take_cached_prefix(i, blocks)
            if blocks is None:
                self.refused[i] = 1
                return False
        elif blocks > self.free:
            self.refused[i] = 1
            return False
        self.free -= blocks
        self.used += blocks
        b = self.prompt[i] - step
        self.running[i] = Admission(step, b)
        self.phase_samples[b % self.block_size] += n
        self.totals.add(i, b, n, self.tokens(i, b))
        heapq.heappush(self.finishing,
                       PagedFinish(step + self.remaining[i] - 1, self.version[i], i))
        stats = self.stats
        if stats.first_admit[i] < 0:
            stats.first_admit[i] = step
            if self.shared_blocks[i] and (self.prompt[i] % self.block_size):
                stats.cow_copies += n - 1
        return True

    def take_cached_prefix(self, i: int, blocks: int) -> int | None:
        """Prefix caching: reference the leading cached blocks of request ``i``'s prompt and
        register the rest, evicting as needed; the blocks still to take from the pool, or None
        (nothing changed) if even evicting every unreferenced block leaves too few."""
        bs, cache = self.block_size, self.cache
        prompt = self.prompt[i]
        keys = self.block_keys.get(i)
        if keys is None:
            hash_ids = self.workload.hash_ids
            keys = self.block_keys[i] = self.names.block_keys(
                hash_ids[i] if hash_ids else None, prompt, bs)
        hits, revived = cache.match(keys, (prompt - 1) // bs)
        if blocks - hits > self.free + cache.num_evictable - revived:
            return None
        cache.acquire(keys, hits)
        self.used += revived
        blocks -= hits
        if blocks > self.free:
            cache.evict(blocks - self.free)
            self.free = blocks
        self.held_keys[i] = keys[:hits] + cache.register(keys[hits:])
        self.stats.prefix_blocks_saved += hits
        if self.stats.first_admit[i] < 0:
            self.stats.prefix_hit_tokens += hits * bs
        return blocks

    def record(self, step: int) -> None:
        cache, totals, bs = self.cache, self.totals, self.block_size
        shared = cache.shared_extra * bs if cache else 0  # shared tokens count once
        evictable = cache.num_evictable if cache else 0  # cached, unreferenced: reclaimable
        self.records.append(Window(step, step, totals.token_base - shared, totals.running_seqs,
                                   self.used * bs + self.remainder, 0, 0,
                                   (self.free + evictable) * bs, totals.concurrency,
                                   len(self.waiting), 0, totals.running_key))

    def finish_due(self, step: int) -> None:
        """Requests that produced their last token at ``step`` release their memory."""
        finishing, version = self.finishing, self.version
        while finishing and finishing[0].step <= step:
            _, v, i = heapq.heappop(finishing)
            if v != version[i]:
                continue  # preempted since; its new finish step is in the heap too
            b = self.running.pop(i).token_base
            self.release(i, b, b + step + 1)
            if self.cache:
                del self.block_keys[i]  # finished for good: its keys are never matched again

    def skip_idle(self, step: int) -> int:
        """Nothing runs or waits: one window of empty memory up to the next arrival."""
        arrival = self.arrival[self.next_arrival]
        if arrival > step + 1:
            self.records.append(Window(step + 1, arrival - 1, 0, 0, self.remainder, 0, 0,
                                       self.num_blocks * self.block_size, 0, 0, 0, 0))
        return arrival

    def check_no_leak(self) -> None:
        cached = self.evictable()
        cache = self.cache
        if self.used or self.free + cached != self.num_blocks or (
                cache and cache.num_cached != cached):
            raise AssertionError(f"paged simulation leaked blocks: used={self.used}, "
                                 f"free={self.free}, cached={cached}")


def simulate_paged(w: Workload, budget: int, block_size: int, cow: bool,
                   max_num_seqs: int | None,
                   prefix_caching: bool = False) -> tuple[list[Window], RunStats]:
    """One window per step (plus one per idle gap)."""
    return PagedSimulation(w, budget, block_size, cow, max_num_seqs, prefix_caching).run()
