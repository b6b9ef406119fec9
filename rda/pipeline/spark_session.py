"""A local SparkSession with the settings the History API and its tests rely on.

One place fixes them so ``History.local`` and the shared test fixture run with exactly the same
configuration: no UI (no port to collide with other jobs on a shared machine), UTC session time
(the store's ``ts`` column is UTC and windows are given in UTC), two shuffle partitions (a local
store is small; the default 200 tasks cost seconds per query), and Python data-source filter
pushdown (the ``rda-journal`` streaming source prunes segments with it).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

#: Settings applied to every local session; exposed so cluster jobs can reuse the relevant ones.
LOCAL_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def local_session(master: str = "local[*]", app_name: str = "rda") -> SparkSession:
    """Return a SparkSession on this machine (``getOrCreate``: an active one is reused).

    The driver binds to 127.0.0.1 so a machine with no resolvable hostname, or one on a VPN, still
    starts; logging is reduced to warnings so a test run is not drowned in INFO lines.
    """
    # The JVM reads SPARK_LOCAL_IP when it starts; setdefault keeps a caller's explicit choice.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run this interpreter (the venv with rda), not whatever `python3` is.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in LOCAL_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
