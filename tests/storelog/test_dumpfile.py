"""Version 2 dumps: read in place, version 1 files still load (and are converted), damage is
detected at start and repaired on request, hash collisions in the indexes are told apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_storelog import dumpfile, records
from relay_storelog.records import QueueRecord
from relay_storelog.store import DUMP_STEPS, StoreLog, StoreLogCorrupt, StoreLogSettings
from tests.storelog import script


def _filled(root: Path, count: int) -> dict[str, QueueRecord]:
    store = StoreLog(StoreLogSettings(root=root))
    for i in range(count):
        store.new(script.record(i))
    store.set_offsets({"epoch": "e1", "p0": 7})
    store.dump()
    store.wait_dump()
    store.close()
    return {script.record(i).recipient_id: script.record(i) for i in range(count)}


def _dump_path(root: Path) -> Path:
    (path,) = root.glob("store-*.dump")
    return path


def test_a_start_reads_the_dump_in_place_and_changes_layer_over_it(tmp_path: Path) -> None:
    model = _filled(tmp_path, 2000)
    assert dumpfile.is_v2(_dump_path(tmp_path))
    store = StoreLog(StoreLogSettings(root=tmp_path))
    assert store.in_memory == 0  # nothing decoded at start
    assert len(store.queues) == 2000
    assert dict(store.offsets.items()) == {"epoch": "e1", "p0": 7}
    for i in (0, 1, 977, 1999):
        record = script.record(i)
        assert store.queues.get(record.recipient_id) == record
        assert store.by_sender(record.sender_id) == record
    assert store.queues.get("r99999") is None
    assert store.by_sender("s99999") is None
    assert store.in_memory == 0  # reads decode, they do not load

    # Changes over the dump: a status, a delete, a new queue reusing the deleted one's sender.
    store.set_status("r00005", "suspended", 9)
    model["r00005"] = model["r00005"]._replace(status="suspended", updated_at=9)
    store.delete("r00006")
    del model["r00006"]
    assert store.by_sender("s00006") is None
    reused = QueueRecord("rNEW01", "s00006", "k", 128, 1, 1)
    store.new(reused)
    model["rNEW01"] = reused
    assert store.by_sender("s00006") == reused
    with pytest.raises(records.LineError):  # refused before anything is written
        store.set_status("r00007", "gone", 1)
    assert store.in_memory == 3
    assert dict(store.queues.items()) == model
    assert len(store.queues) == len(model)

    # A dump taken now covers those layers; the next change reads from it alone.
    store.dump()
    store.wait_dump()
    store.set_offsets({"p1": 3})
    assert store.in_memory == 0
    assert dict(store.queues.items()) == model
    store.close()
    again = StoreLog(StoreLogSettings(root=tmp_path))
    assert dict(again.queues.items()) == model
    assert again.by_sender("s00006") == reused
    assert again.in_memory == 0
    again.close()


def _write_v1(root: Path) -> dict[str, QueueRecord]:
    """A data dir exactly as version 1 wrote it: a dump of `new` lines and an `offsets` line,
    and a later log (what `StoreLog` wrote before version 2 dumps)."""
    root.mkdir(parents=True, exist_ok=True)
    dumped = [script.record(i) for i in range(50)]
    with (root / "store-0.dump").open("wb") as f:
        for record in dumped:
            f.write(records.encode("new", records.queue_to_data(record)))
        f.write(records.encode("offsets", {"epoch": "e0", "p0": 41}))
    with (root / "store-1.log").open("wb") as f:
        f.write(records.encode("status", {"recipient_id": "r00003", "status": "suspended"}))
        f.write(records.encode("delete", {"recipient_id": "r00004"}))
        f.write(records.encode("new", records.queue_to_data(script.record(60))))
        f.write(records.encode("offsets", {"p0": 44}))
    model = {r.recipient_id: r for r in dumped}
    model["r00003"] = model["r00003"]._replace(status="suspended")
    del model["r00004"]
    model["r00060"] = script.record(60)
    return model


def test_version_1_dumps_and_logs_still_load_and_are_converted(tmp_path: Path) -> None:
    model = _write_v1(tmp_path)
    store = StoreLog(StoreLogSettings(root=tmp_path))
    assert dict(store.queues.items()) == model
    assert dict(store.offsets.items()) == {"epoch": "e0", "p0": 44}
    assert store.by_sender("s00060") == script.record(60)
    result = store.wait_dump()  # the conversion started at open
    assert result is not None
    assert result.records == len(model)
    store.close()
    assert dumpfile.is_v2(_dump_path(tmp_path))
    assert not (tmp_path / "store-0.dump").exists()
    again = StoreLog(StoreLogSettings(root=tmp_path))
    assert again.in_memory == 0
    assert dict(again.queues.items()) == model
    assert dict(again.offsets.items()) == {"epoch": "e0", "p0": 44}
    again.close()


class Killed(BaseException):
    """Stands for SIGKILL at a dump step (see tests/storelog/test_storelog.py)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("step", DUMP_STEPS)
def test_a_conversion_stopped_at_any_step_loses_nothing(tmp_path: Path, step: str) -> None:
    """The conversion of a version 1 dump is a dump: stopped at any of its steps (in the
    opening caller for steps 1-4, in the dump thread for the others), the next start finds
    the same state, from the version 1 files or the new dump."""
    model = _write_v1(tmp_path)

    def kill(name: str) -> None:
        if name == step:
            raise Killed(name)

    try:
        store = StoreLog(StoreLogSettings(root=tmp_path, on_dump_step=kill))
        store.wait_dump()  # the thread stopped at the step; its files stay as they are
        store.file.close()
    except Killed:
        pass
    again = StoreLog(StoreLogSettings(root=tmp_path))
    assert dict(again.queues.items()) == model
    assert dict(again.offsets.items()) == {"epoch": "e0", "p0": 44}
    again.close()


def _damage(path: Path, at: int, value: bytes = b"\xff") -> None:
    with path.open("r+b") as f:
        f.seek(at)
        old = f.read(len(value))
        f.seek(at)
        f.write(bytes(b ^ v for b, v in zip(old, value, strict=True)))


def test_a_damaged_record_is_named_at_start_and_repair_keeps_the_others(tmp_path: Path) -> None:
    model = _filled(tmp_path, 300)
    path = _dump_path(tmp_path)
    first, second = dumpfile.decode_record(path.read_bytes(), len(dumpfile.MAGIC))
    lost, _ = dumpfile.decode_record(path.read_bytes(), second)
    assert first != lost
    _damage(path, second + 10)  # inside the second record's body
    with pytest.raises(StoreLogCorrupt, match=f"{path.name}: checksum mismatch"):
        StoreLog(StoreLogSettings(root=tmp_path))
    repaired = StoreLog(StoreLogSettings(root=tmp_path), repair=True)
    assert repaired.skipped == 1
    del model[lost.recipient_id]
    assert dict(repaired.queues.items()) == model
    assert dict(repaired.offsets.items()) == {"epoch": "e1", "p0": 7}
    repaired.close()
    plain = StoreLog(StoreLogSettings(root=tmp_path))  # the repair was dumped
    assert plain.in_memory == 0
    assert dict(plain.queues.items()) == model
    plain.close()


@pytest.mark.parametrize("partial", [0, 7])
def test_damage_in_an_index_or_a_cut_dump_is_detected(tmp_path: Path, partial: int) -> None:
    """A cut after 100 whole records (and `partial` bytes of the next) keeps all 100: the
    walk of a footerless file reaches its end (the last record ends within a footer's
    length of it)."""
    _filled(tmp_path / "index", 300)
    path = _dump_path(tmp_path / "index")
    _damage(path, path.stat().st_size - dumpfile.FOOTER_BYTES - 100)  # in the sender index
    with pytest.raises(StoreLogCorrupt, match="checksum mismatch"):
        StoreLog(StoreLogSettings(root=tmp_path / "index"))

    model = _filled(tmp_path / "cut", 300)
    path = _dump_path(tmp_path / "cut")
    size = path.stat().st_size
    data, kept, keep = path.read_bytes(), {}, len(dumpfile.MAGIC)
    for _ in range(100):
        record, keep = dumpfile.decode_record(data, keep)
        kept[record.recipient_id] = record
    with path.open("r+b") as f:
        f.truncate(keep + partial)  # a copy cut short: 100 whole records, then part of one
    assert keep + partial < size
    with pytest.raises(StoreLogCorrupt, match="footer damaged"):
        StoreLog(StoreLogSettings(root=tmp_path / "cut"))
    repaired = StoreLog(StoreLogSettings(root=tmp_path / "cut"), repair=True)
    assert dict(repaired.queues.items()) == kept
    assert all(model[k] == v for k, v in kept.items())
    assert dict(repaired.offsets.items()) == {}  # the offsets went with the footer
    assert repaired.skipped >= 1
    repaired.close()


def test_equal_hashes_in_the_indexes_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids whose hashes collide (forced: four hash values for 500 queues) are found by
    comparing the records' ids, in both indexes."""
    real = dumpfile.key_hash
    monkeypatch.setattr(dumpfile, "key_hash", lambda key: real(key) % 4)
    model = _filled(tmp_path, 500)
    store = StoreLog(StoreLogSettings(root=tmp_path))
    for recipient_id, record in model.items():
        assert store.queues.get(recipient_id) == record
        assert store.by_sender(record.sender_id) == record
    assert store.queues.get("r77777") is None
    store.close()
