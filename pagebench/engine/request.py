"""A request: its completions (``n`` sequences), the siblings not yet forked, its output.

The one owner of parallel-sampling (``n > 1``) state. A request enters the scheduler as its
first sequence alone, holding ``n`` running places; when that sequence's prompt is computed,
the siblings are forked from it (sharing its blocks copy-on-write) and draw from the same
logits row. A request is finished when every completion is.
"""

from __future__ import annotations

from pagebench.engine.sampling import CompletionOutput, RequestOutput, SamplingParams
from pagebench.engine.scheduler import Sequence


class Request:
    __slots__ = ("request_id", "params", "seqs", "unforked", "output", "num_finished")

    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams,
                 seqs: list[Sequence]):
        self.request_id = request_id
        self.params = params
        self.seqs = seqs
        self.unforked = seqs[1:]
        self.output = RequestOutput(request_id, list(prompt),
                                    [CompletionOutput(i) for i in range(params.n)])
        self.num_finished = 0

    @property
    def first(self) -> Sequence:
        return self.seqs[0]

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.seqs)

    def take_unforked(self) -> list[Sequence]:
        """The siblings to fork now (once: the first sequence's prompt is computed)."""
        siblings, self.unforked = self.unforked, []
        return siblings

    def record_finish(self, seq: Sequence) -> None:
        out = self.output.outputs[seq.index]
        out.token_ids, out.finish_reason = seq.output_ids, seq.finish_reason
        self.num_finished += 1
