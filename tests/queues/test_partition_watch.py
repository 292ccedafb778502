"""A partition's watch over real journals and store logs (decision 0021): with every changed
queue reported before its change, as the queue-writer's commands and sweep report them, the
watch's digest is a whole collection's at every step, and the changes since the watch,
carried as JSON and installed over the state it started from, give the source's state."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_queues import ids
from relay_queues import partition_state as ps
from relay_queues.partition_watch import Held, Watches
from relay_queues.writer import Signed
from tests.queues.test_partition_state import NOW, PARTITIONS, Engines, _queue_on

WATCHED = 1
OTHER = 2

ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "send", "send", "ack", "suspend", "delete", "expire"]),
        st.sampled_from([WATCHED, WATCHED, OTHER]),
        st.integers(0, 7),
    ),
    max_size=30,
)


def _signed(key: Ed25519PrivateKey) -> Signed:
    return Signed("t", key.sign(b"t"))


def _reported_create(
    engines: Engines, watches: Watches, partition: int
) -> tuple[ids.QueueId, ids.SenderId, Ed25519PrivateKey]:
    while True:
        queue, sender = ids.new_queue_ids(PARTITIONS)
        if ids.partition_of(queue, PARTITIONS) == partition:
            break
    watches.changed(queue)
    private = Ed25519PrivateKey.generate()
    key = ids.b64u(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    assert engines.rules.create(queue, sender, key, NOW).status == 201
    return queue, sender, private


@settings(max_examples=40, deadline=None)
@given(ops=ops, ttl=st.sampled_from([None, 1]))
def test_the_watch_digest_is_a_whole_collection_and_its_changes_rebuild_the_source(
    ops: list[tuple[str, int, int]], ttl: int | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Engines(Path(tmp) / "source"), Engines(Path(tmp) / "target")
        try:
            queues: dict[int, list[tuple[ids.QueueId, ids.SenderId, Ed25519PrivateKey]]] = {
                p: [_queue_on(source.rules, p) for _ in range(2)] for p in (WATCHED, OTHER)
            }
            source.journal.mark(ps.mark_key(WATCHED), "epochA:3")
            watches = Watches(PARTITIONS)
            watch = watches.start(WATCHED)
            base = source.state(WATCHED)  # the prefetch: the whole state, and the watch's
            watch.held = {q.record.recipient_id: Held.of(q) for q in base.queues}
            ps.install(target.journal, target.store, base)
            now = NOW
            for offset, (op, partition, n) in enumerate(ops, 4):
                mine = queues[partition]
                if op == "create":
                    mine.append(_reported_create(source, watches, partition))
                    continue
                if not mine:
                    continue
                queue, sender, key = mine[n % len(mine)]
                watches.changed(queue)
                if op == "send":
                    source.rules.send(sender, ids.new_id(), b"m%d" % offset, ttl, now)
                elif op == "ack":
                    head = source.rules.head(queue, _signed(key), now)
                    if head.status == 200:
                        source.rules.ack(queue, head.data["msg_id"], _signed(key), now)
                elif op == "suspend":
                    source.rules.suspend(queue, _signed(key), now)
                elif op == "delete":
                    source.rules.delete(queue, _signed(key))
                    mine.remove((queue, sender, key))
                else:  # the sweep, a second later: reported as it yields, before anything else
                    now += 2000
                    for event in source.rules.expire(now):
                        watches.changed(event.queue)
                source.journal.mark(ps.mark_key(WATCHED), f"epochA:{offset}")
                whole = ps.digest(source.state(WATCHED))
                assert watch.summary(source.journal, source.store)["digest"] == whole
            assert all(ids.partition_of(q, PARTITIONS) == WATCHED for q in watch.changed)

            changes = ps.from_json(ps.changes_to_json(watch.changes(source.journal, source.store)))
            assert isinstance(changes, ps.Changes)
            assert changes.digest == ps.digest(source.state(WATCHED))
            assert len(changes.queues) + len(changes.deleted) <= len(watch.changed)
            held = {q.record.recipient_id: ps.queue_digest(q) for q in base.queues}
            for _ in ps.installing_changes(target.journal, target.store, changes, held):
                pass
            assert ps.digest(target.state(WATCHED)) == changes.digest
        finally:
            source.close()
            target.close()
