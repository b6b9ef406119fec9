"""rda.pipeline.stream: Spark Structured Streaming sources over the recorder's journal.

sources.py registers the data sources; rows.py turns journal segments into Spark rows;
live.py follows a live journal.

May import: ``rda.pipeline.recorder``, ``rda.pipeline.spark_session`` and the layers below;
never ``rda.pipeline.history``.
"""
