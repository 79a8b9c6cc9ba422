"""An analysed :class:`~pagebench.results.Results` -> one self-contained HTML report.

``write_report(results, out, env=..., options=...)`` renders data already gathered and the
tables and verdicts :func:`pagebench.analysis.analyse` derived from it; it measures and computes
nothing (``pagebench report`` runs :func:`pagebench.suite.build_report`, which gathers,
analyses, then calls it). :mod:`.outputs` says what it may write over; importing it alone (as
``pagebench claims`` does) does not load the renderer and its plotting.
"""

__all__ = ["write_report"]


def __getattr__(name: str):
    if name == "write_report":
        from pagebench.report.build import write_report

        return write_report
    raise AttributeError(f"module 'pagebench.report' has no attribute {name!r}")
