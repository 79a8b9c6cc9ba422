"""Continuous batching over a paged KV cache: token budget, chunked prefill, preemption.

A ``Sequence`` holds the request side of one completion: its prompt and sampled tokens, its
sampling state, how it finished. The KV side (block table, the tokens that have a cache slot,
how many are computed) lives in the block manager alone, which hands each step's view back as
``KVBlocks`` (``ScheduledBatch.blocks``). A step gives each scheduled sequence its next
uncomputed tokens: the newly sampled one for a decoding sequence, a chunk of its prompt
(bounded by the token budget) for a prefilling one. When a decoding sequence needs a new block
and the pool is dry, the most recently admitted running sequence is preempted by recompute:
its blocks are freed and it goes back to the front of the waiting queue, to be prefilled again
(prompt + output so far).

With prefix caching, the full blocks a step will fill become findable as it is scheduled, so a
request admitted later in the same step reuses them (see ``block_manager``). That is sound
because a sequence scheduled in a step is never preempted in that step: victims are taken from
the back of the running list, behind the sequence being scheduled, and nothing is admitted
in a step that preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pagebench.engine.block_manager import BlockManager, KVBlocks
from pagebench.engine.sampling import SamplingParams
from pagebench.errors import OutOfBlocksError, check_positive_int


class Sequence:
    """One completion of one request: its tokens (prompt, then sampled), its sampling state."""

    __slots__ = ("seq_id", "request_id", "index", "params", "generator", "token_ids",
                 "prompt_len", "finish_reason", "forked", "num_admissions")

    def __init__(self, seq_id, request_id: int, index: int, prompt: list[int],
                 params: SamplingParams, generator):
        self.seq_id = seq_id
        self.request_id = request_id
        self.index = index  # completion index within the request
        self.params = params
        self.generator = generator
        self.token_ids = list(prompt)
        self.prompt_len = len(prompt)
        self.finish_reason: str | None = None
        self.forked = params.n == 1  # n > 1: siblings are forked once the prompt is computed
        self.num_admissions = 0

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence]
    blocks: list[KVBlocks]  # each sequence's KV view for the step, from the block manager
    num_preempted: int = 0

    @property
    def num_new(self) -> list[int]:
        """Tokens computed this step, per sequence."""
        return [b.num_new for b in self.blocks]

    @property
    def num_tokens(self) -> int:
        return sum(b.num_new for b in self.blocks)

    @property
    def block_tables(self) -> list[tuple[int, ...]]:
        return [b.block_ids for b in self.blocks]


def _width(seq: Sequence) -> int:
    """The running places a sequence takes: its request's n until its siblings are forked."""
    return 1 if seq.forked else seq.params.n


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int):
        self.bm = block_manager
        self.max_num_seqs = check_positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = check_positive_int("max_num_batched_tokens",
                                                         max_num_batched_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_cached_prompt_tokens = 0  # prefix-cache hits at first admission

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [])
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if self.bm.num_tokens(seq.seq_id) < len(seq.token_ids) and \
                    not self._append_slot(seq, batch):
                break  # seq itself was preempted; everything after it is gone too
            budget -= self._take(batch, seq, budget)
            i += 1
        if batch.num_preempted:
            return batch  # the pool is dry: admit nothing new this step
        # an unforked request (n > 1, prompt not yet computed) holds places for its siblings
        occupied = sum(_width(s) for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if occupied + _width(seq) > self.max_num_seqs:
                break
            try:
                self.bm.allocate(seq.seq_id, seq.token_ids)  # atomic: fails without a change
            except OutOfBlocksError:
                break
            self.waiting.popleft()
            if seq.num_admissions == 0:
                self.num_cached_prompt_tokens += self.bm.num_cached_tokens(seq.seq_id)
            seq.num_admissions += 1
            self.running.append(seq)
            occupied += _width(seq)
            budget -= self._take(batch, seq, budget)
        return batch

    def _take(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        """Schedule seq's next uncomputed tokens, at most ``budget``; returns how many."""
        num_new = min(len(seq.token_ids) - self.bm.num_computed_tokens(seq.seq_id), budget)
        batch.seqs.append(seq)
        batch.blocks.append(self.bm.schedule_step(seq.seq_id, num_new))
        return num_new

    def _append_slot(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """A slot for seq's newest token, preempting from the back; False if seq was preempted."""
        while not self.bm.can_append(seq.seq_id):
            victim = self.running[-1]
            self._preempt(victim)
            batch.num_preempted += 1
            if victim is seq:
                return False
        self.bm.append_token(seq.seq_id, seq.token_ids[-1])
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq.seq_id)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq.seq_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares ``parent``'s blocks (copy-on-write) and runs beside it."""
        self.bm.fork(parent.seq_id, child.seq_id)
        child.token_ids = list(parent.token_ids)
        child.forked = True
        child.num_admissions = 1
        self.running.append(child)

    def abort_all(self) -> None:
        for seq in self.running:
            self.bm.free(seq.seq_id)
        self.running.clear()
        self.waiting.clear()
