"""Hypothesis stateful test: the journal against a plain in-memory model, through random
create, write, peek, ack, expire, suspend, delete, close and reopen sequences."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from relay_journal import errors
from relay_journal.journal import QueueJournal
from tests.journal.conftest import mid, small

QUEUES = [
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2",
    "ccccccccccccccccccccccccccccccc3",
]
QUOTA = 3


@dataclass
class ModelQueue:
    messages: list[tuple[bytes, bytes, int, bool]] = field(
        default_factory=list
    )  # id, body, expires, quota
    can_write: bool = True
    suspended: bool = False


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="journal-model-"))
        self.settings = small(self.dir)
        self.journal = QueueJournal(self.settings)
        self.model: dict[str, ModelQueue] = {}
        self.counter = 0
        self.now = 1000

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _queue(self, name: str) -> ModelQueue:
        return self.model.setdefault(name, ModelQueue())

    @rule(queue=st.sampled_from(QUEUES))
    def create(self, queue: str) -> None:
        exists = bool(
            self.model.get(queue) and (self.model[queue].messages or self.model[queue].suspended)
        )
        try:
            self.journal.create(queue)
            assert not exists
        except errors.QueueExists:
            assert exists

    @rule(
        queue=st.sampled_from(QUEUES), body=st.binary(max_size=40), ttl=st.sampled_from([0, 5, 50])
    )
    def write(self, queue: str, body: bytes, ttl: int) -> None:
        model = self._queue(queue)
        self.counter += 1
        expires = self.now + ttl if ttl else 0
        try:
            self.journal.write(queue, mid(self.counter), body, ts_ms=self.now, expires_ms=expires)
        except errors.QueueSuspended:
            assert model.suspended
            return
        except errors.QuotaExceeded:
            assert not model.suspended
            assert not model.can_write or len(model.messages) >= QUOTA
            if model.can_write:
                model.messages.append((mid(self.counter), b"", 0, True))
                model.can_write = False
            return
        assert not model.suspended
        assert model.can_write
        assert len(model.messages) < QUOTA
        model.messages.append((mid(self.counter), body, expires, False))

    @rule(queue=st.sampled_from(QUEUES))
    def peek(self, queue: str) -> None:
        model = self._queue(queue)
        head = self.journal.peek(queue)
        if not model.messages:
            assert head is None
        else:
            msg_id, body, expires, quota = model.messages[0]
            assert head is not None
            assert (head.msg_id, head.body, head.expires_ms, head.quota) == (
                msg_id,
                body,
                expires,
                quota,
            )

    def _pop(self, model: ModelQueue) -> None:
        model.messages.pop(0)
        if not model.messages:
            model.can_write = True

    @rule(queue=st.sampled_from(QUEUES), right=st.booleans())
    def ack(self, queue: str, right: bool) -> None:
        model = self._queue(queue)
        msg_id = model.messages[0][0] if model.messages and right else b"\xff" * 24
        try:
            self.journal.ack(queue, msg_id)
        except errors.NoMessage:
            assert not (model.messages and right)
            return
        assert model.messages
        assert right
        self._pop(model)

    @rule(step=st.integers(1, 30))
    def time_passes(self, step: int) -> None:
        self.now += step

    @rule(queue=st.sampled_from(QUEUES))
    def expire(self, queue: str) -> None:
        model = self._queue(queue)
        dropped = self.journal.expire(queue, self.now)
        expected = 0
        while model.messages and not model.messages[0][3] and 0 < model.messages[0][2] <= self.now:
            self._pop(model)
            expected += 1
        assert dropped == expected

    @rule()
    def expire_all(self) -> None:
        dropped = dict(self.journal.expire_all(self.now))
        for queue, model in self.model.items():
            expected = 0
            while (
                model.messages and not model.messages[0][3] and 0 < model.messages[0][2] <= self.now
            ):
                self._pop(model)
                expected += 1
            assert dropped.get(queue, 0) == expected

    @rule(queue=st.sampled_from(QUEUES))
    def suspend(self, queue: str) -> None:
        self.journal.suspend(queue)
        self._queue(queue).suspended = True

    @rule(queue=st.sampled_from(QUEUES))
    def delete(self, queue: str) -> None:
        self.journal.delete(queue)
        self.model[queue] = ModelQueue()

    @rule()
    def close_idle(self) -> None:
        self.journal.close_idle(0)
        assert self.journal.open_queues == 0

    @rule()
    def reopen(self) -> None:
        self.journal.close()
        self.journal = QueueJournal(self.settings)

    @rule()
    def crash(self) -> None:
        # Abandon the journal without closing it, as a killed process would (every call has
        # returned, so under FsyncPolicy.ALWAYS its log is durable): reopening replays the log.
        self.journal.wal.close()
        self.journal = QueueJournal(self.settings)

    @rule(steps=st.integers(0, 3))
    def crash_and_open_lazily(self, steps: int) -> None:
        # As `crash`, opening lazily (as `AsyncJournal` does): the invariants' reads make each
        # queue apply its own records, after `steps` queues applied by `catch_up`.
        self.journal.wal.close()
        self.journal = QueueJournal(self.settings, lazy=True)
        self.journal.catch_up(steps)

    @precondition(lambda self: True)
    @invariant()
    def sizes_and_bounds(self) -> None:
        assert self.journal.open_queues <= self.settings.max_open_queues
        for queue, model in self.model.items():
            info = self.journal.info(queue)
            assert info.size == len(model.messages)
            stored = [(m.msg_id, m.body, m.quota) for m in self.journal.messages(queue)]
            assert stored == [(i, body, quota) for i, body, _, quota in model.messages]
            assert info.suspended == model.suspended
            assert info.can_write == model.can_write
        assert self.journal.open_queues <= self.settings.max_open_queues

    @invariant()
    def empty_active_queues_leave_no_files_once_closed(self) -> None:
        for queue, model in self.model.items():
            if queue in self.journal._open or queue in self.journal._pending:
                continue  # dropped when closed, or once its replayed records are applied
            if not model.messages and not model.suspended:
                assert not any(p.exists() for p in self.journal.layout.paths(self.dir, queue))


JournalMachine.TestCase.settings = hsettings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestJournalModel = JournalMachine.TestCase
