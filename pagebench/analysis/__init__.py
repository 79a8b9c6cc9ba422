"""Everything computed from a :class:`~pagebench.results.Results`: derived tables, the
recommended block size and a verdict on every claim, added to it by :func:`analyse` as data
(schemas: :data:`pagebench.results.datasets.DERIVED`) for the report to render.

It reads datasets and nothing else: it imports ``results`` and ``config``, never the report nor
a subsystem that measures (``tests/test_architecture.py`` checks).
"""

from pagebench.analysis.pipeline import analyse

__all__ = ["analyse"]
