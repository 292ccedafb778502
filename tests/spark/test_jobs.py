"""The PySpark jobs on `local[2]` (one session for the module) over a synthetic archive written
through the archive's own writer: Spark's rebuild equals the plain-Python replay, verify's
classes and exit codes, bad input refused."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from relay_archive import export, layout, reader, report, rows, standing, tables, verify, writer
from relay_archive.store import LocalStore
from relay_bus import topics
from relay_spark import jobs, main
from relay_spark.session import DRIVER_MEMORY, session
from relay_streams.model import shard_of
from tests.spark import synthetic

AT_MS = 1_700_000_000_000 + 86_400_000
"""A day after the synthetic history: nothing has expired yet (default ttl 21 days)."""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    spark = session("local[2]")
    yield spark
    spark.stop()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalStore, synthetic.Made]:
    store = LocalStore(tmp_path_factory.mktemp("archive"))
    made = synthetic.make(
        store, commands=4000, unanswered_every=101, retained=40, streams=30, per_file=700
    )
    # a second archiver's overlapping file during a hand-over: read once
    (f, *_) = [f for f in made.files if f.slot.topic == topics.QUEUE_COMMANDS and f.first == 0]
    copy = layout.ArchiveFile(f.slot, 0, 99)
    writer.write(store, copy, [rows.row_of(**r) for r in _rows(store, f)[:100]])
    return store, made


def _rows(store: LocalStore, f: layout.ArchiveFile) -> list[dict[str, Any]]:
    table = store.read(f).select(["offset", "timestamp_ms", "key", "value"])
    return [
        {
            "offset": r["offset"],
            "timestamp_ms": r["timestamp_ms"],
            "key": r["key"],
            "value": r["value"],
        }
        for r in table.to_pylist()
    ]


def _sorted(folder: Path, name: str) -> list[str]:
    return sorted(
        json.dumps(r, sort_keys=True) for r in tables.read_table(folder, name).to_pylist()
    )


@pytest.fixture(scope="module")
def rebuilt(
    spark: SparkSession,
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, tables.Cut]:
    store, made = archive
    cut = tables.Cut(synthetic.EPOCH, AT_MS, made.commands)
    out = tmp_path_factory.mktemp("rebuilt")
    spark_counts = jobs.rebuild(spark, store, cut, out / "spark")
    python_counts = jobs.rebuild_python(store, cut, out / "python")
    assert spark_counts == python_counts
    return out / "spark", out / "python", cut


def test_the_driver_jvm_starts_with_the_sessions_heap(spark: SparkSession) -> None:
    """Spark's 1g default ran a 20M-record rebuild out of heap: the JVM itself got the size."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    assert DRIVER_MEMORY == "4g"
    assert runtime.maxMemory() > 3 * 2**30


def test_spark_rebuild_equals_the_plain_python_replay(
    rebuilt: tuple[Path, Path, tables.Cut], archive: tuple[LocalStore, synthetic.Made]
) -> None:
    spark_out, python_out, _ = rebuilt
    for name in ("queues", "messages", "retained", "streams", "uncertain"):
        assert _sorted(spark_out, name) == _sorted(python_out, name), name
    assert len(_sorted(spark_out, "streams")) == 2 * 30  # 30 writes of two messages
    assert len(_sorted(spark_out, "messages")) > 500
    uncertain = {r["command"] for r in tables.read_table(spark_out, "uncertain").to_pylist()}
    assert uncertain == set(archive[1].unanswered)
    assert len(_sorted(spark_out, "retained")) == 20  # 40 publishes on 20 topics


def _export(folder: Path, live: dict[str, list[dict[str, Any]]], cut: tables.Cut) -> Path:
    for name, table_rows in live.items():
        tables.write_table(folder, name, table_rows, "writer-0")
    (folder / export.CUT_FILE.format(name="writer-0")).write_text(cut.to_json())
    export.write_manifest(folder, cut.at_ms)
    return folder


def _live(python_out: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        name: tables.read_table(python_out, name).to_pylist()
        for name in ("queues", "messages", "retained", "streams")
    }


def _verify(
    spark: SparkSession, store: LocalStore, cut: tables.Cut, spark_out: Path, live: Path
) -> tuple[int, dict[str, Any]]:
    return jobs.verify_job(spark, store, cut, spark_out, live)


def test_clean_and_unanswered_commands_only_uncertain(
    spark: SparkSession,
    rebuilt: tuple[Path, Path, tables.Cut],
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    spark_out, python_out, cut = rebuilt
    live = _live(python_out)
    code, doc = _verify(spark, archive[0], cut, spark_out, _export(tmp_path / "clean", live, cut))
    assert (code, doc["counts"]) == (0, {"MISSING": 0, "EXTRA": 0, "MISMATCH": 0, "EXPLAINED": 0})
    chart = reader.per_minute(archive[0], cut.epoch, topics.QUEUE_COMMANDS, ["queue_cmd"])
    assert len(chart) > 1
    assert doc["coverage_per_minute"] == [list(pair) for pair in chart]  # the plain engine's
    # the queue-writer applied an unanswered send after all: explained, not EXTRA
    unanswered = next(
        r for r in tables.read_table(spark_out, "uncertain").to_pylist() if r["op"] == "send"
    )
    queue = next(q["queue"] for q in live["queues"] if q["sender"] == unanswered["subject"])
    extra = {
        "queue": queue,
        "msg_id": unanswered["msg_id"],
        "ts": 1,
        "expires_ms": None,
        "body": "eA",
        "quota": False,
    }
    live["messages"] = [*live["messages"], extra]
    code, doc = _verify(spark, archive[0], cut, spark_out, _export(tmp_path / "applied", live, cut))
    assert (code, doc["counts"]["EXPLAINED"], doc["counts"]["EXTRA"]) == (0, 1, 0)


def test_a_lost_message_is_one_missing_and_a_flipped_payload_one_mismatch(
    spark: SparkSession,
    rebuilt: tuple[Path, Path, tables.Cut],
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    spark_out, python_out, cut = rebuilt
    live = _live(python_out)
    lost = live["messages"].pop(len(live["messages"]) // 2)
    flipped = live["retained"][0]
    live["retained"][0] = {**flipped, "payload": "ZmxpcHBlZA"}
    code, doc = _verify(spark, archive[0], cut, spark_out, _export(tmp_path / "e", live, cut))
    assert code == 1
    assert doc["counts"] == {"MISSING": 1, "EXTRA": 0, "MISMATCH": 1, "EXPLAINED": 0}
    missing = next(d for d in doc["differences"] if d["klass"] == verify.MISSING)
    assert (missing["key"], missing["rebuilt"]["queue"]) == (lost["msg_id"], lost["queue"])
    assert missing["rebuilt"]["command"] == lost["command"]  # the send that put it there
    mismatch = next(d for d in doc["differences"] if d["klass"] == verify.MISMATCH)
    assert (mismatch["key"], mismatch["reason"]) == (flipped["topic"], "differs in payload")


def test_a_lost_stream_message_is_missing_and_an_unwritten_one_extra(
    spark: SparkSession,
    rebuilt: tuple[Path, Path, tables.Cut],
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    spark_out, python_out, cut = rebuilt
    live = _live(python_out)
    lost = live["streams"].pop(3)
    invented = {**live["streams"][0], "topic": "log/invented", "request": None}
    live["streams"].append(invented)
    for engine in ("spark", "python"):
        folder = _export(tmp_path / engine, live, cut)
        if engine == "spark":
            code, doc = _verify(spark, archive[0], cut, spark_out, folder)
        else:
            code, doc = jobs.verify_python(archive[0], cut, spark_out, folder)
        assert code == 1, engine
        assert doc["counts"] == {"MISSING": 1, "EXTRA": 1, "MISMATCH": 0, "EXPLAINED": 0}
        missing = next(d for d in doc["differences"] if d["klass"] == verify.MISSING)
        assert missing["key"] == f"messages/{lost['topic']}@{lost['ts']}"
        assert missing["rebuilt"]["payload"] == lost["payload"]
        extra = next(d for d in doc["differences"] if d["klass"] == verify.EXTRA)
        assert extra["key"] == f"messages/log/invented@{invented['ts']}"


def test_cli_exit_codes_reports_and_bad_input(
    spark: SparkSession,
    rebuilt: tuple[Path, Path, tables.Cut],
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    spark_out, python_out, cut = rebuilt
    store = archive[0]
    live = _export(tmp_path / "live", _live(python_out), cut)
    args = ["verify", "--archive", store.root, "--export", str(live), "--rebuilt", str(spark_out)]
    with pytest.raises(SystemExit) as done:
        main.main([*args, "--report", str(tmp_path / "r0")])
    assert done.value.code == 0
    assert json.loads((tmp_path / "r0" / "report.json").read_text())["verdict"] == "clean"
    assert "<svg" in (tmp_path / "r0" / "report.html").read_text()
    # an archive file removed: a gap, exit 2 whatever the tables say
    victim = next(
        f for f in store.list_files() if f.slot.topic == topics.QUEUE_COMMANDS and f.first > 0
    )
    moved = tmp_path / "moved.parquet"
    (Path(store.root) / victim.path).rename(moved)
    try:
        for engine in ("python", "spark"):
            with pytest.raises(SystemExit) as done:
                main.main([*args, "--report", str(tmp_path / engine), "--engine", engine])
            assert done.value.code == 2, engine
            doc = json.loads((tmp_path / engine / "report.json").read_text())
            assert doc["archive"]["gaps"][topics.QUEUE_COMMANDS] == [
                [victim.slot.partition, victim.first, victim.last]
            ]
    finally:
        moved.rename(Path(store.root) / victim.path)
    # bad input: one line, exit 64, nothing written
    for bad in (
        [
            "verify",
            "--archive",
            str(tmp_path / "nope"),
            "--export",
            str(live),
            "--rebuilt",
            str(spark_out),
            "--report",
            str(tmp_path / "r3"),
        ],
        [
            "verify",
            "--archive",
            store.root,
            "--export",
            str(tmp_path),
            "--rebuilt",
            str(spark_out),
            "--report",
            str(tmp_path / "r3"),
        ],
        ["rebuild", "--archive", store.root, "--epoch", "other", "--out", str(tmp_path / "r3")],
        ["rebuild", "--archive", store.root],
    ):
        with pytest.raises(SystemExit) as done:
            main.main(bad)
        assert done.value.code == main.EX_USAGE
        assert not (tmp_path / "r3").exists()


def test_the_plain_engine_charts_archived_commands_per_minute(
    archive: tuple[LocalStore, synthetic.Made], tmp_path: Path
) -> None:
    """`verify --engine python` (no Spark session) gives the report the same chart as Spark's
    job: every archived command once, in the minute of its Kafka timestamp."""
    store, made = archive
    cut = tables.Cut(synthetic.EPOCH, AT_MS, made.commands)
    jobs.rebuild_python(store, cut, tmp_path / "rebuilt")
    live = _export(tmp_path / "live", _live(tmp_path / "rebuilt"), cut)
    code, doc = jobs.verify_python(store, cut, tmp_path / "rebuilt", live)
    assert code == 0
    commands = reader.scan(store, synthetic.EPOCH, topics.QUEUE_COMMANDS, kinds=["queue_cmd"])
    stamps = commands.table["timestamp_ms"].to_pylist()
    expected = sorted(Counter(t // 60_000 for t in stamps).items())
    assert len(expected) > 1
    assert [tuple(pair) for pair in doc["coverage_per_minute"]] == expected
    report.write(tmp_path / "report", doc)
    assert (tmp_path / "report" / "report.html").read_text().count("<rect ") == len(expected)


def test_a_corrupt_archive_file_is_a_gap(
    archive: tuple[LocalStore, synthetic.Made], tmp_path: Path
) -> None:
    store, made = archive
    cut = tables.Cut(synthetic.EPOCH, AT_MS, made.commands)
    victim = next(f for f in store.list_files() if f.slot.topic == topics.INGRESS_INBOX)
    path = Path(store.root) / victim.path
    original = path.read_bytes()
    path.write_bytes(original[: len(original) // 2])
    try:
        health = verify.check_archive(store, cut)
        assert health.corrupt == [str(path)]
        assert verify.exit_code(health, []) == 2
    finally:
        path.write_bytes(original)
    assert verify.check_archive(store, cut).whole


def test_a_damaged_commands_file_exits_2_under_spark_not_a_crash(
    spark: SparkSession,
    rebuilt: tuple[Path, Path, tables.Cut],
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    """Spark's verify reads the commands again for its chart: a damaged file there is left out
    of the chart (as the plain engine leaves it out) and reported, exit 2, not a job crash
    (an uncaught error exits 1, which says "differences")."""
    spark_out, python_out, cut = rebuilt
    store = archive[0]
    live = _export(tmp_path / "live", _live(python_out), cut)
    victim = next(
        f for f in store.list_files() if f.slot.topic == topics.QUEUE_COMMANDS and f.first > 0
    )
    path = Path(store.root) / victim.path
    original = path.read_bytes()
    path.write_bytes(original[: len(original) // 2])
    try:
        code, doc = _verify(spark, store, cut, spark_out, live)
        plain_code, plain = jobs.verify_python(store, cut, spark_out, live)
    finally:
        path.write_bytes(original)
    assert (code, plain_code) == (2, 2)
    assert doc["archive"]["corrupt"] == plain["archive"]["corrupt"] == [str(path)]
    assert doc["coverage_per_minute"] == plain["coverage_per_minute"]
    whole = reader.per_minute(store, cut.epoch, topics.QUEUE_COMMANDS, ["queue_cmd"])
    assert sum(n for _, n in whole) > sum(n for _, n in doc["coverage_per_minute"]) > 0


def test_tables_round_trip_through_parquet(tmp_path: Path) -> None:
    row = {
        "queue": "q",
        "msg_id": "m",
        "ts": None,
        "expires_ms": None,
        "body": "",
        "quota": True,
        "command": None,
        "partition": None,
        "offset": None,
    }
    tables.write_table(tmp_path, "messages", [row])
    assert tables.read_table(tmp_path, "messages").to_pylist() == [row]
    assert tables.read_table(tmp_path, "queues").num_rows == 0
    assert isinstance(tables.read_table(tmp_path, "queues"), pa.Table)


def test_a_bounded_publications_cut_makes_its_window_uncertain(
    spark: SparkSession,
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    """An online export's retainer cut (`tables.Cut.publications*`): publications before the
    lower bound are replayed with their replies, those in the window count as unanswered,
    those past the upper bound are left out; Spark and the plain replay agree."""
    store, made = archive
    ends = reader.resume_points(store, synthetic.EPOCH, topics.PUBLICATIONS)
    lower = {p: end // 3 for p, end in ends.items()}
    upper = {p: 2 * end // 3 for p, end in ends.items()}
    cut = tables.Cut(synthetic.EPOCH, AT_MS, made.commands, lower, upper)
    assert tables.Cut.from_json(cut.to_json()) == cut
    spark_counts = jobs.rebuild(spark, store, cut, tmp_path / "spark")
    python_counts = jobs.rebuild_python(store, cut, tmp_path / "python")
    assert spark_counts == python_counts
    for name in ("retained", "streams", "uncertain"):
        assert _sorted(tmp_path / "spark", name) == _sorted(tmp_path / "python", name), name
    streams = tables.read_table(tmp_path / "python", "streams").to_pylist()
    assert streams
    assert all(r["offset"] < lower[r["partition"]] for r in streams)
    window = [
        r
        for r in tables.read_table(tmp_path / "python", "uncertain").to_pylist()
        if r["op"] in ("stream", "retain")
    ]
    assert window
    assert all(lower[r["partition"]] <= r["offset"] < upper[r["partition"]] for r in window)
    assert len(streams) < 2 * 30


def test_an_exact_per_store_cut_places_every_write_by_its_store(
    spark: SparkSession,
    archive: tuple[LocalStore, synthetic.Made],
    tmp_path: Path,
) -> None:
    """A retainer's cut read from its stores' marks (`tables.Cut.stores`): each retained write
    is in when before the retained store's position, each stream message when before its own
    shard's (`relay_archive.standing`), nothing is uncertain; a partition with no known store
    (a store from before marks) keeps the window. Spark and the plain replay agree."""
    store, made = archive
    ends = reader.resume_points(store, synthetic.EPOCH, topics.PUBLICATIONS)
    fallback = min(ends)  # this partition's stores have no marks: the window
    lower = {p: end // 3 for p, end in ends.items()}
    upper = {p: 2 * end // 3 for p, end in ends.items()}
    shards = {p: {"messages": 3} for p in ends if p != fallback}
    stores = {
        p: {
            standing.RETAINED: end // 2,
            standing.stream_store("messages", 0): end // 4,
            standing.stream_store("messages", 1): 3 * end // 4,
            standing.stream_store("messages", 2): end // 2,
        }
        for p, end in ends.items()
        if p != fallback
    }
    cut = tables.Cut(synthetic.EPOCH, AT_MS, made.commands, lower, upper, stores, shards)
    assert tables.Cut.from_json(cut.to_json()) == cut
    spark_counts = jobs.rebuild(spark, store, cut, tmp_path / "spark")
    python_counts = jobs.rebuild_python(store, cut, tmp_path / "python")
    assert spark_counts == python_counts
    for name in ("retained", "streams", "uncertain"):
        assert _sorted(tmp_path / "spark", name) == _sorted(tmp_path / "python", name), name

    everything = tables.Cut(synthetic.EPOCH, AT_MS, made.commands)
    jobs.rebuild_python(store, everything, tmp_path / "all")
    all_streams = tables.read_table(tmp_path / "all", "streams").to_pylist()

    def kept(row: dict[str, Any]) -> bool:
        p, offset = row["partition"], row["offset"]
        if p == fallback:
            return offset < lower[p]
        shard = shard_of(row["topic"], 3)
        return offset < stores[p][standing.stream_store("messages", shard)]

    streams = tables.read_table(tmp_path / "python", "streams").to_pylist()
    assert _keys(streams) == _keys([r for r in all_streams if kept(r)])
    placed = {(r["partition"], shard_of(r["topic"], 3)) for r in streams}
    assert {(3, 0), (3, 1)} <= placed  # one partition, two shards, two positions
    retained = tables.read_table(tmp_path / "python", "retained").to_pylist()
    assert retained
    assert all(
        r["offset"] < (lower[p] if p == fallback else stores[p][standing.RETAINED])
        for r in retained
        for p in [r["partition"]]
    )
    window = [
        r
        for r in tables.read_table(tmp_path / "python", "uncertain").to_pylist()
        if r["op"] in ("stream", "retain")
    ]
    assert window
    assert all(r["partition"] == fallback for r in window)  # exact elsewhere
    assert all(lower[fallback] <= r["offset"] < upper[fallback] for r in window)


def _keys(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["partition"], r["offset"], r["topic"], r["payload"]) for r in rows)


def test_an_export_that_names_no_epoch_takes_the_archives_only_one(
    archive: tuple[LocalStore, synthetic.Made], tmp_path: Path
) -> None:
    """An offline export of queue-writers that never applied a command has no marks, so no
    epoch: the rebuild takes the archive's (there is one), every command partition cut at 0."""
    store, _ = archive
    out = tmp_path / "export"
    tables.write_table(out, "queues", [], "queue-writer-0")
    idle = tables.Cut("", AT_MS, {})
    (out / export.CUT_FILE.format(name="queue-writer-0")).write_text(idle.to_json())
    export.write_manifest(out, AT_MS)
    assert export.read_cut(out, AT_MS).epoch == ""
    cut = main._cut(store, out, None)
    assert (cut.epoch, cut.at_ms, cut.offsets) == (synthetic.EPOCH, AT_MS, {})
