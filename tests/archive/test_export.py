"""`relay_archive.export` of a retainer's data dir: every retained message, `$` topics too."""

from __future__ import annotations

from pathlib import Path

from relay_archive import export, tables
from relay_streams.retained import RetainedStore, Write


def test_a_retainer_export_keeps_dollar_topics_and_unswept_expired_messages(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "retainer-0"
    with RetainedStore(data_dir / "retained") as store:
        store.store_many(
            [
                Write("dev/1/state", b"on", 0, None, 1_000),
                Write("$ops/state", b"dollar", 0, None, 1_000),
                Write("dev/2/state", b"old", 0, 1, 1_000),  # expired, not swept yet
            ]
        )
    out = tmp_path / "out"
    export.export_retainer(data_dir, out, "retainer-0")
    rows = tables.read_table(out, "retained").to_pylist()
    assert sorted(row["topic"] for row in rows) == ["$ops/state", "dev/1/state", "dev/2/state"]
