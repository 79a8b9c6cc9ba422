"""Results: one schema per dataset (:mod:`.datasets`), written by whoever measures it and read
back, checked, by the report (:mod:`.read`, :mod:`.history`); :mod:`.devices` names the device
of every row."""

from pagebench.results.datasets import DATASETS, FILE_KINDS, classify
from pagebench.results.read import Results, load_data_dir, read_table
from pagebench.results.schema import Column, DataError, Schema

__all__ = ["DATASETS", "FILE_KINDS", "Column", "DataError", "Results", "Schema", "classify",
           "load_data_dir", "read_table"]
