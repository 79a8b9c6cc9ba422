"""Results: one schema per dataset (:mod:`.datasets`), written by whoever measures it and read
back, checked (:mod:`.read`, :mod:`.history`); :mod:`.devices` names the device of every row.
The tables and verdicts :mod:`pagebench.analysis` derives are kept beside the datasets
(:data:`.datasets.DERIVED`, :mod:`.derived`) for the report to render.

The readers (``Results``, ``load_data_dir``, ``read_table``) load pandas, so they are imported
on first use: a writer that needs only a schema (the simulators) does not pay for pandas.
"""

from pagebench.results.datasets import (
    DATASETS, FILE_KINDS, classify, is_report_output, report_data_dir)
from pagebench.results.schema import Column, DataError, Schema

READERS = ("Results", "load_data_dir", "read_table")

__all__ = ["DATASETS", "FILE_KINDS", "Column", "DataError", "Results", "Schema", "classify",
           "is_report_output", "load_data_dir", "read_table", "report_data_dir"]


def __getattr__(name: str):
    if name in READERS:
        from pagebench.results import read

        return getattr(read, name)
    raise AttributeError(f"module 'pagebench.results' has no attribute {name!r}")
