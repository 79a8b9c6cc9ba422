"""An analysed :class:`~pagebench.results.Results` -> one self-contained HTML report.

``write_report(results, out, env=..., options=...)`` renders data already gathered and the
tables and verdicts :func:`pagebench.analysis.analyse` derived from it; it measures and computes
nothing (``pagebench report`` runs :func:`pagebench.suite.build_report`, which gathers,
analyses, then calls it).
"""

from pagebench.report.build import write_report

__all__ = ["write_report"]
