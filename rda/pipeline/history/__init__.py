"""rda.pipeline.history: reading what the recorder stored.

api.py is the PySpark ``History`` API (``rda.pipeline.History``); ops.py its column
operations; paths.py turns signals and time ranges into the exact store files; local.py reads
without Spark (pyarrow only); cli.py is ``rda history``.

May import: ``rda.pipeline.recorder`` (store and schema), ``rda.pipeline.spark_session`` and
the layers below; never ``rda.pipeline.stream``.
"""
