"""rda.pipeline: the history recorder (journal -> Parquet) and the PySpark History API.

Needs the ``[pipeline]`` extra (pyarrow; pyspark for the History API). The core library never
imports this package. ``History``, ``to_pandas`` and ``local_session`` are loaded on first use,
so a recorder never pays for importing pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rda.pipeline.recorder.compaction import compact
from rda.pipeline.recorder.converter import Converter
from rda.pipeline.recorder.metrics import start_recorder_metrics
from rda.pipeline.recorder.schema import SchemaCatalog
from rda.pipeline.recorder.service import Recorder, RecorderStatistics, Sample

if TYPE_CHECKING:
    from rda.pipeline.history.api import History, to_pandas
    from rda.pipeline.spark_session import local_session

__all__ = [
    "Converter",
    "History",
    "Recorder",
    "RecorderStatistics",
    "Sample",
    "SchemaCatalog",
    "compact",
    "local_session",
    "start_recorder_metrics",
    "to_pandas",
]

_LAZY = {
    "History": "rda.pipeline.history.api",
    "to_pandas": "rda.pipeline.history.api",
    "local_session": "rda.pipeline.spark_session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rda.pipeline' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
