"""Datasets (:mod:`pagebench.results`) -> one self-contained HTML report with a verdict per claim.

``write_report(results, out, env=..., options=...)`` renders data already gathered; it measures
nothing (``pagebench report`` runs :func:`pagebench.suite.build_report`, which gathers, then
calls it).
"""

from pagebench.report.build import write_report

__all__ = ["write_report"]
