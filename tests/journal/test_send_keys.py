"""Send keys (`relay_journal.keys`): a key written with its message is answered with that
message's id and timestamp for the window, across close, crash and checkpoints, and then
forgotten, in memory and on disk; journals written before keys existed still open."""

from __future__ import annotations

import shutil
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from relay_journal import errors, keys, records
from relay_journal.journal import QueueJournal
from relay_journal.records import LogRecord, Message, Op
from tests.journal import make_fixture_v1 as fixture
from tests.journal.conftest import mid, qid, small


def now_ms() -> int:
    return int(time.time() * 1000)


def key(n: int) -> bytes:
    return b"key-%d" % n


def test_keyed_write_records_round_trip() -> None:
    message = Message(mid(3), 1234, 5678, b"body")
    record = LogRecord(Op.WRITE_KEYED, 77, qid(), file="f1", message=message, key=b"k" * 16)
    data = records.encode_log(record)
    decoded, end = records.decode_log(data, 0)
    assert end == len(data)
    assert decoded._replace(message_bytes=b"") == record
    assert decoded.message_bytes == records.encode_message(message)  # what the queue file gets
    prefix = records.write_log_prefix(record.queue.encode(), b"f1")
    fast = records.encode_write(77, prefix, mid(3), 1234, 5678, b"body", 0, b"k" * 16)
    assert fast == (records.encode_message(message), data)
    unkeyed = records.encode_write(77, prefix, mid(3), 1234, 5678, b"body", 0)[1]
    assert records.decode_log(unkeyed, 0)[0].op is Op.WRITE  # no key: the v1 record, unchanged


def test_a_key_answers_its_first_message_across_close_and_crash(tmp_path: Path) -> None:
    queue, t0 = qid(), now_ms()
    journal = QueueJournal(small(tmp_path, wal_spares=False))
    journal.write(queue, mid(1), b"one", ts_ms=t0, key=key(1))
    journal.write(queue, mid(2), b"two", ts_ms=t0 + 1)  # no key
    assert journal.sent(key(1), t0) == keys.Sent(mid(1), t0)
    assert journal.sent(key(2), t0) is None
    journal.close()  # the key moves from the WAL to a key file
    assert list((tmp_path / keys.KEYS_DIR).iterdir())

    journal = QueueJournal(small(tmp_path, wal_spares=False))
    assert journal.sent(key(1), t0 + 5) == keys.Sent(mid(1), t0)
    journal.ack(queue, mid(1))  # delivered and acknowledged: still answered
    journal.write(queue, mid(3), b"three", ts_ms=t0 + 2, key=key(3))
    # A crash: the journal is dropped without closing; the key is only in the WAL.
    crashed = QueueJournal(small(tmp_path, wal_spares=False))
    assert crashed.sent(key(1), t0 + 5) == keys.Sent(mid(1), t0)
    assert crashed.sent(key(3), t0 + 5) == keys.Sent(mid(3), t0 + 2)
    assert [m.body for m in crashed.messages(queue)] == [b"two", b"three"]
    crashed.close()


def test_a_refused_write_logs_no_key(tmp_path: Path) -> None:
    queue, t0 = qid(), now_ms()
    journal = QueueJournal(small(tmp_path, max_queue_messages=1, max_file_messages=2))
    journal.write(queue, mid(1), b"one", ts_ms=t0, key=key(1))
    with pytest.raises(errors.QuotaExceeded):
        journal.write(queue, mid(2), b"two", ts_ms=t0, key=key(2))  # the quota marker goes in
    assert journal.sent(key(2), t0) is None
    journal.close()
    journal = QueueJournal(small(tmp_path, max_queue_messages=1, max_file_messages=2))
    assert journal.sent(key(2), t0) is None
    assert journal.sent(key(1), t0) == keys.Sent(mid(1), t0)
    journal.close()


def test_bad_keys_are_refused_and_change_nothing(tmp_path: Path) -> None:
    queue, t0 = qid(), now_ms()
    journal = QueueJournal(small(tmp_path))
    with pytest.raises(ValueError, match="at most 255"):
        journal.write(queue, mid(1), b"x", ts_ms=t0, key=b"k" * 256)
    assert journal.size(queue) == 0
    journal.close()


def test_keys_past_the_window_are_forgotten_in_memory_and_on_disk(tmp_path: Path) -> None:
    sent = keys.SentKeys(tmp_path, window_ms=24_000)  # buckets of 1 s
    t0 = 1_800_000_000_000
    for n in range(100):
        sent.add(key(n), keys.Sent(mid(n), t0 + n * 100))  # 10 s of sends
    sent.persist(t0 + 10_000)
    assert len(list(sent.folder.iterdir())) == 10
    assert sent.get(key(0), t0 + 23_999) is not None
    assert sent.get(key(0), t0 + 24_000) is None  # answered strictly within the window
    sent.add(key(100), keys.Sent(mid(100), t0 + 29_000))  # pruning as keys arrive
    assert len(sent) == 50  # 49 still in the window (key 50's ends now), and the new one
    sent.persist(t0 + 29_000)
    assert len(list(sent.folder.iterdir())) == 6  # buckets ending after 5 s, and the new one
    reloaded = keys.SentKeys(tmp_path, window_ms=24_000)
    reloaded.load(t0 + 29_000)
    assert len(reloaded) == 50
    assert reloaded.get(key(50), t0 + 29_000) is None
    assert reloaded.get(key(51), t0 + 29_000) == keys.Sent(mid(51), t0 + 5_100)
    reloaded.persist(t0 + 60_000)
    assert list(sent.folder.iterdir()) == []


def test_a_torn_key_file_is_cut_and_appended_to_readably(tmp_path: Path) -> None:
    t0 = now_ms()
    sent = keys.SentKeys(tmp_path, window_ms=3_600_000)
    sent.add(key(1), keys.Sent(mid(1), t0))
    sent.persist(t0)
    (path,) = sent.folder.iterdir()
    with path.open("ab") as file:  # a crash in the middle of the next append
        file.write(keys.encode_key(key(2), keys.Sent(mid(2), t0))[:-5])
    again = keys.SentKeys(tmp_path, window_ms=3_600_000)
    again.load(t0)
    assert again.get(key(1), t0) == keys.Sent(mid(1), t0)
    assert again.get(key(2), t0) is None
    again.add(key(3), keys.Sent(mid(3), t0))
    again.persist(t0)
    last = keys.SentKeys(tmp_path, window_ms=3_600_000)
    last.load(t0)
    assert last.get(key(3), t0) == keys.Sent(mid(3), t0)


def test_a_key_file_of_an_unknown_version_is_refused_by_name(tmp_path: Path) -> None:
    record = bytearray(keys.encode_key(key(1), keys.Sent(mid(1), 5)))
    record[8] = 2  # the version byte, after length and crc
    payload = bytes(record[8:])
    reframed = len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big")
    assert keys.decode_keys(reframed + payload) == ([], 0)


def test_a_journal_written_before_keys_opens_and_takes_keys(tmp_path: Path) -> None:
    """BRIEF §4: the v1 fixtures (written by the format before send keys) still load."""
    for source in (fixture.ROOT, fixture.WAL_ROOT):
        root = tmp_path / source.name
        shutil.copytree(source, root)
        settings = dict(fixture.SETTINGS)
        journal = QueueJournal(small(root, **settings))
        assert journal.check() == []
        queue, t0 = qid(), now_ms()
        journal.write(queue, mid(9), b"new", ts_ms=t0, key=key(9))
        journal.close()
        journal = QueueJournal(small(root, **settings))
        assert journal.check() == []
        assert journal.sent(key(9), t0) == keys.Sent(mid(9), t0)
        journal.close()


WINDOW_MS = 60_000
QUEUES = [qid() for _ in range(2)]


class SendKeyMachine(RuleBasedStateMachine):
    """Random writes with keys (new ones and repeats), acks, checkpoints, clean restarts,
    crashes (the journal dropped unclosed) and time passing, against a model of what each key
    must answer: a caller that writes only when `sent` answers nothing never stores a key's
    message twice within the window, and is always answered with the first message."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="send-keys-"))
        self.settings = small(
            self.dir,
            max_queue_messages=100,
            max_file_messages=101,
            wal_segment_bytes=4096,
            wal_spares=False,
            send_key_window_s=WINDOW_MS // 1000,
        )
        self.journal = QueueJournal(self.settings)
        self.now = now_ms()
        self.model: dict[bytes, keys.Sent] = {}
        self.stored: dict[str, list[bytes]] = {q: [] for q in QUEUES}
        self.counter = 0

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _live(self, k: bytes) -> keys.Sent | None:
        first = self.model.get(k)
        return first if first is not None and first.ts_ms + WINDOW_MS > self.now else None

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(0, 7))
    def send(self, queue: str, n: int) -> None:
        k = key(n) + queue.encode()[:4]
        first = self.journal.sent(k, self.now)
        assert first == self._live(k)
        if first is None:
            self.counter += 1
            msg_id = mid(self.counter)
            self.journal.write(queue, msg_id, b"m", ts_ms=self.now, key=k)
            self.model[k] = keys.Sent(msg_id, self.now)
            self.stored[queue].append(msg_id)

    @rule(queue=st.sampled_from(QUEUES))
    def ack(self, queue: str) -> None:
        head = self.journal.peek(queue)
        if head is not None:
            self.journal.ack(queue, head.msg_id)
            self.stored[queue].remove(head.msg_id)

    @rule(ms=st.sampled_from([1, 1_000, 20_000, WINDOW_MS]))
    def time_passes(self, ms: int) -> None:
        # Never behind the wall clock: the files are pruned by it.
        self.now = max(self.now + ms, now_ms())

    @rule()
    def checkpoint(self) -> None:
        self.journal.checkpoint()

    @rule()
    def restart(self) -> None:
        self.journal.close()
        self.journal = QueueJournal(self.settings)

    @rule()
    def crash(self) -> None:
        self.journal.wal.flush()  # as a kill after the fsync the caller waited for
        self.journal = QueueJournal(self.settings)

    @invariant()
    def each_message_once_and_every_key_answered_in_its_window(self) -> None:
        for queue in QUEUES:
            assert [m.msg_id for m in self.journal.messages(queue)] == self.stored[queue]
        for k in self.model:
            assert self.journal.sent(k, self.now) == self._live(k)
        assert len(self.journal.sent_keys) <= len(self.model)


SendKeyMachine.TestCase.settings = hsettings(max_examples=40, stateful_step_count=30, deadline=None)
test_send_key_model = SendKeyMachine.TestCase


def test_a_truncated_keyed_write_with_a_valid_checksum_is_a_record_error() -> None:
    """Every cut of a WRITE_KEYED payload, re-framed with a valid checksum, is refused as a
    record error (never an IndexError or a misread key)."""
    message = Message(mid(3), 1234, 5678, b"body")
    record = LogRecord(Op.WRITE_KEYED, 77, qid(), file="f1", message=message, key=b"k" * 16)
    payload = records.encode_log(record)[8:]
    header = records._LOG_HEAD.size + len(record.queue)
    for cut in range(header, len(payload)):
        part = payload[:cut]
        framed = len(part).to_bytes(4, "big") + zlib.crc32(part).to_bytes(4, "big") + part
        with pytest.raises(records.RecordError):
            records.decode_log(framed, 0)
