"""The memory and capacity simulators' rows as datasets.

The simulators (``pagebench.sim``) return plain rows and columns and know nothing of the
report's datasets; each function here runs one and checks its output against the dataset
schema that names it (:mod:`pagebench.results.datasets`), so a simulator that leaves out a
required column fails where the rows are made, not in the report.
"""

from __future__ import annotations

from pagebench.results.datasets import (CAPACITY, CAPACITY_ARTICLE, KV_GEOMETRY, MEMORY_MAX_LEN,
                                        MEMORY_STATIC, MEMORY_DYNAMIC_SUMMARY,
                                        MEMORY_DYNAMIC_TIMELINE)
from pagebench.sim import capacity, dynamic, static


def utilisation_rows(*args, **kwargs) -> list[dict]:
    """:func:`pagebench.sim.static.utilisation_rows`, rows of ``memory_static``."""
    return [MEMORY_STATIC.row(**r) for r in static.utilisation_rows(*args, **kwargs)]


def max_len_rows(*args, **kwargs) -> list[dict]:
    """:func:`pagebench.sim.static.max_len_rows`, rows of ``memory_max_len``."""
    return [MEMORY_MAX_LEN.row(**r) for r in static.max_len_rows(*args, **kwargs)]


def geometry_rows(*args, **kwargs) -> list[dict]:
    """:func:`pagebench.sim.capacity.geometry_rows`, rows of ``kv_geometry``."""
    return [KV_GEOMETRY.row(**r) for r in capacity.geometry_rows(*args, **kwargs)]


def article_capacity(**overrides) -> dict:
    """:func:`pagebench.sim.capacity.article_capacity`, the row of ``capacity_article``."""
    return CAPACITY_ARTICLE.row(**capacity.article_capacity(**overrides))


def planner_case_rows(*args, **kwargs) -> tuple[list, list]:
    """:func:`pagebench.sim.capacity.planner_case_rows`: (rows of ``capacity``, errors)."""
    rows, errors = capacity.planner_case_rows(*args, **kwargs)
    return [CAPACITY.row(**r) for r in rows], errors


def reference_run(**kwargs) -> dynamic.DynamicResult:
    """:func:`pagebench.sim.dynamic.reference_run`, its summary rows those of
    ``memory_dynamic_summary`` and its timeline the table of ``memory_dynamic_timeline``."""
    result = dynamic.reference_run(**kwargs)
    for row in result.summary:
        MEMORY_DYNAMIC_SUMMARY.row(**row)
    MEMORY_DYNAMIC_TIMELINE.table(result.timeline_columns)
    return result
