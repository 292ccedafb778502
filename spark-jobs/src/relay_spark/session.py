"""The Spark session of every job: `local[2]` by default (any master in production), bound to
127.0.0.1 locally, UI off unless asked, Python workers on this interpreter (so they import the
same `relay_archive` as the driver).

Invariant: one session per process (`getOrCreate`); jobs take it as an argument, so tests share
one per module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

# Spark's own default (1g) is too small for a rebuild's cached rows at 20M archived records
# (decision 0012); past the heap they spill to disk (`jobs._write`).
DRIVER_MEMORY = "4g"


def session(
    master: str = "local[2]",
    *,
    ui: bool = False,
    app: str = "relay",
    jars: Sequence[Path] = (),
    driver_memory: str | None = None,
) -> SparkSession:
    """`jars`: more jars for the driver and executors (the Kafka connector's); `driver_memory`:
    the driver JVM's heap (`DRIVER_MEMORY` by default), which in local mode holds the
    executors' cached blocks too. Both count only when this call creates the session (the JVM
    starts with it)."""
    # Python workers are started by the JVM from PYSPARK_PYTHON (in local mode the
    # `spark.pyspark.python` setting is read only by spark-submit): this interpreter, so they
    # see this virtual environment's packages. The JVM inherits it when the session starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.driver.memory", driver_memory or DRIVER_MEMORY)
        # Small archives and 2 cores: the default 200 shuffle partitions cost more than the work.
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
