"""``pagebench serve``: the engine behind an OpenAI-compatible ``/v1/completions`` endpoint.

One asyncio task owns the engine: before each ``step()`` it adds the requests that came in, runs
the step in a worker thread (the event loop keeps answering), and hands each request's new
tokens to its stream. Prompts are token ids (a list of ints, or a list of such lists); there is
no tokenizer, so each completion's ``text`` is empty and its tokens are in ``token_ids`` (as
vLLM's ``return_token_ids``). ``stream: true`` sends Server-Sent Events, one chunk per sampled
token, then ``data: [DONE]``; the last chunk of a completion carries its ``finish_reason``.
``POST /reset_prefix_cache`` empties the prefix cache between runs (as vLLM's). ``GET /metrics`` gives Prometheus text (requests running and waiting, KV-cache usage,
preemptions, prefix-cache queries and hits, under vLLM's metric names with a ``pagebench:``
prefix); ``GET /v1/models`` names the model, its vocabulary and maximum length.

aiohttp is an optional dependency (the ``serve`` extra; CI installs it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

from pagebench.engine.sampling import SamplingParams
from pagebench.errors import ConfigError

DONE = object()  # a stream's end


@dataclass
class _Stream:
    index_of: dict  # engine request id -> choice index
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    open: int = 0


class EngineServer:
    """The engine loop and the HTTP handlers (see the module doc)."""

    def __init__(self, engine, model_name: str = "pagebench"):
        self.engine = engine
        self.model_name = model_name
        self.pending: list[tuple] = []  # (prompt, params, stream, choice index)
        self.streams: dict[int, _Stream] = {}
        self.wake = asyncio.Event()
        self.ids = itertools.count()
        self.counters = dict(requests=0, prompt_tokens=0, generation_tokens=0)
        self.task = None
        self.engine.begin_stats()

    # ---- the engine loop -----------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.pending and not self.engine.has_unfinished_requests:
                self.wake.clear()
                await self.wake.wait()
            for prompt, params, stream, index in self.pending:
                rid = self.engine.add_request(prompt, params)
                stream.index_of[rid] = index
                self.streams[rid] = stream
            self.pending.clear()
            try:
                out = await loop.run_in_executor(None, self.engine.step)
            except Exception:  # noqa: BLE001 -- the engine aborted every request: end them
                for rid, stream in self.streams.items():
                    stream.queue.put_nowait((stream.index_of[rid], None, ["abort"]))
                self.streams.clear()
                continue
            finished = {r.request_id: [o.finish_reason for o in r.outputs]
                        for r in out.finished}
            for rid, tokens in out.new_tokens.items():
                stream = self.streams[rid]
                self.counters["generation_tokens"] += len(tokens)
                for i, token in enumerate(tokens):  # the last carries the finish reason
                    last = i == len(tokens) - 1 and rid in finished
                    stream.queue.put_nowait((stream.index_of[rid], token,
                                             finished[rid] if last else None))
                if rid in finished:
                    del self.streams[rid]

    def submit(self, prompts: list[list[int]], params: SamplingParams) -> _Stream:
        """Queue every prompt (checked first: a bad one queues none) on one stream."""
        for prompt in prompts:
            self.engine.check_requests([prompt], params)
        stream = _Stream({})
        for index, prompt in enumerate(prompts):
            self.pending.append((prompt, params, stream, index))
            stream.open += 1
            self.counters["prompt_tokens"] += len(prompt)
        self.counters["requests"] += len(prompts)
        self.wake.set()
        return stream

    # ---- HTTP ----------------------------------------------------------------------------
    async def completions(self, request):
        from aiohttp import web

        try:
            body = await request.json()
            prompts, params, stream_on, usage_on = parse_completion(body)
            stream = self.submit(prompts, params)
        except (ValueError, ConfigError) as e:
            return web.json_response({"error": {"message": str(e), "type": "invalid_request"}},
                                     status=400)
        cid = f"cmpl-{next(self.ids)}"
        created = int(time.time())
        head = dict(id=cid, object="text_completion", created=created, model=self.model_name)
        if not stream_on:
            tokens, reasons = [[] for _ in prompts], [None] * len(prompts)
            async for index, token, finish in _drain(stream):
                if token is not None:
                    tokens[index].append(token)
                if finish is not None:
                    reasons[index] = finish[0]
            return web.json_response(head | dict(choices=[
                dict(index=i, text="", token_ids=tokens[i], finish_reason=reasons[i],
                     logprobs=None) for i in range(len(prompts))],
                usage=usage(prompts, sum(len(t) for t in tokens))))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        generated = 0
        async for index, token, finish in _drain(stream):
            generated += token is not None
            choice = dict(index=index, text="", token_ids=[] if token is None else [token],
                          finish_reason=None if finish is None else finish[0], logprobs=None)
            await resp.write(sse(head | dict(choices=[choice])))
        if usage_on:
            await resp.write(sse(head | dict(choices=[], usage=usage(prompts, generated))))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def reset_prefix_cache(self, request):
        """vLLM's ``POST /reset_prefix_cache``: forget the cached prefixes no request holds."""
        from aiohttp import web

        return web.json_response(dict(blocks_forgotten=self.engine.reset_prefix_cache()))

    async def models(self, request):
        from aiohttp import web

        cfg = self.engine.model.config
        return web.json_response(dict(object="list", data=[dict(
            id=self.model_name, object="model", owned_by="pagebench",
            max_model_len=self.engine.max_model_len, vocab_size=cfg.vocab_size)]))

    async def metrics(self, request):
        from aiohttp import web

        return web.Response(text=self.prometheus(), content_type="text/plain")

    def prometheus(self) -> str:
        sched, bm = self.engine.scheduler, self.engine.block_manager
        values = [
            ("num_requests_running", "gauge", len(sched.running)),
            ("num_requests_waiting", "gauge", len(sched.waiting) + len(self.pending)),
            ("kv_cache_usage_perc", "gauge", bm.num_used_blocks / bm.num_blocks),
            ("num_preemptions_total", "counter", sched.num_preemptions),
            ("prefix_cache_queries_total", "counter", self.counters["prompt_tokens"]),
            ("prefix_cache_hits_total", "counter", sched.num_cached_prompt_tokens),
            ("prompt_tokens_total", "counter", self.counters["prompt_tokens"]),
            ("generation_tokens_total", "counter", self.counters["generation_tokens"]),
            ("request_success_total", "counter", self.counters["requests"]),
            ("num_steps_total", "counter", len(self.engine.step_records)),
        ]
        lines = []
        for name, kind, value in values:
            lines += [f"# TYPE pagebench:{name} {kind}",
                      f'pagebench:{name}{{model_name="{self.model_name}"}} {float(value)}']
        return "\n".join(lines) + "\n"


async def _drain(stream: _Stream):
    while stream.open:
        index, token, finish = await stream.queue.get()
        if finish is not None:
            stream.open -= 1
        yield index, token, finish


def sse(doc: dict) -> bytes:
    return f"data: {json.dumps(doc)}\n\n".encode()


def usage(prompts, generated: int) -> dict:
    prompt = sum(len(p) for p in prompts)
    return dict(prompt_tokens=prompt, completion_tokens=generated,
                total_tokens=prompt + generated)


def parse_completion(body) -> tuple[list[list[int]], SamplingParams, bool, bool]:
    """(prompts, sampling parameters, stream, include usage) of a completions request body;
    ValueError naming the field that is wrong."""
    if not isinstance(body, dict):
        raise ValueError("body: expected a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and isinstance(prompt[0], str)):
        raise ValueError("prompt: give token ids (a list of integers): this server has no "
                         "tokenizer")
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("prompt: expected a non-empty list of token ids")
    prompts = prompt if isinstance(prompt[0], list) else [prompt]
    if any(not isinstance(t, int) or isinstance(t, bool) for p in prompts for t in p):
        raise ValueError("prompt: token ids must be integers")
    n = body.get("n", 1)
    if n != 1:
        raise ValueError("n: only 1 is served over HTTP")
    params = SamplingParams(max_tokens=body.get("max_tokens", 16),
                            temperature=body.get("temperature", 1.0),
                            top_p=body.get("top_p", 1.0), seed=body.get("seed"),
                            ignore_eos=bool(body.get("ignore_eos", False)))
    options = body.get("stream_options") or {}
    return prompts, params, bool(body.get("stream", False)), bool(options.get("include_usage"))


def make_app(engine, model_name: str = "pagebench"):
    """The aiohttp application; the engine loop starts and stops with it."""
    from aiohttp import web

    server = EngineServer(engine, model_name)
    app = web.Application()
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_post("/reset_prefix_cache", server.reset_prefix_cache)

    async def loop_task(app):
        server.wake = asyncio.Event()
        server.task = asyncio.create_task(server.run())
        yield
        server.task.cancel()
        try:
            await server.task
        except asyncio.CancelledError:
            pass

    app.cleanup_ctx.append(loop_task)
    return app
