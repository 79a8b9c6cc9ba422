"""Serving measured against a running OpenAI-compatible server (``pagebench serve``, vLLM,
SGLang): each request is a streamed ``/v1/completions`` call sent at its arrival time, timed
from its Server-Sent Events chunks, one chunk a token (vLLM's benchmark counts them so too).

TTFT is the first chunk's time - the send time; there is no "first scheduled" (queueing time is
not seen from outside). The server's Prometheus ``/metrics`` is read before and after the run,
and every ``METRICS_EVERY_S`` during it, where it answers (its prefix cache is emptied first
through ``POST /reset_prefix_cache`` where it has that): KV-cache usage (its peak), running
and waiting requests, preemptions and prefix-cache hits (vLLM's names, ``vllm:`` or
``pagebench:`` prefix).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from pagebench.errors import ConfigError
from pagebench.sim.latency import RequestTiming

METRICS_EVERY_S = 0.25
GAUGES = ("kv_cache_usage_perc", "gpu_cache_usage_perc", "num_requests_running",
          "num_requests_waiting")
COUNTERS = ("num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total")
PREFIXES = ("vllm:", "pagebench:")


def parse_prometheus(text: str) -> dict[str, float]:
    """Known metric name (prefix dropped) -> value summed over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{")[0]
        prefix = next((p for p in PREFIXES if name.startswith(p)), None)
        try:
            number = float(value)
        except ValueError:
            continue
        if prefix is not None:
            key = name[len(prefix):]
            out[key] = out.get(key, 0.0) + number
    return out


@dataclass(slots=True)
class EndpointRun:
    requests: list[RequestTiming]
    token_ids: list[list[int]]  # per request, where the server sends them (pagebench's does)
    duration_s: float
    server: dict | None  # what /metrics said: peaks of its gauges, changes of its counters


async def _stream_one(session, url: str, model: str, request, timing: RequestTiming,
                      tokens: list[int], t0: float, clock) -> None:
    body = dict(model=model, prompt=request.prompt, max_tokens=request.params.max_tokens,
                temperature=0.0, ignore_eos=True, stream=True)
    await asyncio.sleep(max(0.0, request.arrival_s - (clock() - t0)))
    timing.arrival_s = clock() - t0  # the send time: the server's clock starts here
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise ConfigError(f"endpoint: {url} answered {resp.status}: "
                              f"{(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            choices = json.loads(data).get("choices") or []
            if choices and (choices[0].get("text") or choices[0].get("token_ids")):
                timing.token_s.append(clock() - t0)
                tokens += choices[0].get("token_ids") or []
    timing.finish_s = clock() - t0


async def _scrape(session, url: str) -> dict[str, float] | None:
    try:
        async with session.get(f"{url}/metrics") as resp:
            return parse_prometheus(await resp.text()) if resp.status == 200 else None
    except Exception:  # noqa: BLE001 -- a server without /metrics: nothing to read
        return None


async def serve_endpoint_async(url: str, requests, model: str,
                               clock=time.perf_counter) -> EndpointRun:
    """Send every request at its time and time its stream (see the module doc)."""
    import aiohttp

    url = url.rstrip("/")
    timings = [RequestTiming(r.arrival_s, len(r.prompt)) for r in requests]
    tokens: list[list[int]] = [[] for _ in requests]
    peaks: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        try:  # pagebench's and vLLM's: a run finds nothing an earlier one left
            await (await session.post(f"{url}/reset_prefix_cache")).release()
        except Exception:  # noqa: BLE001 -- a server without it keeps its cache
            pass
        before = await _scrape(session, url)
        t0 = clock()
        sends = asyncio.gather(*(_stream_one(session, url, model, r, t, ids, t0, clock)
                                 for r, t, ids in zip(requests, timings, tokens)))
        while not sends.done():
            sample = await _scrape(session, url) if before is not None else None
            for name in GAUGES:
                if sample and name in sample:
                    peaks[name] = max(peaks.get(name, 0.0), sample[name])
            await asyncio.wait([sends], timeout=METRICS_EVERY_S)
        await sends
        duration = clock() - t0
        after = await _scrape(session, url)
    server = None
    if before is not None and after is not None:
        server = {f"peak_{k}": v for k, v in peaks.items()} | {
            k: after[k] - before.get(k, 0.0) for k in COUNTERS if k in after}
    return EndpointRun(timings, tokens, duration, server)


def serve_endpoint(url: str, requests, model: str = "pagebench") -> EndpointRun:
    return asyncio.run(serve_endpoint_async(url, requests, model))


async def server_info(url: str) -> dict:
    """The first model /v1/models lists (``id``, and where given ``vocab_size``)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url.rstrip('/')}/v1/models") as resp:
            if resp.status != 200:
                raise ConfigError(f"endpoint: {url}/v1/models answered {resp.status}")
            data = (await resp.json()).get("data") or []
    if not data:
        raise ConfigError(f"endpoint: {url}/v1/models lists no model")
    return data[0]
