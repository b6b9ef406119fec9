"""rda.pipeline.recorder: recording subscriptions to Parquet.

service.py (``Recorder``) subscribes and appends every update to the journal (journal.py,
Arrow IPC segments written durably); converter.py turns closed segments into the Parquet
store (store.py: local directory or URI) under the schemas of schema.py; metrics.py serves the
recorder's Prometheus endpoint; cli.py is ``rda record`` and ``rda compact``.

May import: ``rda.business``, ``rda.transport``, ``rda.serialization``, ``rda.admin``;
never ``rda.pipeline.history`` or ``rda.pipeline.stream``. Never pyspark.
"""
