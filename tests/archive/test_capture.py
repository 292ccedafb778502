"""The online export's capture (`relay_archive.capture`) over a real journal and store log:
changes applied between its slices (each announced by `before_change`, as the queue-writer's
command handler does) neither leak into it nor wait for it beyond one queue's read, and
what it holds equals what an offline export reads from the same stores at the cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_archive import capture, export, tables
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import ids
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog, StoreLogSettings

NOW = 1_700_000_000_000


def _state(journal: QueueJournal, store: StoreLog) -> tuple[list[object], list[object]]:
    queues, messages = [], []
    for record in store.queues.values():
        queues.append(export.queue_row(record))
        messages.extend(
            export.message_rows(record.recipient_id, journal.messages(record.recipient_id))
        )
    return sorted(queues, key=repr), sorted(messages, key=repr)


def test_changes_between_slices_do_not_leak_and_are_not_held_up(tmp_path: Path) -> None:
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal"))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    try:
        queues: list[str] = []
        for n in range(6):
            queue, sender = ids.new_queue_ids(4)
            store.new(QueueRecord(queue, sender, "key", 100, NOW, NOW))
            for i in range(3):
                journal.write(queue, ids.id_bytes(ids.new_id()), b"%d.%d" % (n, i), ts_ms=NOW + i)
            queues.append(queue)
        at_cut = _state(journal, store)
        cut = tables.Cut("e", NOW, {0: 10, 1: 7})
        taking = capture.QueueCapture(journal, store.queues, cut)
        assert not taking.step(2)  # two queues read; four left
        read = {row["queue"] for row in taking.captured.queues}
        unread = [q for q in queues if q not in read]

        # Changes after the cut, each announced first (copy before write):
        taking.before_change(unread[0])  # a send to a queue not read yet
        journal.write(unread[0], ids.id_bytes(ids.new_id()), b"after", ts_ms=NOW + 9)
        taking.before_change(unread[1])  # an ack of its head
        head = journal.messages(unread[1])[0]
        journal.ack(unread[1], head.msg_id)
        taking.before_change(unread[2])  # a deletion
        journal.delete(unread[2])
        store.delete(unread[2])
        new_queue, new_sender = ids.new_queue_ids(4)
        taking.before_change(new_queue)  # a queue created after the cut
        store.new(QueueRecord(new_queue, new_sender, "key", 100, NOW, NOW))
        journal.write(new_queue, ids.id_bytes(ids.new_id()), b"new", ts_ms=NOW + 9)
        first = sorted(read)[0]
        taking.before_change(first)  # a queue already read: nothing to do
        store.set_status(first, "suspended", NOW + 9)
        journal.suspend(first)
        taking.before_change(None)  # a command that names no queue (an unknown sender)

        assert taking.captured.early == 3
        assert not taking.finished
        while not taking.step(1):
            pass
        got = taking.captured
        assert (sorted(got.queues, key=repr), sorted(got.messages, key=repr)) == at_cut
        assert len(got.queues) == 6
        assert got.longest_ms > 0
        # The changes themselves went through: the live state moved on past the cut.
        now = _state(journal, store)
        assert now != at_cut
        assert len(now[0]) == 6  # one deleted, one created
        assert any(row["body"] == "bmV3" for row in now[1])  # b64u(b"new")

        out = tmp_path / "export"
        export.write_queue_part(out, "queue-writer-0", got.queues, got.messages, taking.cut)
        assert tables.read_table(out, "messages").num_rows == 18
        assert export.read_cut(out, NOW).offsets == {0: 10, 1: 7}
    finally:
        store.close()
        journal.close()


def test_a_failed_read_fails_the_export_not_the_command(tmp_path: Path) -> None:
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal"))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    try:
        queue, sender = ids.new_queue_ids(4)
        store.new(QueueRecord(queue, sender, "key", 100, NOW, NOW))
        for i in range(3):
            journal.write(queue, ids.id_bytes(ids.new_id()), b"m%d" % i, ts_ms=NOW)
        journal.close_idle()  # read from its files from here on
        (messages,) = (tmp_path / "journal" / "queues").rglob("messages.*.log")
        data = bytearray(messages.read_bytes())
        data[len(data) // 2 :] = b"\xff" * (len(data) - len(data) // 2)
        messages.write_bytes(bytes(data))
        taking = capture.QueueCapture(journal, store.queues, tables.Cut("e", NOW, {}))
        taking.before_change(queue)  # no exception here: the command goes on
        assert taking.failed is not None
        assert taking.finished
        with pytest.raises(type(taking.failed)):
            taking.step(10)
    finally:
        store.close()
        journal.close()


def test_queues_of_partitions_not_served_are_left_to_their_owner(tmp_path: Path) -> None:
    """A copy of a partition kept for a hand-off (held, not served) is not captured, neither
    in the slices nor when a change to it is announced: it is in its owner's part."""
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal"))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    try:
        by_partition: dict[int, list[str]] = {0: [], 1: []}
        while min(len(q) for q in by_partition.values()) < 3:
            queue, sender = ids.new_queue_ids(2)
            partition = ids.partition_of(queue, 2)
            if len(by_partition[partition]) >= 3:
                continue
            store.new(QueueRecord(queue, sender, "key", 100, NOW, NOW))
            journal.write(queue, ids.id_bytes(ids.new_id()), b"m", ts_ms=NOW)
            by_partition[partition].append(queue)
        cut = tables.Cut("e", NOW, {0: 5})
        taking = capture.QueueCapture(
            journal, store.queues, cut, served=lambda q: ids.partition_of(q, 2) == 0
        )
        taking.before_change(by_partition[1][0])  # a kept copy's queue: not read
        assert taking.captured.early == 0
        while not taking.step(2):
            pass
        assert sorted(row["queue"] for row in taking.captured.queues) == sorted(by_partition[0])
        assert {row["queue"] for row in taking.captured.messages} == set(by_partition[0])
    finally:
        journal.close()
        store.close()
