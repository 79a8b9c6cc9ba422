"""The real-trace study's tables as datasets.

:func:`pagebench.sim.real_traces.study_traces` returns one DataFrame per kind (``static``,
``dynamic``, ``timeline``, ``goodput``, ``prefix``); :func:`study_traces` here runs it and
checks each against the schema of dataset ``real_traces_<kind>``
(:mod:`pagebench.results.datasets`).
"""

from __future__ import annotations

from pagebench.results.datasets import (REAL_TRACES_DYNAMIC, REAL_TRACES_GOODPUT,
                                        REAL_TRACES_PREFIX, REAL_TRACES_STATIC,
                                        REAL_TRACES_TIMELINE)
from pagebench.sim import real_traces

def study_traces(*args, **kwargs) -> dict:
    """:func:`pagebench.sim.real_traces.study_traces`, each table checked against its dataset
    (a kind with no rows, e.g. ``prefix`` when no trace has hash ids, has nothing to check)."""
    schemas = {"static": REAL_TRACES_STATIC, "dynamic": REAL_TRACES_DYNAMIC,
               "timeline": REAL_TRACES_TIMELINE, "goodput": REAL_TRACES_GOODPUT,
               "prefix": REAL_TRACES_PREFIX}
    frames = real_traces.study_traces(*args, **kwargs)
    for kind, frame in frames.items():
        if len(frame):
            schemas[kind].table(frame)
    return frames
