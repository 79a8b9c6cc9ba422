"""Datasets (:mod:`pagebench.results`) -> one self-contained HTML report with a verdict per claim.

``build_report(out, device=..., quick=...)`` is the entry point behind ``pagebench report``;
``write_report(results, out, env=..., options=...)`` renders data already collected.
"""

from pagebench.report.build import build_report, write_report

__all__ = ["build_report", "write_report"]
