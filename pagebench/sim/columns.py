"""The column names a lengths or trace file may use (first match wins), and their help text.

Standard library only: the command line's ``--help`` quotes them without loading numpy.
"""

from __future__ import annotations

LENGTH_COLUMNS = ("length", "len", "num_tokens", "seq_len", "total_tokens")
PROMPT_COLUMNS = ("prompt_len", "prompt_tokens", "prompt_length", "input_len", "input_tokens",
                  "input_length", "ContextTokens")
OUTPUT_COLUMNS = ("output_len", "output_tokens", "output_length", "completion_tokens",
                  "GeneratedTokens")
ARRIVAL_COLUMNS = ("arrival", "arrival_step", "arrival_time", "timestamp")

LENGTHS_FILE_HELP = (
    "a FILE is one length per line, or a CSV (with a header) or JSONL file of requests whose "
    f"length column is one of {', '.join(LENGTH_COLUMNS)}, or whose prompt column ("
    f"{', '.join(PROMPT_COLUMNS)}) and output column ({', '.join(OUTPUT_COLUMNS)}) add up to "
    "it; other columns (request_id, ...) are ignored")
TRACE_FILE_HELP = (
    "a trace FILE is a CSV or JSONL of requests with an arrival column ("
    f"{', '.join(ARRIVAL_COLUMNS)}; in steps), a prompt column and an output column (as for "
    "--lengths) and optionally n; or an Azure LLM trace (TIMESTAMP, ContextTokens, "
    "GeneratedTokens) or a Mooncake JSONL (timestamp, input_length, output_length, hash_ids)")

# the columns of `pagebench simulate`'s tables: (header, meaning); the tables print these
STATIC_LEGEND = (
    ("allocated slots", "KV token slots the allocator reserves for all sequences"),
    ("utilisation", "tokens stored / slots reserved"),
    ("waste/seq", "reserved slots holding no token, per sequence"),
)
DYNAMIC_LEGEND = (
    ("tokens", "token states: slots holding a token's KV (mean share of the budget)"),
    ("reserved", "reserved ahead for tokens a running request will still write (contiguous "
     "schemes only)"),
    ("internal", "internal fragmentation: allocated slots never to be filled"),
    ("external", "external fragmentation: free slots split into holes too small for the "
     "waiting request"),
    ("free", "free slots"),
    ("util", "tokens / allocated slots"),
    ("conc", "running requests, mean over steps"),
    ("peak", "running requests, most at one step"),
    ("tok/step", "output tokens per step: throughput in this model"),
    ("refused", "reservation schemes (naive, pow2, oracle): requests turned away at least "
     "once because their whole reservation did not fit; - for paging"),
    ("waited", "paging: requests kept in the queue at least once because no block was free "
     "for their prompt (blocks are taken a token at a time, so memory runs out later and "
     "fuller, not sooner); - for reservation schemes"),
    ("frag-ref", "requests refused while the total free memory would have held them "
     "(external fragmentation at work)"),
    ("wait", "mean steps from arrival to first admission"),
    ("preempt", "preemptions (a running request's blocks freed, to be recomputed)"),
    ("steps", "steps from the first arrival to the last finish"),
)


def legend_lines(legend) -> list[str]:
    """``legend`` ((header, meaning) pairs) as aligned lines for a table's footer or --help."""
    width = max(len(h) for h, _ in legend)
    return [f"  {h:<{width}}  {m}" for h, m in legend]
