"""rda.pipeline: the history recorder (journal -> Parquet) and the PySpark History API.

Needs the ``[pipeline]`` extra (pyarrow; pyspark for the History API). The core library never
imports this package.
"""

from rda.pipeline.converter import Converter, compact
from rda.pipeline.metrics import start_recorder_metrics
from rda.pipeline.recorder import Recorder, RecorderStatistics, Sample
from rda.pipeline.schema import SchemaCatalog

__all__ = [
    "Converter",
    "Recorder",
    "RecorderStatistics",
    "Sample",
    "SchemaCatalog",
    "compact",
    "start_recorder_metrics",
]
