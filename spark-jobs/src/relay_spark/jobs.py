"""The PySpark jobs: `rebuild_queues`, `rebuild_retained`, `rebuild_streams` and `verify`, over
the archive's Parquet layout (`relay_archive.layout`, whose `partition=P` folders Spark reads as
a column).

How a rebuild runs: the requests of one epoch (deduplicated by partition and offset, then cut),
left-joined with the first reply archived for each id, grouped by Kafka partition, each
partition's requests sorted by offset and replayed by `relay_archive.replay` on a worker: a
queue's commands all live on one partition, so a partition's replay is complete. The output is
the tables of `relay_archive.tables`, the same the plain-Python rebuild writes.

How verify runs: each table of the rebuilt state is fully outer-joined with the export's on its
key; rows equal on both sides are dropped by Spark; the rest (few) are classified on the driver
by `relay_archive.verify`'s pure functions, with the archive's health checked from its file
names and footers.

Invariants: jobs read, never change, the archive; outputs are written whole per table
(`mode("overwrite")`), one file per table part.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from relay_archive import export, layout, reader, replay, report, standing, tables, verify
from relay_archive import rebuild as rebuild_module
from relay_archive import rows as archive_rows
from relay_archive.store import ArchiveStore
from relay_bus import topics

_TYPES = {
    pa.string(): T.StringType(),
    pa.int64(): T.LongType(),
    pa.int32(): T.IntegerType(),
    pa.bool_(): T.BooleanType(),
    pa.binary(): T.BinaryType(),
}


def spark_schema(schema: pa.Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, _TYPES[f.type], f.nullable) for f in schema])


def read_topic(
    spark: SparkSession,
    store: ArchiveStore,
    epoch: str,
    topic: str,
    kinds: list[str],
    *,
    skip_corrupt: bool = False,
) -> DataFrame:
    """One topic of one epoch, once per (partition, offset), only `kinds`. A file Spark
    cannot read fails the job, unless `skip_corrupt` (verify's chart, drawn beside a health
    check that reports the file: a damaged file must give exit 2, not a crash)."""
    folder = f"{layout.LAYOUT}/epoch={epoch}/topic={topic}"
    schema = spark_schema(archive_rows.SCHEMA).add("partition", T.IntegerType(), False)
    if not store.list_files(folder):
        return spark.createDataFrame([], schema)
    path = f"{store.root.rstrip('/')}/{folder}"
    reading = spark.read.option("basePath", path)
    if skip_corrupt:
        reading = reading.option("ignoreCorruptFiles", "true")
    frame = reading.parquet(path)
    return (
        frame.where(F.col("kind").isin(kinds))
        .dropDuplicates(["partition", "offset"])
        .select(*schema.fieldNames())
    )


def _answered(
    spark: SparkSession,
    store: ArchiveStore,
    cut: tables.Cut,
    topic: str,
    kinds: list[str],
    reply_kind: str,
) -> DataFrame:
    """Requests before the cut's `offsets` (every one when None) with their first reply."""
    requests = read_topic(spark, store, cut.epoch, topic, kinds)
    if cut.offsets is not None:
        bounds = list(cut.offsets.items())
        ends = spark.createDataFrame(bounds or [(-1, 0)], "cut_partition int, cut_end long")
        requests = requests.join(
            F.broadcast(ends), requests.partition == ends.cut_partition, "inner"
        ).where(F.col("offset") < F.col("cut_end"))
    replies = read_topic(spark, store, cut.epoch, topics.INGRESS_INBOX, [reply_kind])
    first = Window.partitionBy("id").orderBy("partition", "offset")
    replies = (
        replies.withColumn("n", F.row_number().over(first))
        .where(F.col("n") == 1)
        .select(F.col("id").alias("reply_id"), F.col("value").alias("reply"))
    )
    joined = requests.join(replies, requests.id == replies.reply_id, "left")
    return joined.select("partition", "offset", "value", "reply")


def _grouped(frame: DataFrame) -> Any:
    return frame.rdd.map(
        lambda r: (
            r["partition"],
            (r["offset"], bytes(r["value"]), None if r["reply"] is None else bytes(r["reply"])),
        )
    ).groupByKey()


def _in_order(
    item: tuple[int, Iterable[tuple[int, bytes, bytes | None]]],
) -> Iterator[replay.Answered]:
    """One Kafka partition's archived requests, in offset order, for the pure replay."""
    partition, requests = item
    for offset, value, reply in sorted(requests, key=lambda r: r[0]):
        yield replay.Answered(partition, offset, value, reply)


def _replay_queue_partition(
    item: tuple[int, Iterable[tuple[int, bytes, bytes | None]]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    answered = _in_order(item)
    state = replay.replay_queues(answered)
    for row in tables.queue_rows(state):
        yield "queues", row
    for row in tables.message_rows(state):
        yield "messages", row
    for row in tables.uncertain_rows(state.uncertain):
        yield "uncertain", row


def _replay_retained_partition(
    cut: standing.PublicationCut,
    item: tuple[int, Iterable[tuple[int, bytes, bytes | None]]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    answered = _in_order(item)
    state = replay.replay_retained(answered, cut=cut)
    for row in tables.retained_rows(state):
        yield "retained", row
    for row in tables.uncertain_rows(state.uncertain):
        yield "uncertain", row


def _replay_stream_partition(
    cut: standing.PublicationCut,
    item: tuple[int, Iterable[tuple[int, bytes, bytes | None]]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    answered = _in_order(item)
    state = replay.replay_streams(answered, cut=cut)
    for row in tables.stream_rows(state):
        yield "streams", row
    for row in tables.uncertain_rows(state.uncertain):
        yield "uncertain", row


def _write(spark: SparkSession, produced: Any, modes: dict[str, str], out: Path) -> dict[str, int]:
    """Each table's rows into `out/<table>/` (mode `overwrite`, or `append` to add a part)."""
    # Read once per table: kept, spilling to local disk past the heap (MEMORY_ONLY, `cache()`,
    # ran the driver out of heap at 20M archived records), and computed first on its own, one
    # task per partition: left to the first table's `coalesce(1)` write, the replay of every
    # partition ran in that write's one task, on one core.
    produced = produced.persist(StorageLevel.MEMORY_AND_DISK)
    produced.count()
    written = {}
    for name, mode in modes.items():
        schema = spark_schema(tables.SCHEMAS[name])
        fields = schema.fieldNames()
        part = produced.filter(lambda r, name=name: r[0] == name).map(
            lambda r, fields=fields: tuple(r[1][f] for f in fields)
        )
        frame = spark.createDataFrame(part, schema)
        frame.coalesce(1).write.mode(mode).parquet(str(out / name))
        written[name] = frame.count()
    produced.unpersist()
    return written


def rebuild_queues(
    spark: SparkSession, store: ArchiveStore, cut: tables.Cut, out: Path
) -> dict[str, int]:
    """Queues, messages and uncertain commands as of `cut`, into `out/<table>/`."""
    frame = _answered(spark, store, cut, topics.QUEUE_COMMANDS, ["queue_cmd"], "queue_reply")
    produced = _grouped(frame).flatMap(_replay_queue_partition)
    modes = {"queues": "overwrite", "messages": "overwrite", "uncertain": "overwrite"}
    return _write(spark, produced, modes, out)


def rebuild_retained(
    spark: SparkSession, store: ArchiveStore, cut: tables.Cut, out: Path
) -> dict[str, int]:
    """Retained messages from the archived publications the retainers' cut holds (every one
    without a publications cut; `relay_archive.standing`, applied by the replay on the
    workers) into `out/retained/`; its uncertain writes are added to `out/uncertain/` (run
    after `rebuild_queues`, which overwrites it)."""
    everything = tables.Cut(cut.epoch, cut.at_ms)
    kinds = ["publication", "retained_request"]
    frame = _answered(spark, store, everything, topics.PUBLICATIONS, kinds, "ds_reply")
    replay_partition = functools.partial(_replay_retained_partition, cut.publication_cut())
    produced = _grouped(frame).flatMap(replay_partition)
    return _write(spark, produced, {"retained": "overwrite", "uncertain": "append"}, out)


def rebuild_streams(
    spark: SparkSession, store: ArchiveStore, cut: tables.Cut, out: Path
) -> dict[str, int]:
    """Durable-stream messages of every acknowledged write into `out/streams/`; unanswered
    writes are added to `out/uncertain/` (run after `rebuild_queues`)."""
    everything = tables.Cut(cut.epoch, cut.at_ms)
    frame = _answered(spark, store, everything, topics.PUBLICATIONS, ["ds_request"], "ds_reply")
    replay_partition = functools.partial(_replay_stream_partition, cut.publication_cut())
    produced = _grouped(frame).flatMap(replay_partition)
    return _write(spark, produced, {"streams": "overwrite", "uncertain": "append"}, out)


def rebuild(spark: SparkSession, store: ArchiveStore, cut: tables.Cut, out: Path) -> dict[str, int]:
    """Every rebuild into one folder of tables (`uncertain` holding every kind), and the cut
    they stand at (`cut.json`, what a restore marks)."""
    queues = rebuild_queues(spark, store, cut, out)
    retained = rebuild_retained(spark, store, cut, out)
    streams = rebuild_streams(spark, store, cut, out)
    (out / "cut.json").write_text(cut.to_json())
    return {
        **queues,
        "retained": retained["retained"],
        "streams": streams["streams"],
        "uncertain": queues["uncertain"] + retained["uncertain"] + streams["uncertain"],
    }


def rebuild_python(store: ArchiveStore, cut: tables.Cut, out: Path) -> dict[str, int]:
    """The same tables from the plain-Python rebuild (`relay_archive.rebuild`)."""
    queues = rebuild_module.rebuild_queues(store, cut)
    retained = rebuild_module.rebuild_retained(store, cut)
    streams = rebuild_module.rebuild_streams(store, cut)
    written = {
        "queues": tables.queue_rows(queues),
        "messages": tables.message_rows(queues),
        "retained": tables.retained_rows(retained),
        "streams": tables.stream_rows(streams),
        "uncertain": tables.uncertain_rows(
            queues.uncertain + retained.uncertain + streams.uncertain
        ),
    }
    for name, table_rows in written.items():
        shutil.rmtree(out / name, ignore_errors=True)
        tables.write_table(out, name, table_rows)
    (out / "cut.json").write_text(cut.to_json())
    return {name: len(table_rows) for name, table_rows in written.items()}


_KEYS = {"queues": "queue", "messages": "msg_id", "retained": "topic"}
_COMPARED = {
    "queues": ["sender", "recipient_key", "status"],
    "messages": ["queue", "body", "quota", "ts"],
    "retained": ["payload", "ts", "expires_ms"],
}


def _read_table(spark: SparkSession, folder: Path, name: str) -> DataFrame:
    """`folder/name/` as written by `_write` or `tables.write_table` (empty if it has no part)."""
    parts = folder / name
    schema = spark_schema(tables.SCHEMAS[name])
    if parts.is_dir() and any(parts.glob("*.parquet")):
        return spark.read.schema(schema).parquet(str(parts))
    return spark.createDataFrame([], schema)


def _differing(
    spark: SparkSession, rebuilt: Path, live: Path, name: str
) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """Pairs (rebuilt row, live row) whose compared columns differ or that exist on one side."""
    schema = spark_schema(tables.SCHEMAS[name])
    key = _KEYS[name]

    def load(folder: Path, side: str) -> DataFrame:
        frame = _read_table(spark, folder, name)
        return frame.select([F.col(c).alias(f"{side}_{c}") for c in schema.fieldNames()])

    r, lv = load(rebuilt, "r"), load(live, "l")
    joined = r.join(lv, r[f"r_{key}"] == lv[f"l_{key}"], "full_outer")
    same = F.lit(True)
    for column in _COMPARED[name]:
        equal = F.col(f"r_{column}").eqNullSafe(F.col(f"l_{column}"))
        if name == "messages" and column == "ts":
            equal = equal | F.coalesce(F.col("r_quota"), F.lit(False))  # markers carry no ts
        same = same & equal
    found = []
    for row in joined.where(~same).collect():
        values = row.asDict()
        mine = {c: values[f"r_{c}"] for c in schema.fieldNames()}
        theirs = {c: values[f"l_{c}"] for c in schema.fieldNames()}
        found.append(
            (mine if mine[key] is not None else None, theirs if theirs[key] is not None else None)
        )
    return found


def _stream_differences(
    spark: SparkSession, rebuilt: Path, live: Path, uncertain: verify.Uncertainty
) -> list[verify.Difference]:
    """Stream messages held a different number of times by the rebuild and live: each side
    counted per `verify.STREAM_KEY` by Spark, the few unequal counts classified on the driver."""
    key = list(verify.STREAM_KEY)

    def counted(folder: Path, column: str) -> DataFrame:
        return _read_table(spark, folder, "streams").groupBy(*key).agg(F.count("*").alias(column))

    joined = counted(rebuilt, "rebuilt").join(counted(live, "live"), key, "full_outer")
    unequal = joined.fillna(0, ["rebuilt", "live"]).where(F.col("rebuilt") != F.col("live"))
    found = []
    for row in unequal.collect():
        values = row.asDict()
        message = {f: values[f] for f in key}
        difference = verify.classify_stream(message, values["rebuilt"], values["live"], uncertain)
        if difference is not None:
            found.append(difference)
    return found


def verify_job(
    spark: SparkSession, store: ArchiveStore, cut: tables.Cut, rebuilt: Path, live: Path
) -> tuple[int, dict[str, Any]]:
    """Classify every difference between `rebuilt` and `live`; returns (exit code, report)."""
    uncertain_rows = tables.read_table(rebuilt, "uncertain").to_pylist()
    uncertain = verify.Uncertainty.of(uncertain_rows)
    differences: list[verify.Difference] = []
    covers = export.covered(live)
    for name in ("queues", "messages", "retained"):
        if name not in covers:
            continue
        for mine, theirs in _differing(spark, rebuilt, live, name):
            if name == "queues":
                found = verify.classify_queue(mine, theirs, uncertain)
            elif name == "messages":
                found = verify.classify_message(mine, theirs, uncertain, cut.at_ms)
            else:
                found = verify.classify_retained(mine, theirs, uncertain, cut.at_ms)
            if found is not None:
                differences.append(found)
    if "streams" in covers:
        differences.extend(_stream_differences(spark, rebuilt, live, uncertain))
    differences.sort(key=lambda d: (d.what, d.key))
    health = verify.check_archive(store, cut)
    code = verify.exit_code(health, differences)
    commands = read_topic(
        spark, store, cut.epoch, topics.QUEUE_COMMANDS, ["queue_cmd"], skip_corrupt=True
    )
    per_minute = (
        commands.groupBy((F.col("timestamp_ms") / 60000).cast("long").alias("minute"))
        .count()
        .orderBy("minute")
        .collect()
    )
    coverage = [(int(r["minute"]), int(r["count"])) for r in per_minute]
    cut_doc = {"epoch": cut.epoch, "at_ms": cut.at_ms, "offsets": cut.offsets, "tables": covers}
    doc = report.document(verify.counts(differences), differences, health, coverage, cut_doc, code)
    return code, doc


def verify_python(
    store: ArchiveStore, cut: tables.Cut, rebuilt: Path, live: Path
) -> tuple[int, dict[str, Any]]:
    """The same verdict and report with the plain-Python comparison
    (`relay_archive.verify.compare`) and chart (`relay_archive.reader.per_minute`)."""
    names = ("queues", "messages", "retained", "streams", "uncertain")
    covers = export.covered(live)
    mine = {n: tables.read_table(rebuilt, n) for n in names}
    theirs = {n: tables.read_table(live, n) for n in names}
    for name in set(export.EVERY_TABLE) - set(covers):  # not in the export: not compared
        mine[name] = theirs[name] = tables.SCHEMAS[name].empty_table()
    differences = verify.compare(mine, theirs, cut.at_ms)
    health = verify.check_archive(store, cut)
    code = verify.exit_code(health, differences)
    coverage = reader.per_minute(store, cut.epoch, topics.QUEUE_COMMANDS, ["queue_cmd"])
    cut_doc = {"epoch": cut.epoch, "at_ms": cut.at_ms, "offsets": cut.offsets, "tables": covers}
    doc = report.document(verify.counts(differences), differences, health, coverage, cut_doc, code)
    return code, doc
