"""The archive on S3-compatible object storage (`relay_archive.store.ObjectStore` through
`pyarrow.fs`): moto's S3 server on 127.0.0.1 stands in for a bucket (a real HTTP server speaking
the S3 API, run in this process). The store's listing, reading, resume points and removal over
S3, and the archiver process writing every record of Apache Kafka there exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from moto.server import ThreadedMotoServer

from relay_archive import layout, reader, rows, writer
from relay_archive.store import ObjectStore, open_store
from relay_bus import topics
from tests.archive.test_archiver import _caught_up, _check_complete, _produce, archiver, producer
from tests.helpers import Kafka, free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "relay-test",
    "AWS_SECRET_ACCESS_KEY": "relay-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUCKET = "relay-archive"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3 server with an empty bucket; yields the endpoint (`127.0.0.1:port`)."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"127.0.0.1:{port}"
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint,
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir(BUCKET)
        yield endpoint
    finally:
        server.stop()


def uri(endpoint: str, prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def test_the_store_over_s3_lists_reads_resumes_and_removes(s3: str) -> None:
    store = open_store(uri(s3, "one"))
    assert isinstance(store, ObjectStore)
    slot = layout.Slot("e1", topics.QUEUE_COMMANDS, 3)
    first, second = layout.ArchiveFile(slot, 0, 2), layout.ArchiveFile(slot, 3, 4)
    for f in (first, second):
        rows_of = [
            rows.row_of(o, 1_700_000_000_000 + o, None, b'{"kind":"ping","v":1}')
            for o in range(f.first, f.last + 1)
        ]
        writer.write(store, f, rows_of)
    assert store.list_files() == [first, second]
    assert store.read(second)["offset"].to_pylist() == [3, 4]
    assert reader.resume_points(store, "e1", topics.QUEUE_COMMANDS) == {3: 5}
    # another prefix of the same bucket is another archive
    assert open_store(uri(s3, "two")).list_files() == []
    store.remove(first)
    assert store.list_files() == [second]


async def test_the_archiver_writes_every_record_to_s3_once(
    s3: str, kafka: Kafka, tmp_path: Path
) -> None:
    location = uri(s3, "relay")
    store = open_store(location)
    async with producer(kafka) as bus:
        assert bus.epoch is not None
        with archiver(kafka, tmp_path, RELAY_ARCHIVE__LOCATION=location, **CREDENTIALS):
            await _produce(bus, 0, 20)
            await _caught_up(store, bus)
        _check_complete(store, bus.epoch, 20)
        assert not (tmp_path / "archive").exists()  # nothing went to the local default
