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
