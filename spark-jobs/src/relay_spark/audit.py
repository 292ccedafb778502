"""The archive audit: read Kafka's topics with Spark's Kafka connector and check that the archive
covers every offset Kafka still holds (`relay_archive.audit` judges; this module reads).

How it runs: the broker log's epoch comes from `relay.epoch` (its first record); each archived
topic is read from its earliest to its latest offset (topic, partition and offset only); the
offsets no archive file of that epoch covers are found by a left anti join against the files'
offset ranges (broadcast: a few thousand rows), then grouped into runs of consecutive offsets
(offset minus row number), so only the runs reach the driver.

Invariants: the audit reads Kafka and the archive, never changes either; the connector's jars
are pinned (`spark-jobs/kafka/pom.xml`, fetched by `./dev setup`) and must match pyspark's
version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from relay_archive import audit, layout, reader, selection
from relay_archive.store import ArchiveStore
from relay_bus import topics


class AuditError(Exception):
    """The audit cannot run (no connector jars, no epoch record): one line saying why."""


def connector_jars() -> list[Path]:
    """The Kafka connector's jars: `RELAY_SPARK_KAFKA_JARS`, else what `./dev setup` fetched."""
    override = os.environ.get("RELAY_SPARK_KAFKA_JARS")
    folder = (
        Path(override)
        if override
        else Path(__file__).resolve().parents[3] / ".tools" / "spark-kafka" / "jars"
    )
    jars = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka-") for j in jars):
        raise AuditError(f"Spark's Kafka connector is missing from {folder}: run ./dev setup")
    return jars


def _kafka(spark: SparkSession, bootstrap: str) -> Any:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
    )


def read_epoch(spark: SparkSession, bootstrap: str, prefix: str) -> str:
    """The epoch of the broker log (the first record of `relay.epoch`)."""
    first = (
        _kafka(spark, bootstrap)
        .option("assign", json.dumps({prefix + topics.EPOCH: [0]}))
        .load()
        .orderBy("offset")
        .select("value")
        .first()
    )
    if first is None:
        raise AuditError(f"{prefix + topics.EPOCH} holds no epoch record: has Relay run there?")
    epoch: str = json.loads(bytes(first["value"]))["epoch"]
    return epoch


def run(
    spark: SparkSession, store: ArchiveStore, bootstrap: str, prefix: str = ""
) -> tuple[int, dict[str, Any]]:
    """Audit the archive against the Kafka cluster at `bootstrap`; (exit code, report)."""
    epoch = read_epoch(spark, bootstrap, prefix)
    logical = {prefix + t: t for t in selection.ARCHIVED}
    held_frame = (
        _kafka(spark, bootstrap)
        .option("subscribe", ",".join(sorted(logical)))
        .load()
        .select("topic", "partition", "offset")
        .replace(logical, subset=["topic"])
    ).cache()
    ranges = [
        (t, f.slot.partition, f.first, f.last)
        for t in selection.ARCHIVED
        for f in store.list_files(f"{layout.LAYOUT}/epoch={epoch}/topic={t}")
    ]
    files = spark.createDataFrame(
        ranges,
        T.StructType(
            [
                T.StructField("f_topic", T.StringType(), False),
                T.StructField("f_partition", T.IntegerType(), False),
                T.StructField("f_first", T.LongType(), False),
                T.StructField("f_last", T.LongType(), False),
            ]
        ),
    )
    covered = (
        (held_frame["topic"] == files["f_topic"])
        & (held_frame["partition"] == files["f_partition"])
        & held_frame["offset"].between(files["f_first"], files["f_last"])
    )
    run_of = Window.partitionBy("topic", "partition").orderBy("offset")
    runs = (
        held_frame.join(F.broadcast(files), covered, "left_anti")
        .withColumn("run", F.col("offset") - F.row_number().over(run_of))
        .groupBy("topic", "partition", "run")
        .agg(F.min("offset").alias("first"), F.max("offset").alias("last"))
        .collect()
    )
    held = {
        (r["topic"], r["partition"]): audit.Held(r["first"], r["last"], r["count"])
        for r in held_frame.groupBy("topic", "partition")
        .agg(
            F.min("offset").alias("first"),
            F.max("offset").alias("last"),
            F.count("*").alias("count"),
        )
        .collect()
    }
    held_frame.unpersist()
    uncovered = [audit.Uncovered(r["topic"], r["partition"], r["first"], r["last"]) for r in runs]
    resume = {
        (t, p): point
        for t in selection.ARCHIVED
        for p, point in reader.resume_points(store, epoch, t).items()
    }
    return audit.judge(epoch, held, uncovered, resume)
