"""Trace readers on hostile files: any file in any of the three formats gives a workload whose
lengths and arrivals are in range, or a ConfigError that names the file, never another
exception. Each file is a valid trace with up to two fields (or whole lines) replaced by what
broken exports contain: empty, huge, negative, fractional, NaN, text, wrong JSON types, a
truncated line."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagebench.errors import ConfigError
from pagebench.sim.real_traces import load_workload
from pagebench.sim.trace import MAX_TRACE_VALUE

BAD_NUMBERS = st.one_of(
    st.integers(-5, 0), st.integers(10**12, 10**30), st.floats(allow_nan=True,
                                                                allow_infinity=True),
    st.sampled_from([1e300, 2.5, -0.0]))
BAD_CELLS = st.one_of(BAD_NUMBERS.map(str), st.sampled_from(["", " ", "x", "1,2", '"', "0x10",
                                                             "not a date", "9999-12-31"]))
BAD_JSON = st.one_of(BAD_NUMBERS, st.none(), st.booleans(), st.text(max_size=3),
                     st.lists(st.integers(-2, 2**64), max_size=3))
DATES = st.sampled_from(["2023-11-16 18:17:03.9799600", "2023-11-16T18:17:04+01:00",
                         "2023-11-16 18:17:05", "2023-11-17 01:00:00.5"])
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
STEPS_HEADER = "arrival,prompt_len,output_len"


def csv_rows(first):
    """Valid rows of three columns, ``first`` drawn by the given strategy."""
    return st.lists(st.tuples(first, st.integers(1, 5000), st.integers(1, 500))
                    .map(lambda r: [str(x) for x in r]), min_size=1, max_size=4)


def mooncake_row(t, p, o):
    return {"timestamp": t, "input_length": p, "output_length": o,
            "hash_ids": list(range(-(-p // 512)))}


MOONCAKE_ROWS = st.lists(st.builds(mooncake_row, st.integers(0, 10**7), st.integers(1, 3000),
                                   st.integers(1, 500)), min_size=1, max_size=4)


@st.composite
def files(draw):
    """``(name, text)`` of a trace with up to two broken fields or lines."""
    kind = draw(st.sampled_from(["azure", "mooncake", "steps"]))
    if kind == "mooncake":
        rows = draw(MOONCAKE_ROWS)
        for _ in range(draw(st.integers(0, 2))):
            row = rows[draw(st.integers(0, len(rows) - 1))]
            key = draw(st.sampled_from(sorted(row)))
            if draw(st.booleans()):
                row[key] = draw(BAD_JSON)
            else:
                del row[key]
        lines = [json.dumps(r) for r in rows]
        if draw(st.integers(0, 4)) == 0:
            lines[-1] = lines[-1][:-2]  # a file cut short
        return "m.jsonl", "\n".join(lines) + "\n"
    rows = draw(csv_rows(DATES if kind == "azure" else st.integers(0, 100)))
    for _ in range(draw(st.integers(0, 2))):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        column = draw(st.integers(0, 3))
        if column == 3:
            row.append("extra")
        else:
            row[column] = draw(BAD_CELLS)
    header = AZURE_HEADER if kind == "azure" else STEPS_HEADER
    return f"{kind}.csv", "\n".join([header] + [",".join(r) for r in rows]) + "\n\n"


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files())
def test_any_trace_file_reads_or_names_itself_in_a_config_error(tmp_path, file):
    name, text = file
    path = tmp_path / name
    path.write_text(text)
    try:
        w = load_workload(str(path))
    except ConfigError as e:
        assert name in str(e)
        event(f"{name}: refused")
        return
    event(f"{name}: read")
    assert (w.prompt_len >= 1).all() and (w.output_len >= 1).all()
    assert (w.arrival >= 0).all() and w.length.max() <= 2 * MAX_TRACE_VALUE
