"""One partition's queue state over real journals and store logs (decision 0019, hand-off of a
queue-writer partition): collected on a source, carried as JSON, installed on a target through
the engines; the digests agree exactly when the states do."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import ids
from relay_queues import partition_state as ps
from relay_queues.writer import QueueRules, Signed
from relay_storelog.store import StoreLog, StoreLogSettings

NOW = 1_800_000_000_000
PARTITIONS = 4


class Engines:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.open()

    def open(self) -> None:
        self.journal = QueueJournal(
            JournalSettings(root=self.root / "journal", max_queue_messages=3)
        )
        self.store = StoreLog(StoreLogSettings(root=self.root / "store"))
        self.rules = QueueRules(self.journal, self.store)

    def close(self) -> None:
        self.journal.close()
        self.store.close()

    def state(self, partition: int) -> ps.PartitionState:
        return ps.collect(self.journal, self.store, partition, PARTITIONS)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Engines]:
    engines = Engines(tmp_path / "source")
    yield engines
    engines.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Engines]:
    engines = Engines(tmp_path / "target")
    yield engines
    engines.close()


def _queue_on(
    rules: QueueRules, partition: int
) -> tuple[ids.QueueId, ids.SenderId, Ed25519PrivateKey]:
    while True:
        queue, sender = ids.new_queue_ids(PARTITIONS)
        if ids.partition_of(queue, PARTITIONS) == partition:
            break
    private = Ed25519PrivateKey.generate()
    key = ids.b64u(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    assert rules.create(queue, sender, key, NOW).status == 201
    return queue, sender, private


def _send(rules: QueueRules, sender: ids.SenderId, body: bytes, ttl_s: int | None = None) -> None:
    assert rules.send(sender, ids.new_id(), body, ttl_s, NOW).status == 201


def _fill(engines: Engines) -> dict[int, list[ids.QueueId]]:
    """Queues on partitions 1 and 2: one with messages, one drained, one full (quota marker),
    one suspended."""
    rules = engines.rules
    made: dict[int, list[ids.QueueId]] = {1: [], 2: []}
    for partition in (1, 2):
        q1, s1, _ = _queue_on(rules, partition)
        _send(rules, s1, b"one", ttl_s=60)
        _send(rules, s1, b"two")
        q2, s2, k2 = _queue_on(rules, partition)
        _send(rules, s2, b"gone")
        head = rules.head(q2, Signed("t", k2.sign(b"t")), NOW)
        assert rules.ack(q2, head.data["msg_id"], Signed("t", k2.sign(b"t")), NOW).status == 204
        q3, s3, _ = _queue_on(rules, partition)
        for n in range(3):
            _send(rules, s3, b"m%d" % n)
        assert rules.send(s3, ids.new_id(), b"over", None, NOW).status == 429
        q4, s4, k4 = _queue_on(rules, partition)
        _send(rules, s4, b"kept")
        assert rules.suspend(q4, Signed("t", k4.sign(b"t")), NOW).status == 200
        made[partition] = [q1, q2, q3, q4]
    engines.journal.mark("p1", "epochA:17")
    engines.journal.mark("p2", "epochA:9")
    return made


def test_installed_state_has_the_sources_digest_and_leaves_other_partitions(
    source: Engines, target: Engines
) -> None:
    made = _fill(source)
    _fill(target)  # the target holds other queues of partitions 1 and 2
    before_p2 = ps.digest(target.state(2))
    state = source.state(1)
    assert sorted(q.record.recipient_id for q in state.queues) == sorted(made[1])
    assert state.mark == "epochA:17"
    assert [len(q.messages) for q in sorted(state.queues, key=lambda q: q.record.recipient_id)]
    full = next(q for q in state.queues if q.record.recipient_id == made[1][2])
    assert [m.quota for m in full.messages] == [False, False, False, True]

    carried = ps.from_json(ps.to_json(state))
    assert ps.digest(carried) == ps.digest(state)
    assert ps.digest(target.state(1)) != ps.digest(state)
    ps.install(target.journal, target.store, carried)
    assert ps.digest(target.state(1)) == ps.digest(state)
    assert ps.digest(target.state(2)) == before_p2
    # Again: the same state, and no queue rewritten (only the mark is logged again).
    logged = target.journal.wal.written_lsn
    ps.install(target.journal, target.store, carried)
    assert ps.digest(target.state(1)) == ps.digest(state)
    assert target.journal.wal.written_lsn == logged + 1
    # One queue changed on the source since: only it is rewritten, and the digests agree.
    changed = next(q for q in state.queues if not q.suspended and len(q.messages) < 3)
    _send(source.rules, ids.SenderId(changed.record.sender_id), b"late")
    later = source.state(1)
    logged = target.journal.wal.written_lsn
    ps.install(target.journal, target.store, ps.from_json(ps.to_json(later)))
    assert ps.digest(target.state(1)) == ps.digest(later) != ps.digest(state)
    rewritten = target.journal.wal.written_lsn - logged  # a drop, the messages, the mark
    assert rewritten == 1 + len(changed.messages) + 1 + 1, rewritten
    state = later

    # Durable through the engines: the same after a restart of the target.
    target.close()
    target.open()
    assert ps.digest(target.state(1)) == ps.digest(state)
    assert target.journal.marks["p1"] == "epochA:17"
    suspended = target.store.queues[made[1][3]]
    assert target.journal.info(made[1][3]).suspended
    assert suspended.recipient_id == made[1][3]


def test_digest_ignores_order_and_sees_every_difference(source: Engines) -> None:
    _fill(source)
    state = source.state(1)
    reordered = ps.PartitionState(state.partition, state.partitions, state.mark, state.queues[::-1])
    assert ps.digest(reordered) == ps.digest(state)
    # The queue holding two messages first: reversing them is a change.
    first = next(q for q in state.queues if len(q.messages) == 2)
    rest = tuple(q for q in state.queues if q is not first)
    state = ps.PartitionState(1, PARTITIONS, state.mark, (first, *rest))
    changes = [
        ps.PartitionState(1, PARTITIONS, "epochA:18", state.queues),
        ps.PartitionState(1, PARTITIONS, state.mark, state.queues[1:]),
        ps.PartitionState(
            1,
            PARTITIONS,
            state.mark,
            (ps.QueueState(first.record, not first.suspended, first.messages), *rest),
        ),
        ps.PartitionState(
            1,
            PARTITIONS,
            state.mark,
            (ps.QueueState(first.record, first.suspended, first.messages[::-1]), *rest),
        ),
        ps.PartitionState(
            1,
            PARTITIONS,
            state.mark,
            (
                ps.QueueState(first.record._replace(updated_at=1), first.suspended, first.messages),
                *rest,
            ),
        ),
    ]
    digests = {ps.digest(state)} | {ps.digest(c) for c in changes}
    assert len(digests) == len(changes) + 1


def _broken(good: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    bad = copy.deepcopy(good)
    at: Any = bad
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value
    return bad


def test_malformed_states_are_refused_and_install_nothing(source: Engines, target: Engines) -> None:
    _fill(source)
    good = ps.to_json(source.state(1))
    good["queues"].sort(key=lambda q: -len(q["messages"]))  # queues[0] holds messages
    before = ps.digest(target.state(1))
    assert ps.digest(ps.from_json(good)) == good["digest"]  # the cases below differ only so
    bad_cases = [
        ([], "JSON object"),
        (_broken(good, ["format"], 2), "format"),
        (_broken(good, ["partition"], PARTITIONS), "not in 0..3"),
        (_broken(good, ["mark"], "nocolon"), "mark"),
        (_broken(good, ["queues"], {}), "queues must be a list"),
        (_broken(good, ["digest"], "0" * 64), "digest does not match"),
        (_broken(good, ["queues", 0, "messages", 0, 0], "c2hvcnQ"), "msg_id must be 24 bytes"),
        (_broken(good, ["queues", 0, "messages", 0, 1], -1), "ts_ms"),
        (_broken(good, ["queues", 0, "messages", 0, 3], "aGk="), "body is not base64url"),
        (_broken(good, ["queues", 0, "messages", 0, 3], "a+b/"), "body is not base64url"),
        (_broken(good, ["queues", 0, "record", "status"], "gone"), "status"),
        (_broken(good, ["queues", 0, "suspended"], "yes"), "suspended"),
        (_broken(good, ["partition"], 2), "not on partition 2"),  # partition 1's queues
    ]
    for bad, reason in bad_cases:
        with pytest.raises(ValueError, match=reason):
            ps.from_json(bad)
    assert ps.digest(target.state(1)) == before


def test_a_sweep_limited_to_served_partitions_leaves_a_kept_copy_alone(source: Engines) -> None:
    _fill(source)  # a head message with a 60 s TTL on each of partitions 1 and 2
    kept, served = ps.digest(source.state(1)), ps.digest(source.state(2))
    later = NOW + 120_000
    swept = list(source.rules.expire(later, lambda q: ids.partition_of(q, PARTITIONS) == 2))
    assert [ids.partition_of(e.queue, PARTITIONS) for e in swept] == [2]
    assert ps.digest(source.state(1)) == kept
    assert ps.digest(source.state(2)) != served
    assert [ids.partition_of(e.queue, PARTITIONS) for e in source.rules.expire(later)] == [1]


def test_a_quota_marker_that_outlived_the_messages_before_it_is_installed_as_it_is(
    source: Engines, target: Engines
) -> None:
    """A full queue whose messages expired: only its quota marker is left, below the quota.
    Installed elsewhere (a partition move), the queue is the same marker, not an error."""
    queue, sender, _ = _queue_on(source.rules, 1)
    for n in range(3):
        _send(source.rules, sender, b"m%d" % n, ttl_s=1)
    assert source.rules.send(sender, ids.new_id(), b"over", None, NOW).status == 429
    assert [e.queue for e in source.rules.expire(NOW + 2000)] == [queue]
    state = source.state(1)
    (left,) = state.queues
    assert [m.quota for m in left.messages] == [True]

    ps.install(target.journal, target.store, state)
    assert ps.digest(target.state(1)) == ps.digest(state)
