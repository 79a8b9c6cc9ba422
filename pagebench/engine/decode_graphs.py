"""Decode steps from static buffers, replayed from CUDA graphs on a GPU.

A decode step (one new token per sequence) runs the whole model, embedding through the final
norm, on buffers whose addresses never change, so that on CUDA it is captured once per
batch-size bucket (``graph_batch_sizes``) and replayed: one graph launch instead of a few
hundred kernel launches from Python. The logits and the sampling stay outside the graph: they
read only the rows that sample, exactly as an eager step does.

What changes between steps reaches the graph through one host-to-device copy of a ``[6,
max_batch]`` int32 array: token ids, positions, each sequence's row in the block-table store,
at most one block-table update per sequence, and each new token's cache slot (from the block
manager's ``KVBlocks``). The block tables live on the device in a store of rows (one per
recently seen sequence): a sequence's row is written whole when it first decodes (or after it
was re-admitted, or when its table changed more than a decode step can), and afterwards only
the entry a decode step adds (a new block) or replaces (copy-on-write of the last block).
Inside the graph each sequence's table is gathered from its row; its length is
``position + 1``.

A batch of ``n`` sequences replays the graph of the smallest bucket >= ``n``; the padding rows
decode token 0 at position 0 of a scratch block that no sequence owns (the runner allocates it
past the block manager's pool), so they never touch a real sequence's cache. Contexts longer
than the graphs' table width (``MAX_GRAPH_LEN`` tokens, as vLLM's ``max_seq_len_to_capture``)
decode eagerly.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import torch

from pagebench.engine.block_manager import blocks_needed, slot_mapping

MAX_GRAPH_LEN = 8192  # context tokens a graph's block tables cover
SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 16


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 16 up to ``max_num_seqs`` (which is
    always one, so every batch the scheduler can form has a bucket)."""
    sizes = [b for b in SMALL_BUCKETS if b < max_num_seqs]
    sizes += range(BUCKET_STEP, max_num_seqs, BUCKET_STEP)
    return sorted(set(sizes)) + [max_num_seqs]


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured batch size that holds ``n`` sequences (None: none does)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass(slots=True)
class _Row:
    row: int  # index into the block-table store
    admission: int  # the sequence's admission count when its row was written
    length: int  # table entries on the device
    last: int  # the last of them


# rows of the int32 input array
IDS, POSITIONS, ROWS, UPDATE_INDEX, UPDATE_VALUE, SLOTS = range(6)


class DecodeGraphs:
    """Static-buffer decode for one ``ModelRunner``; captured into CUDA graphs when
    ``capture()`` is called (CUDA only), else run eagerly on the same padded buffers (which is
    how the CPU tests exercise the padding and the block-table store)."""

    def __init__(self, runner, max_num_seqs: int, max_model_len: int, scratch_block: int):
        self.runner = runner
        bs = runner.block_size
        self.width = blocks_needed(min(max_model_len, MAX_GRAPH_LEN), bs)
        self.max_len = self.width * bs  # longest context a graph step can hold
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_batch = self.sizes[-1]
        self.scratch_block = scratch_block
        self.scratch_slot = slot_mapping((scratch_block,), 0, 1, bs)[0]
        dev = runner.device
        self.store_rows = 2 * max_num_seqs  # + 1 padding row, all scratch
        # each row has one spare column that no-op updates write to
        self.store = torch.full((self.store_rows + 1, self.width + 1), scratch_block,
                                dtype=torch.int32, device=dev)
        self.pad_row = self.store_rows
        self.pad_update = self.pad_row * (self.width + 1) + self.width
        self.inputs = torch.zeros(6, self.max_batch, dtype=torch.int32, device=dev)
        pinned = dev.type == "cuda"
        self.staging = torch.zeros(6, self.max_batch, dtype=torch.int32, pin_memory=pinned)
        self.host = self.staging.numpy()
        self._pad(0, self.max_batch)
        self.inputs.copy_(self.staging)
        self.copied = torch.cuda.Event() if pinned else None
        hidden_size = runner.model.config.hidden_size
        self.hidden = torch.zeros(self.max_batch, hidden_size, dtype=runner.dtype, device=dev)
        self.rows: dict[object, _Row] = {}
        self.free_rows = list(range(self.store_rows - 1, -1, -1))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_s = 0.0
        self.memory_bytes = 0
        self.num_steps = 0  # decode steps run here, replayed or not
        self.num_replays = 0

    # ---- capture ---------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per bucket, largest first, all in one memory pool (a smaller
        batch's activations fit in the larger one's)."""
        dev = self.runner.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # as each capture does: what stays reserved is the graphs'
        t0, before = time.perf_counter(), torch.cuda.memory_reserved(dev)
        pool = None
        for size in reversed(self.sizes):
            self._padding_forward(size)  # warm-up: compiles kernels, builds launch plans
            torch.cuda.synchronize(dev)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._padding_forward(size)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize(dev)
        self.capture_s = time.perf_counter() - t0
        torch.cuda.empty_cache()
        self.memory_bytes = torch.cuda.memory_reserved(dev) - before

    @torch.inference_mode()
    def warm_up(self, size: int) -> None:
        """One step of padding rows only, uncaptured (compiles what the step compiles)."""
        self._pad(0, size)
        self.inputs.copy_(self.staging)
        self._padding_forward(size)
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)

    def _padding_forward(self, size: int) -> None:
        """A step of padding rows alone: what it writes to the scratch block must not
        calibrate an fp8 cache's scales. The graphs read the scales tensor, so the
        calibration of the first real step (a prefill), written in place, reaches every
        replay."""
        with self.runner.padding_only():
            self._forward(size)

    def _forward(self, size: int) -> None:
        """The captured step on the first ``size`` rows of the static inputs."""
        ids, pos, rows, upd_index, upd_value, slots = self.inputs[:, :size]
        self.store.view(-1).index_copy_(0, upd_index.long(), upd_value)
        tables = self.store.index_select(0, rows)[:, :self.width]  # [size, width]
        hidden = self.runner.forward_decode(ids.long(), pos.long(), slots.long(), tables, pos + 1)
        self.hidden[:size].copy_(hidden)

    # ---- one step ------------------------------------------------------------------------
    def fits(self, blocks) -> bool:
        """Whether a decode step of sequences with these ``KVBlocks`` can run here (bucket
        and context length)."""
        width = self.width
        return len(blocks) <= self.max_batch and \
            all(kv.num_computed < self.max_len and len(kv.block_ids) <= width for kv in blocks)

    @torch.inference_mode()
    def run(self, seqs, blocks) -> torch.Tensor:
        """Decode one token of each of ``seqs``, whose ``KVBlocks`` are ``blocks`` (``fits``
        must hold); their final hidden states [n, hidden] (a view of a static buffer, valid
        until the next step)."""
        n = len(seqs)
        size = bucket_for(n, self.sizes)
        if self.copied is not None:  # the staging buffer is free once its last copy is done
            self.copied.synchronize()
        full_index, full_value = self._stage(seqs, blocks)
        self._pad(n, size)
        if full_index:  # whole rows, before the step's own updates
            dev = self.runner.device
            self.store.view(-1).index_copy_(0, torch.tensor(full_index).to(dev),
                                            torch.tensor(full_value, dtype=torch.int32).to(dev))
        self.inputs.copy_(self.staging, non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        self.num_steps += 1
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
            self.num_replays += 1
        else:
            self._forward(size)
        return self.hidden[:n]

    def _stage(self, seqs, blocks):
        """Fill the host inputs for ``seqs``; returns the whole-row writes (flat indices into
        the store, values) that must precede the step."""
        width1 = self.width + 1
        ids, positions, rows, upd_index, upd_value, slots = [], [], [], [], [], []
        full_index, full_value = [], []
        for seq, kv in zip(seqs, blocks):
            pos, table = kv.num_computed, kv.block_ids
            ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(kv.slot_mapping[0])
            entry = self._row(seq, seqs)
            length, last = len(table), table[-1]
            base = entry.row * width1
            if entry.length == 0 or entry.admission != seq.num_admissions or \
                    not (entry.length <= length <= entry.length + 1) or \
                    (length == entry.length + 1 and table[length - 2] != entry.last):
                full_index.extend(range(base, base + length))
                full_value.extend(table)
                upd_index.append(base + self.width)
                upd_value.append(0)
            elif length == entry.length and last == entry.last:
                upd_index.append(base + self.width)  # unchanged: the spare column
                upd_value.append(0)
            else:  # a new last block, or the last block replaced (copy-on-write)
                upd_index.append(base + length - 1)
                upd_value.append(last)
            entry.admission, entry.length, entry.last = seq.num_admissions, length, last
            rows.append(entry.row)
        n = len(seqs)
        host = self.host
        host[IDS, :n] = ids
        host[POSITIONS, :n] = positions
        host[ROWS, :n] = rows
        host[UPDATE_INDEX, :n] = upd_index
        host[UPDATE_VALUE, :n] = upd_value
        host[SLOTS, :n] = slots
        return full_index, full_value

    def _row(self, seq, seqs) -> _Row:
        entry = self.rows.get(seq.seq_id)
        if entry is None:
            if not self.free_rows:  # forget the sequences that are not in this step
                live = {s.seq_id for s in seqs}
                for seq_id in [k for k in self.rows if k not in live]:
                    self.free_rows.append(self.rows.pop(seq_id).row)
            entry = self.rows[seq.seq_id] = _Row(self.free_rows.pop(), 0, 0, -1)
        return entry

    def _pad(self, start: int, stop: int) -> None:
        host = self.host
        host[IDS, start:stop] = 0
        host[POSITIONS, start:stop] = 0
        host[ROWS, start:stop] = self.pad_row
        host[UPDATE_INDEX, start:stop] = self.pad_update
        host[UPDATE_VALUE, start:stop] = self.scratch_block
        host[SLOTS, start:stop] = self.scratch_slot

    def describe(self) -> dict:
        return dict(cuda_graphs=bool(self.graphs), graph_batch_sizes=sorted(self.graphs),
                    graph_max_len=self.max_len, graph_capture_s=self.capture_s,
                    graph_memory_bytes=self.memory_bytes)
