"""Runs a transformers decoder (Llama / Qwen2 / Qwen3 / Mistral family) on the paged KV cache.

No modelling code is forked: the model runs on one packed batch (``input_ids [1, T]`` with
explicit ``position_ids``, ``use_cache=False``) under an attention implementation registered
with transformers as ``"pagebench"``. Each attention layer hands it the new tokens' K/V after
RoPE; the function writes them into that layer's paged cache (``write_kv``) and attends over
the cache with ``paged_prefill`` / ``paged_decode``, using the step's metadata held here.
transformers builds no mask for an attention implementation it has no mask function for.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagebench.errors import ConfigError
from pagebench.kernels.cache_ops import store_kv
from pagebench.kernels.quant import calibrated_scales, is_fp8
from pagebench.kernels.reference import cumulative_offsets

ATTN_NAME = "pagebench"
_active: ModelRunner | None = None  # the runner whose step is in flight


# config fields of attention variants the paged kernels do not implement (Gemma 2's soft caps)
UNSUPPORTED_CONFIG = ("attn_logit_softcapping", "final_logit_softcapping")
UNSUPPORTED_KWARGS = ("softcap", "s_aux")  # what such a model's layers pass the attention


def _paged_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    # query [1, Hq, T, D], key/value [1, Hkv, T, D] (after RoPE, GQA not expanded)
    if _active is None:
        raise RuntimeError("the 'pagebench' attention runs only inside ModelRunner.execute")
    unsupported = [k for k in UNSUPPORTED_KWARGS if kwargs.get(k) is not None]
    if unsupported:
        raise ConfigError(f"model: its attention takes {', '.join(unsupported)}, which the "
                          "paged kernels do not implement")
    out = _active.attend(module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1),
                         value[0].transpose(0, 1), scaling)
    return out.unsqueeze(0), None  # [1, T, Hq, D]


def _padded_causal_attention(q, k, v, index, valid, scale):
    """Causal attention of S sequences packed in q/k/v rows ``index`` [S, L] (``valid`` marks
    real tokens); returns their outputs packed in the same order, [sum(valid), Hq, D].

    Padding follows each sequence's tokens, so the causal mask alone keeps a real query from
    every padding key (padding rows repeat real tokens' K/V: finite, and their outputs are
    dropped); no [S, L, L] mask is built and SDPA skips the blocks above the diagonal."""
    # qb [S, Hq, L, D], kb/vb [S, Hkv, L, D]
    qb, kb, vb = (x[index].transpose(1, 2) for x in (q, k, v))
    group = qb.shape[1] // kb.shape[1]
    if group > 1:
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
    return out.transpose(1, 2)[valid]


def _register() -> None:
    from transformers import AttentionInterface

    # left out of torch.compile'd layers (compile_decoder_layers) as a graph break: it reads
    # the runner's step state and launches its own kernels. Registered this way for every
    # runner, so that a runner built later cannot swap the function under compiled layers
    # (which would make dynamo recompile them, tracing into it)
    AttentionInterface.register(ATTN_NAME, torch.compiler.disable(_paged_attention))


@dataclass(slots=True)
class AttentionGroup:
    """Sequences attended by one kernel call; ``rows`` picks their query tokens (None: all).

    kind "decode": one new token each (``paged_decode``); "prefill": a chunk after cached
    tokens (``paged_prefill``); "fresh": a chunk starting at position 0, which attends only to
    itself, so it runs as one padded batch (``index`` [S, L] into the packed tokens, ``valid``)
    without reading the cache back.
    """
    kind: str
    rows: torch.Tensor | None
    block_tables: torch.Tensor | None = None  # [S, max_blocks] int32
    seq_lens: torch.Tensor | None = None  # [S] int32, context length after this step
    query_start_loc: torch.Tensor | None = None  # [S + 1] int32: the queries' packed offsets
    index: torch.Tensor | None = None  # fresh: [S, L] token rows, padded
    valid: torch.Tensor | None = None  # fresh: [S, L] bool


@dataclass(slots=True)
class StepMetadata:
    slot_mapping: torch.Tensor  # [T] int64: block * block_size + offset of each new token
    groups: list[AttentionGroup]


class ModelRunner:
    """Owns the paged KV cache of a model and runs one scheduled step at a time.

    ``fresh_prefill=True`` attends prompt chunks that start at position 0 as one padded batch
    of their own K/V (nothing cached precedes them); chunks after cached tokens always go
    through the paged prefill kernel. ``check_inputs=True`` goes through the kernels' validated
    entry points (each checks shapes and bounds, reading values back from the device); the
    default calls the resolved backend directly, since the runner builds its metadata from the
    block manager's tables.

    ``kv_cache_dtype`` (default the model's dtype) may be fp8: then each layer's per-KV-head
    scales are calibrated on the first step that reaches it (``quant.calibrated_scales`` of
    that step's K and V: the largest magnitude with 2x headroom; later outliers saturate), as
    vLLM's ``calculate_kv_scales`` does, and stay fixed since the cache holds values stored
    with them (steps of padding rows alone, which warm up and capture the decode graphs, do not
    calibrate: the graphs read the scales in place). A "fresh" prompt chunk attends to its own unquantised K/V; everything read back
    from the cache is fp8.
    """

    def __init__(self, model, geometry, num_blocks: int, block_size: int, kernel: str = "auto",
                 check_inputs: bool = False, fresh_prefill: bool = True, kv_cache_dtype=None):
        from pagebench import kernels

        self.kernels = kernels
        self.model = model
        config = model.config
        # sliding-window models (Mistral): the paged kernels attend to the whole context, which
        # is the same thing as long as no sequence outgrows the window: the engine caps lengths
        self.attention_window = getattr(config, "sliding_window", None) \
            if getattr(config, "use_sliding_window", True) else None
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.lm_head = model.get_output_embeddings()
        name = type(model).__name__
        if self.decoder is None or self.lm_head is None:
            raise ConfigError(f"model: {name} is not a decoder-only causal LM")
        if not isinstance(getattr(self.decoder, "layers", None), torch.nn.ModuleList):
            raise ConfigError(f"model: {name} has no list of decoder layers (`.layers`), as "
                              "the Llama, Qwen2/3, Mistral and Phi-3 families have")
        unsupported = [k for k in UNSUPPORTED_CONFIG if getattr(config, k, None) is not None]
        if unsupported:
            raise ConfigError(f"model: {name} uses {', '.join(unsupported)}, which the paged "
                              "kernels do not implement")
        # the cache's shape: the engine's KVGeometry of this model (config.KVGeometry.from_config)
        self.num_layers = geometry.num_layers
        self.num_kv_heads = geometry.num_kv_heads
        self.head_dim = geometry.head_dim
        self.block_size = block_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.check_inputs = check_inputs
        self.fresh_prefill = fresh_prefill
        self.kv_cache_dtype = kv_cache_dtype or self.dtype
        try:
            args = (self.device, self.dtype, block_size, self.head_dim, self.kv_cache_dtype)
            self.decode_backend = kernels.resolve("decode", kernel, *args)
            has_prefill = kernel == "auto" or kernels.get_backend(kernel).prefill is not None
            # a backend without a prefill kernel (decode-only) leaves prompts to the best other
            self.prefill_backend = kernels.resolve("prefill", kernel if has_prefill else "auto",
                                                   *args)
        except ValueError as e:
            raise ConfigError(f"kernel: {e}") from None
        shape = (self.num_layers, 2, num_blocks, block_size, self.num_kv_heads, self.head_dim)
        self.kv = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
        # fp8: [layer, K/V, kv_head] scales, filled per layer by its first step
        self.kv_scales = torch.ones(self.num_layers, 2, self.num_kv_heads, dtype=torch.float32,
                                    device=self.device) if is_fp8(self.kv_cache_dtype) else None
        self.calibrated = [False] * self.num_layers
        self.calibrate_kv_scales = True  # off for steps of padding rows only (decode graphs)
        self.meta: StepMetadata | None = None
        self.decode_graphs = None  # setup_decode_graphs
        self.graph_error: str | None = None
        self.compiled_layers: torch.nn.ModuleList | None = None
        self.compile_s = 0.0
        self.compile_error: str | None = None
        _register()

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy block src to dst in every layer (before the step that writes)."""
        if pairs:
            for layer in range(self.num_layers):
                self.kernels.copy_blocks(self.kv[layer, 0], self.kv[layer, 1], pairs)

    def attend(self, layer: int, q, k, v, scale):
        # q [T, Hq, D], k/v [T, Hkv, D]
        scale = self.head_dim ** -0.5 if scale is None else scale
        meta, kern = self.meta, self.kernels
        k_cache, v_cache = self.kv[layer, 0], self.kv[layer, 1]
        scales = self._layer_scales(layer, k, v)
        if self.check_inputs:
            kern.write_kv(k_cache, v_cache, k, v, meta.slot_mapping, **scales)
        else:
            store_kv(k_cache, v_cache, k, v, meta.slot_mapping, **scales)
        if len(meta.groups) == 1:
            return self._attend_group(meta.groups[0], q, k, v, k_cache, v_cache, scale, scales)
        out = torch.empty_like(q)
        for g in meta.groups:
            out[g.rows] = self._attend_group(g, q, k, v, k_cache, v_cache, scale, scales)
        return out

    @contextlib.contextmanager
    def padding_only(self):
        """Steps of padding rows alone (decode-graph warm-up and capture) run inside: what
        they write must not calibrate an fp8 cache's scales. The runner alone sets its flag."""
        saved, self.calibrate_kv_scales = self.calibrate_kv_scales, False
        try:
            yield
        finally:
            self.calibrate_kv_scales = saved

    def _layer_scales(self, layer: int, k, v) -> dict:
        """``k_scale``/``v_scale`` keywords of an fp8 layer (calibrated on its first step)."""
        if self.kv_scales is None:
            return {}
        if not self.calibrated[layer] and self.calibrate_kv_scales:
            self.kv_scales[layer, 0] = calibrated_scales(k, self.kv_cache_dtype)
            self.kv_scales[layer, 1] = calibrated_scales(v, self.kv_cache_dtype)
            self.calibrated[layer] = True
        return {"k_scale": self.kv_scales[layer, 0], "v_scale": self.kv_scales[layer, 1]}

    def _attend_group(self, g: AttentionGroup, q, k, v, k_cache, v_cache, scale, scales):
        kern, checked = self.kernels, self.check_inputs
        if g.kind == "fresh":
            return _padded_causal_attention(q, k, v, g.index, g.valid, scale)
        qg = q if g.rows is None else q[g.rows]
        if g.kind == "decode":
            if checked:
                return kern.paged_decode(qg, k_cache, v_cache, g.block_tables, g.seq_lens,
                                         scale=scale, backend=self.decode_backend.name, **scales)
            return self.decode_backend.decode(qg, k_cache, v_cache, g.block_tables, g.seq_lens,
                                              scale, **scales)
        if checked:
            return kern.paged_prefill(qg, k_cache, v_cache, g.block_tables, g.seq_lens,
                                      g.query_start_loc, scale=scale,
                                      backend=self.prefill_backend.name, **scales)
        return self.prefill_backend.prefill(qg, k_cache, v_cache, g.block_tables, g.seq_lens,
                                            g.query_start_loc, scale, **scales)

    def prepare(self, seqs, blocks):
        """Packed input ids and positions, the step's metadata, and the rows to sample.

        ``blocks``: each sequence's ``KVBlocks`` for the step (``ScheduledBatch.blocks``)."""
        ids, starts, num_new, slots, sample_rows, sample_seqs = [], [], [], [], [], []
        end_of_row = -1
        for i, (seq, kv) in enumerate(zip(seqs, blocks)):
            start, n = kv.num_computed, kv.num_new
            ids.extend(seq.token_ids[start:start + n])
            starts.append(start)
            num_new.append(n)
            slots.extend(kv.slot_mapping)
            end_of_row += n
            if start + n == len(seq.token_ids):  # all known tokens computed: sample the next
                sample_rows.append(end_of_row)
                sample_seqs.append(i)
        width = max(len(kv.block_ids) for kv in blocks)
        # built on the host, one copy each to the device
        block_tables = torch.tensor([[*kv.block_ids] + [0] * (width - len(kv.block_ids))
                                     for kv in blocks], dtype=torch.int32)
        query_lens = torch.tensor(num_new, dtype=torch.int32)
        start_t = torch.tensor(starts, dtype=torch.int64)
        seq_lens = (start_t + query_lens).to(torch.int32)
        num_seqs, num_tokens = len(seqs), len(ids)
        query_start_loc = cumulative_offsets(query_lens)
        first = query_start_loc[:-1]  # each sequence's first token row
        if num_tokens == num_seqs:  # decode only
            positions, seq_index = start_t, torch.arange(num_seqs)
        else:
            seq_index = torch.repeat_interleave(torch.arange(num_seqs), query_lens)
            positions = start_t[seq_index] + torch.arange(num_tokens) - first[seq_index]
        dev = self.device
        kinds = {"decode": query_lens == 1,
                 "fresh": (query_lens > 1) & (start_t == 0) if self.fresh_prefill
                 else torch.zeros(num_seqs, dtype=torch.bool),
                 "prefill": (query_lens > 1) & ((start_t > 0) | (not self.fresh_prefill))}
        groups = []
        for kind, mask in kinds.items():
            count = int(mask.sum())
            if not count:
                continue
            whole = count == num_seqs
            rows = None if whole else torch.nonzero(mask[seq_index]).flatten().to(dev)
            if kind == "fresh":
                lens = query_lens[mask].to(torch.int64)
                span = torch.arange(int(lens.max()))
                index = (first[mask][:, None] + span).clamp_max(num_tokens - 1)
                groups.append(AttentionGroup(kind, rows, index=index.to(dev),
                                             valid=(span < lens[:, None]).to(dev)))
                continue
            sel = slice(None) if whole else mask
            starts = None
            if kind == "prefill":  # the group's own offsets where it is not the whole step
                starts = query_start_loc if whole else cumulative_offsets(query_lens[mask])
                starts = starts.to(dev)
            groups.append(AttentionGroup(kind, rows, block_tables[sel].to(dev),
                                         seq_lens[sel].to(dev), starts))
        meta = StepMetadata(torch.tensor(slots, dtype=torch.int64).to(dev), groups)
        input_ids = torch.tensor(ids, dtype=torch.int64).to(dev)
        return input_ids, positions.to(dev), meta, sample_rows, sample_seqs

    @torch.inference_mode()
    def execute(self, seqs, blocks) -> tuple[torch.Tensor, list[int]]:
        """Run one step (``blocks``: each sequence's ``KVBlocks``); returns float32 logits
        [R, vocab] and the indices (into ``seqs``) of the R sequences whose known tokens are now
        all computed."""
        graphs = self.decode_graphs
        if graphs is not None and all(kv.num_new == 1 for kv in blocks) \
                and graphs.fits(blocks):
            hidden = graphs.run(seqs, blocks)  # one token row per sequence
            rows = [i for i, (seq, kv) in enumerate(zip(seqs, blocks))
                    if kv.num_computed + 1 == len(seq.token_ids)]
            sampled = rows
        else:
            input_ids, positions, meta, rows, sampled = self.prepare(seqs, blocks)
            hidden = self.forward(input_ids, positions, meta)
        if not rows:
            return hidden.new_empty(0, 0), sampled
        if len(rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(rows, device=hidden.device)]
        return self.lm_head(hidden).float(), sampled

    def forward(self, input_ids, positions, meta: StepMetadata) -> torch.Tensor:
        """The decoder on one packed step (``input_ids``, ``positions`` [T]): hidden [T, H]."""
        with self._active(meta):
            return self.decoder(input_ids=input_ids[None], position_ids=positions[None],
                                use_cache=False).last_hidden_state[0]

    def forward_decode(self, input_ids, positions, slots, block_tables, seq_lens):
        """A decode step: one token per sequence, attended by the decode kernel alone."""
        group = AttentionGroup("decode", None, block_tables, seq_lens)
        return self.forward(input_ids, positions, StepMetadata(slots, [group]))

    def setup_decode_graphs(self, max_num_seqs: int, max_model_len: int,
                            capture: bool = True, compile_layers: bool = False) -> None:
        """Run decode steps from static buffers (``decode_graphs.DecodeGraphs``), captured
        into CUDA graphs if ``capture`` (CUDA only). Adds a scratch block past the pool for
        the padding rows, so call it before the first step. A decode kernel that cannot be
        captured (it reads device values back) leaves the runner eager, with the reason in
        ``graph_error``.

        ``compile_layers``: first ``torch.compile`` the decoder layers for this runner's steps
        (``compile_decoder_layers``), so that each graph holds fused kernels: a decode step of
        a small model at small batch is a thousand tiny kernels, which even a graph replays
        at a microsecond or two each. A compile that fails leaves the layers as they are, with
        the reason in ``compile_error``."""
        from pagebench.engine.decode_graphs import DecodeGraphs

        if self.check_inputs:
            raise ConfigError("check_kernel_inputs: the checked kernels read values back "
                              "from the device, which a CUDA graph cannot; use eager mode")
        num_blocks = self.kv.shape[2]
        shape = list(self.kv.shape)
        shape[2] = num_blocks + 1
        self.kv = None  # freed first: the pool may be most of the device's memory
        self.kv = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
        if self.attention_window:
            max_model_len = min(max_model_len, self.attention_window)
        self.decode_graphs = DecodeGraphs(self, max_num_seqs, max_model_len, num_blocks)
        if compile_layers:
            self.compile_decoder_layers()
        if capture:
            try:
                self.decode_graphs.capture()
            except RuntimeError as e:  # e.g. a backend that syncs with the host
                self.graph_error = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0]}"
                self.decode_graphs = None
                torch.cuda.synchronize(self.device)

    def compile_decoder_layers(self) -> None:
        """``torch.compile`` each decoder layer (one compiled code serves them all: the layers
        share their code, and their weights are inputs), used in this runner's steps only (the
        model's own ``forward`` and ``generate`` keep the plain layers); the paged attention is
        left out as a graph break. Compiles on the first step of each shape class (batch 1
        and any other batch), which ``setup_decode_graphs`` does before capturing."""
        t0 = time.perf_counter()
        try:
            self.compiled_layers = torch.nn.ModuleList(
                torch.compile(layer, dynamic=True) for layer in self.decoder.layers)
            for size in ((self.decode_graphs.max_batch, 1) if self.decode_graphs else ()):
                self.decode_graphs.warm_up(size)
        except Exception as e:  # noqa: BLE001 -- inductor's errors are many types
            self.compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.compiled_layers = None
        self.compile_s = time.perf_counter() - t0

    def describe_graphs(self) -> dict:
        compiled = dict(compiled_layers=self.compiled_layers is not None,
                        compile_s=self.compile_s, compile_error=self.compile_error)
        if self.decode_graphs is None:
            return dict(cuda_graphs=False, graph_error=self.graph_error) | compiled
        return self.decode_graphs.describe() | compiled

    @contextlib.contextmanager
    def _active(self, meta: StepMetadata):
        global _active
        config = self.model.config
        saved = config._attn_implementation
        config._attn_implementation = ATTN_NAME
        self.meta, _active = meta, self
        layers = self.decoder.layers
        if self.compiled_layers is not None:
            self.decoder.layers = self.compiled_layers
        try:
            yield
        finally:
            self.decoder.layers = layers
            config._attn_implementation = saved
            self.meta, _active = None, None
