"""Hourly statistics of one day of every recorded signal, written as Parquet: a spark-submit job.

    spark-submit --master local[2] examples/history_job.py ROOT OUT DAY [PATTERN]

``ROOT`` is the recorder's store (a path, or a URI such as ``s3://bucket/history``), ``OUT``
the output directory (replaced; for Spark, so ``s3a://`` on S3), ``DAY`` a UTC day
``YYYY-MM-DD``, ``PATTERN`` the signals (default ``*/*``). The same file runs unchanged on a
cluster (``--master spark://host:7077``) when every node reaches ROOT and OUT under the same
name and rda is importable on the executors (docs/history.md, "Running on a cluster");
``examples/cluster_check.py`` runs it on a standalone cluster on this machine.
"""

from __future__ import annotations

import datetime
import sys

from pyspark.sql import SparkSession

from rda.pipeline.history.api import History


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    root, out, day = argv[:3]
    pattern = argv[3] if len(argv) == 4 else "*/*"
    start = datetime.datetime.fromisoformat(day).replace(tzinfo=datetime.UTC)
    end = start + datetime.timedelta(days=1)
    # spark-submit supplies the master and resources; the job fixes what its results depend on.
    spark = SparkSession.builder.appName(f"rda-history-stats-{day}").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        stats = History(spark, root).stats(pattern, start, end, every="1h")
        stats.write.mode("overwrite").parquet(out)
        rows = spark.read.parquet(out).count()  # reading back is cheaper than recomputing
        print(f"{rows} rows of hourly statistics for {day} written to {out}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
