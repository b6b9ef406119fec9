"""rda.pipeline: the history recorder (journal -> Parquet) and the PySpark History API."""
