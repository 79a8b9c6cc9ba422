"""LLMEngine: generate with a transformers model through pagebench's paged KV cache."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from dataclasses import dataclass
from numbers import Integral

import torch

from pagebench.config import KVGeometry, parse_bytes
from pagebench.engine.block_manager import BlockManager
from pagebench.engine.model_runner import ModelRunner
from pagebench.engine.parallel import setup_tensor_parallel
from pagebench.engine.request import Request
from pagebench.engine.sampling import RequestOutput, SamplingParams, make_generator, sample
from pagebench.engine.scheduler import Scheduler, Sequence
from pagebench.engine.stats import EngineStats, StatsRecorder, StepRecord
from pagebench.errors import ConfigError, PagebenchError, check_positive_int
from pagebench.kernels.quant import is_fp8, kv_dtype_from_name

DEFAULT_CPU_KV_MEMORY = 256 * 2**20
DEFAULT_GPU_KV_FRACTION = 0.8  # of the memory free after loading the model
MAX_NUM_BLOCKS = 2**31 - 1  # block ids are int32 in the block tables the kernels read
log = logging.getLogger(__name__)


def load_model(model, dtype=None, device=None):
    """A transformers causal LM, or a local path loaded with AutoModelForCausalLM."""
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        if not os.path.isdir(model):
            what = "is not a directory" if os.path.exists(model) else "not found"
            raise ConfigError(
                f"model: {model!r} {what}: not a local model directory (a Hugging Face id is not "
                "downloaded: give a directory, e.g. from `huggingface-cli download`, or a model "
                "with random weights: pagebench.measure.engine_bench.tiny_model() or "
                "preset_model('qwen2.5-0.5b'))")
        model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype or "auto")
        if device is not None:
            model = model.to(device)
    if not hasattr(model, "config") or not hasattr(model, "get_output_embeddings"):
        raise ConfigError(f"model: expected a transformers causal LM, got {type(model).__name__}")
    return model.eval()


class LLMEngine:
    """Continuous batching with a paged KV cache, preemption, copy-on-write, prefix caching.

    ``num_blocks=None`` sizes the pool from ``kv_cache_memory`` (bytes or a string such as
    "2GiB"); without it, 80% of the free GPU memory, or 256 MiB on the CPU.

    ``kv_cache_dtype``: ``"auto"`` (the model's dtype) or ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (one
    byte per element: twice the blocks in the same memory). An fp8 cache's per-layer, per-KV-
    head scales are calibrated on the first step that runs the model (``ModelRunner``).

    ``add_request`` queues a prompt, ``step()`` runs one batch and returns the tokens it
    produced, ``generate`` is a loop over both. ``stats`` (:class:`EngineStats`) describes the
    last ``generate`` call (or the run since ``begin_stats``); its ``graphs`` holds the
    CUDA-graph setup.

    On CUDA, decode steps replay CUDA graphs captured at start-up for batch sizes 1, 2, 4, 8,
    then every 16 up to ``max_num_seqs`` (``decode_graphs``), after ``torch.compile`` of the
    decoder layers (``compile_model``; fused kernels make the graphs shorter); ``enforce_eager=
    True`` runs every step eagerly and uncompiled, as on the CPU. ``check_kernel_inputs=True``
    implies eager.

    ``tensor_parallel_size=N`` runs SPMD under ``torchrun --nproc-per-node N``: the model is
    sharded in place by attention heads and MLP columns, each rank's cache holds
    ``kv_heads_per_rank`` heads, and every rank returns the same outputs (see
    ``pagebench.engine.parallel``). ``kv_cache_memory`` is then per rank. Its decode steps
    are captured in CUDA graphs as at tp=1, each graph holding the step's all-reduces.
    ``always_all_reduce=True`` (tp=1) all-reduces over a process group of one: the
    tensor-parallel step path, graphs included, on one device.
    """

    def __init__(self, model, block_size: int = 16, num_blocks: int | None = None,
                 kernel: str = "auto", enable_prefix_caching: bool = False,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 kv_cache_memory=None, max_model_len: int | None = None,
                 check_kernel_inputs: bool = False, fresh_prefill: bool = True,
                 tensor_parallel_size: int = 1, kv_cache_dtype="auto",
                 enforce_eager: bool = False, compile_model: bool = True,
                 always_all_reduce: bool = False):
        self.model = load_model(model)
        config = self.model.config
        param = next(self.model.parameters())
        try:
            cache_dtype = kv_dtype_from_name(kv_cache_dtype, param.dtype)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not is_fp8(cache_dtype) and cache_dtype != param.dtype:
            raise ConfigError(f"kv_cache_dtype: {cache_dtype} is neither the model's dtype "
                              f"({param.dtype}) nor fp8: use 'auto', 'fp8_e4m3' or 'fp8_e5m2'")
        self.geometry = KVGeometry.from_config(config, dtype=cache_dtype)
        block_size = check_positive_int("block_size", block_size)
        pool_option = "num_blocks" if num_blocks is not None else "kv_cache_memory"
        if num_blocks is not None:
            num_blocks = check_positive_int("num_blocks", num_blocks)
        self.tp = setup_tensor_parallel(self.model, self.geometry, tensor_parallel_size,
                                        always_all_reduce)
        if num_blocks is None:
            num_blocks = self._blocks_from_memory(kv_cache_memory, block_size, param.device)
        self._check_pool_fits(pool_option, num_blocks, block_size, param.device)
        num_blocks = self.tp.agree_min(num_blocks)  # every rank's pool the same size
        if max_model_len is not None:
            max_model_len = check_positive_int("max_model_len", max_model_len)
        self.max_model_len = max_model_len or getattr(config, "max_position_embeddings", None) \
            or 2**31 - 1
        self.vocab_size = config.vocab_size
        # as model.generate: the generation config's end tokens (None: none), the model
        # config's only where there is no generation config
        generation = getattr(self.model, "generation_config", None)
        eos = getattr(generation if generation is not None else config, "eos_token_id", None)
        self.eos_token_ids = set([eos] if isinstance(eos, int) else (eos or []))
        self.block_size = block_size
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching,
                                          deferred_caching=True)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.tp.geometry, num_blocks, block_size, kernel,
                                  check_kernel_inputs, fresh_prefill, cache_dtype)
        self._length_limit = "the model's maximum"
        if self.runner.attention_window and self.runner.attention_window < self.max_model_len:
            self.max_model_len = self.runner.attention_window
            self._length_limit = "the model's sliding window (the kernels attend to all of a sequence)"
        if not enforce_eager and not check_kernel_inputs and param.device.type == "cuda":
            # every rank captures the same buckets in the same order, all-reduces inside
            self.runner.setup_decode_graphs(max_num_seqs, self.max_model_len,
                                            compile_layers=compile_model)
            self._agree_on_graphs()
        log.info("LLMEngine: %s", self.describe())
        self._ids = itertools.count()
        self._request_ids = itertools.count()
        self._requests: dict[int, Request] = {}
        self.begin_stats()
        self.stats = EngineStats(self.graphs(), self.num_blocks, self.block_size)

    def _agree_on_graphs(self) -> None:
        """Graphs on every rank or on none: a rank whose capture failed decodes eagerly, so
        the others drop theirs too (the step paths stay alike on every rank)."""
        captured = self.runner.decode_graphs is not None
        if self.tp.size > 1 and self.tp.agree_min(int(captured)) == 0 and captured:
            self.runner.decode_graphs = None
            self.runner.graph_error = "not captured: another rank's capture failed"

    @property
    def num_blocks(self) -> int:
        return self.block_manager.num_blocks

    def graphs(self) -> dict:
        """cuda_graphs (bool), and when on: graph_batch_sizes, graph_max_len (the longest
        context a graph step holds), graph_capture_s, graph_memory_bytes; when a capture
        failed: graph_error."""
        return self.runner.describe_graphs()

    def describe(self) -> str:
        g = self.graphs()
        kv = self.runner.kv_cache_bytes / 2**30
        line = (f"{self.num_blocks} blocks of {self.block_size} tokens ({kv:.2f} GiB KV), "
                f"decode kernel {self.runner.decode_backend.name}, ")
        if g["compiled_layers"]:
            line += f"decoder layers compiled in {g['compile_s']:.1f} s, "
        elif g["compile_error"]:
            line += f"compile failed ({g['compile_error']}), "
        if g["cuda_graphs"]:
            sizes = g["graph_batch_sizes"]
            return line + (f"CUDA graphs for batch 1..{max(sizes)} ({len(sizes)} graphs, "
                           f"contexts <= {g['graph_max_len']}, "
                           f"{g['graph_memory_bytes'] / 2**20:.0f} MiB, "
                           f"captured in {g['graph_capture_s']:.1f} s)")
        return line + "eager" + (f" ({g['graph_error']})"
                                 if g.get("graph_error") else "")

    @property
    def kv_heads_per_rank(self) -> int:
        return self.tp.geometry.num_kv_heads

    def _blocks_from_memory(self, kv_cache_memory, block_size: int, device) -> int:
        if kv_cache_memory is None:
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                kv_cache_memory = int(free * DEFAULT_GPU_KV_FRACTION)
            else:
                kv_cache_memory = DEFAULT_CPU_KV_MEMORY
        budget = parse_bytes(kv_cache_memory)
        block_bytes = self.tp.geometry.bytes_per_block(block_size)
        num_blocks = budget // block_bytes
        if num_blocks < 1:
            raise ConfigError(f"kv_cache_memory: {budget} bytes hold no block of {block_size} "
                              f"tokens ({block_bytes} bytes each)")
        return num_blocks

    def _check_pool_fits(self, option: str, num_blocks: int, block_size: int, device) -> None:
        """ConfigError naming ``option`` unless the pool's block ids fit the block tables'
        int32 and its bytes the device's whole memory: a larger pool could only overflow or
        fail to allocate."""
        pool_bytes = num_blocks * self.tp.geometry.bytes_per_block(block_size)
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
        else:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if num_blocks > MAX_NUM_BLOCKS or pool_bytes > total:
            raise ConfigError(f"{option}: a pool of {num_blocks:,} blocks of {block_size} "
                              f"tokens takes {pool_bytes:,} bytes; {device.type} has "
                              f"{total:,} bytes in all, and block ids stop at "
                              f"{MAX_NUM_BLOCKS:,}")

    # ---- validation ----------------------------------------------------------------------
    def _check_params(self, params) -> None:
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"sampling_params: expected SamplingParams, "
                              f"got {type(params).__name__}")
        if params.n > self.scheduler.max_num_seqs:
            raise ConfigError(f"n: {params.n} completions exceed max_num_seqs "
                              f"{self.scheduler.max_num_seqs}")

    def _check_prompt(self, i: int, prompt, params: SamplingParams) -> list[int]:
        if hasattr(prompt, "tolist"):  # a tensor or an array of token ids
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)):
            raise ConfigError(f"prompts[{i}]: expected token ids, got a string")
        if not hasattr(prompt, "__iter__"):
            raise ConfigError(f"prompts[{i}]: expected a list of token ids, got "
                              f"{type(prompt).__name__} (prompts is a list of prompts)")
        prompt = list(prompt)
        if not prompt:
            raise ConfigError(f"prompts[{i}]: empty prompt")
        if not all(isinstance(t, Integral) and not isinstance(t, bool)
                   and 0 <= t < self.vocab_size for t in prompt):
            raise ConfigError(f"prompts[{i}]: token ids must be integers in "
                              f"0..{self.vocab_size - 1}")
        prompt = [int(t) for t in prompt]
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise ConfigError(f"prompts[{i}]: {len(prompt)} prompt tokens + max_tokens "
                              f"{params.max_tokens} exceed {self._length_limit} of "
                              f"{self.max_model_len} positions")
        need = self.block_manager.blocks_needed(total - 1)  # the last token is never cached
        if need > self.num_blocks:
            raise ConfigError(f"num_blocks: prompts[{i}] needs {need} blocks of "
                              f"{self.block_size} tokens alone, the pool has "
                              f"{self.num_blocks}")
        return prompt

    def check_requests(self, prompts, sampling_params=None) -> tuple[list[list[int]], list]:
        """The prompts as lists of ints and one :class:`SamplingParams` per prompt
        (``sampling_params``: one for all, default ``SamplingParams()``, or a list); a
        ``ConfigError`` naming the first bad argument otherwise."""
        if isinstance(sampling_params, (list, tuple)):
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params or SamplingParams()]
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
            raise ConfigError("prompts: expected a list of token-id lists")
        prompts = list(prompts)
        if len(params_list) == 1:
            params_list = params_list * len(prompts)
        if len(params_list) != len(prompts):
            raise ConfigError(f"sampling_params: {len(params_list)} for {len(prompts)} prompts")
        for params in params_list:
            self._check_params(params)
        out = [self._check_prompt(i, prompt, params)
               for i, (prompt, params) in enumerate(zip(prompts, params_list))]
        return out, params_list

    # ---- requests and steps --------------------------------------------------------------
    def add_request(self, prompt, sampling_params: SamplingParams | None = None) -> int:
        """Queue one prompt (token ids) and return its request id; ``step()`` runs it. A bad
        prompt or parameter raises ``ConfigError`` and queues nothing."""
        params = sampling_params or SamplingParams()
        self._check_params(params)
        return self._add(self._check_prompt(0, prompt, params), params)

    def _add(self, prompt: list[int], params: SamplingParams) -> int:
        rid = next(self._request_ids)
        device = self.runner.device
        seqs = [Sequence(next(self._ids), rid, i, prompt, params,
                         make_generator(params.seed, i, device) if not params.greedy else None)
                for i in range(params.n)]
        self._requests[rid] = Request(rid, prompt, params, seqs)
        self._recorder.num_prompt_tokens += len(prompt)
        self.scheduler.add(seqs[0])
        return rid

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def step(self) -> StepOutput:
        """Schedule one batch, run the model on it, sample: the tokens each request gained this
        step and the requests that finished. With nothing queued, an empty output and no step.
        """
        sched, bm = self.scheduler, self.block_manager
        if not sched.has_work:
            return StepOutput({}, [], [])
        step_start = time.perf_counter()
        try:
            batch = sched.schedule()
            if not batch.seqs:
                raise PagebenchError("engine: no sequence could be scheduled (pool too small)")
            copies = bm.take_copies()
            self.tp.check_step(batch.seqs, batch.blocks, copies)
            self.runner.copy_blocks(copies)
            logits, rows = self.runner.execute(batch.seqs, batch.blocks)
            bm.blocks_written()
            record = self._record_step(batch)
            sampled = [batch.seqs[r] for r in rows]
            out = self._sample_and_advance(sampled, logits) if sampled else StepOutput({}, [], [])
            out.scheduled = list(dict.fromkeys(seq.request_id for seq in batch.seqs))
        except BaseException:
            self.abort_all()
            raise
        record.num_sampled = sum(len(t) for t in out.new_tokens.values())
        self._recorder.num_generated_tokens += record.num_sampled
        record.time_s = time.perf_counter() - step_start
        return out

    def _record_step(self, batch) -> StepRecord:
        rec, bm = self._recorder, self.block_manager
        prefill = decode = context = 0
        for seq, kv in zip(batch.seqs, batch.blocks):
            start, new = kv.num_computed, kv.num_new
            rec.num_computed_prompt_tokens += max(0, min(start + new, seq.prompt_len) - start)
            context += start + new
            if new == 1 and start >= seq.prompt_len and start + 1 == len(seq.token_ids):
                decode += 1
            else:
                prefill += new
        record = StepRecord(step=len(rec.steps), batch_size=len(batch.seqs),
                            num_batched_tokens=batch.num_tokens, num_prefill_tokens=prefill,
                            num_decode_seqs=decode, num_context_tokens=context,
                            blocks_used=bm.num_used_blocks, num_preempted=batch.num_preempted)
        rec.steps.append(record)
        if rec.wants_utilisation():
            rec.utilisation.append(bm.token_utilisation)
        return record

    def _sample_and_advance(self, seqs, logits) -> StepOutput:
        # fork siblings of requests whose prompt just finished: they share this row's logits
        rows, all_seqs = [], []
        for row, seq in enumerate(seqs):
            siblings = [] if seq.forked else self._requests[seq.request_id].take_unforked()
            for s in [seq] + siblings:
                if s is not seq:
                    self.scheduler.fork(seq, s)
                rows.append(row)
                all_seqs.append(s)
            seq.forked = True
        if len(rows) != len(seqs):
            logits = logits[torch.tensor(rows, device=logits.device)]
        tokens = sample(logits, [s.params for s in all_seqs], [s.generator for s in all_seqs])
        tokens = self.tp.broadcast_tokens(tokens)  # rank 0's draw: every rank's tables agree
        out = StepOutput({}, [], [])
        for seq, token in zip(all_seqs, tokens):
            seq.token_ids.append(token)
            out.new_tokens.setdefault(seq.request_id, []).append(token)
            params = seq.params
            if not params.ignore_eos and token in self.eos_token_ids:
                seq.finish_reason = "stop"
            elif seq.num_output >= params.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason:
                self.scheduler.finish(seq)
                request = self._requests[seq.request_id]
                request.record_finish(seq)
                if request.finished:
                    out.finished.append(self._requests.pop(seq.request_id).output)
        return out

    def abort_all(self) -> None:
        """Drop every queued and running request and free their blocks."""
        self.scheduler.abort_all()
        self.block_manager.take_copies()
        self._requests.clear()

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix no running request holds (``BlockPool``); returns how
        many blocks were forgotten."""
        return self.block_manager.pool.reset_prefix_cache()

    # ---- run statistics ------------------------------------------------------------------
    @property
    def step_records(self) -> list[StepRecord]:
        """The steps of the run since ``begin_stats``, the latest last."""
        return self._recorder.steps

    def begin_stats(self) -> None:
        """Start a run: ``end_stats`` summarises the steps from here."""
        self._recorder = StatsRecorder()
        self._recorder.num_prompt_tokens = sum(len(r.output.prompt_token_ids)
                                               for r in self._requests.values())
        self.scheduler.num_preemptions = self.scheduler.num_cached_prompt_tokens = 0
        self._run_start = time.perf_counter()

    def end_stats(self) -> EngineStats:
        """The run since ``begin_stats``, also kept as ``stats``."""
        self.stats = self._recorder.summary(
            self.graphs(), self.num_blocks, self.block_size, self.scheduler.num_preemptions,
            self.scheduler.num_cached_prompt_tokens, time.perf_counter() - self._run_start)
        return self.stats

    # ---- generation ----------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None,
                 use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Complete every prompt (token-id lists); outputs in prompt order: ``add_request``
        for each, then ``step()`` until all have finished. ``stats`` describes the call.

        ``sampling_params``: one :class:`SamplingParams` for every prompt (default
        ``SamplingParams()``) or a list, one per prompt. A prompt that could never fit the
        pool, even alone (its prompt and ``max_tokens`` need more than ``num_blocks`` blocks),
        fails the whole call up front with a ``ConfigError`` starting "num_blocks:"; everything
        else completes, by preemption if the pool runs dry.
        """
        prompts, params_list = self.check_requests(prompts, sampling_params)
        if use_tqdm is None:
            use_tqdm = sys.stderr.isatty()
        self.begin_stats()
        ids = [self._add(prompt, params) for prompt, params in zip(prompts, params_list)]
        outputs = {}
        bar = _progress(sum(p.n for p in params_list), use_tqdm)
        try:
            while self.has_unfinished_requests:
                for out in self.step().finished:
                    outputs[out.request_id] = out
                    if bar is not None:
                        bar.update(len(out.outputs))
        except BaseException:  # interrupted between steps too: leave nothing queued
            self.abort_all()
            raise
        finally:
            if bar is not None:
                bar.close()
        self.end_stats()
        return [outputs[rid] for rid in ids]


@dataclass(slots=True)
class StepOutput:
    """One step's result: request id -> tokens sampled for it this step (one per completion
    that ran), the requests that finished (in the order they finished), and the ids of the
    requests the step scheduled (prefill chunks included: those sample nothing yet)."""

    new_tokens: dict[int, list[int]]
    finished: list[RequestOutput]
    scheduled: list[int]


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="seq")
