"""One command partition's queue state, as a unit: collected from a queue-writer's engines,
digested, carried as JSON, and installed into another queue-writer's engines (decision 0019,
"Hand-off of a queue-writer partition").

A partition's queues are those whose recipient id `relay_queues.ids.partition_of` maps to it:
every command of a queue (its SEND too, since a sender id is drawn on its recipient's
partition) is on that partition, so no other partition's commands change them. The state is
each such queue's store record, its suspension and its pending messages in order, plus the
journal mark of the partition (`<broker epoch>:<next offset>`, where reading resumes).

Invariants:
- `digest` is a pure function of that state and does not depend on the order queues are
  listed in: two queue-writers holding the same state of a partition give the same digest,
  and any difference in a record, a suspension, a message (id, timestamps, body, quota marker)
  or the mark gives another one (SHA-256 over a canonical, length-prefixed encoding);
- `install` goes through the engines (the store log's `new`/`delete`, the journal's writes,
  suspensions, deletions and `mark`), never through their files, and replaces the
  partition's queues on the target as a whole: installing the same state twice gives the same
  state (the digest after it equals the source's), and queues of other partitions are not
  touched;
- `from_json` refuses anything malformed with `ValueError` before `install` changes anything;
- `Changes` (the queues changed since a whole state was taken, `relay_queues.partition_watch`)
  installed over that whole state give the state it was taken from; their `digest` is of the
  whole partition, so it is checked against the target's digest after the install, not
  against what they carry.

Send keys (`relay_journal.keys`) are not carried: a producer retry of a SEND stored before the
move, reaching the new owner, is stored again (decision 0019, still to do).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from relay_journal import errors as journal_errors
from relay_journal.journal import QueueJournal
from relay_journal.records import MSG_ID_BYTES, Message
from relay_queues import ids
from relay_storelog.records import STATUSES, QueueRecord
from relay_storelog.store import StoreLog

FORMAT = 1
"""Version of the JSON form (`to_json`)."""


def mark_key(partition: int) -> str:
    """The journal mark of a command partition (the queue-writer's `Commands`)."""
    return f"p{partition}"


@dataclass(frozen=True)
class QueueState:
    record: QueueRecord
    suspended: bool
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class PartitionState:
    partition: int
    partitions: int
    mark: str
    """`<broker epoch>:<next offset>`, or "" when the partition was never read."""
    queues: tuple[QueueState, ...]

    @property
    def messages(self) -> int:
        return sum(len(q.messages) for q in self.queues)


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def queue_digest(queue: QueueState) -> bytes:
    h = hashlib.sha256()
    for value in queue.record:
        h.update(_field(str(value).encode()))
    h.update(b"S" if queue.suspended else b"A")
    h.update(len(queue.messages).to_bytes(8, "big"))
    for m in queue.messages:
        h.update(_field(m.msg_id))
        h.update(m.ts_ms.to_bytes(8, "big", signed=True))
        h.update(m.expires_ms.to_bytes(8, "big", signed=True))
        h.update(b"Q" if m.quota else b"M")
        h.update(_field(m.body))
    return h.digest()


def whole_digest(partition: int, partitions: int, mark: str, per_queue: Iterable[bytes]) -> str:
    """SHA-256 hex of a partition's state from its mark and its queues' `queue_digest`s, in
    any order."""
    h = hashlib.sha256(b"relay-partition-state/1\n")
    h.update(_field(f"{partition}/{partitions}".encode()))
    h.update(_field(mark.encode()))
    ordered = sorted(per_queue)
    h.update(len(ordered).to_bytes(8, "big"))
    for d in ordered:
        h.update(d)
    return h.hexdigest()


def digest(state: PartitionState) -> str:
    """SHA-256 hex of the partition's state, whatever the order of `state.queues`."""
    return whole_digest(
        state.partition, state.partitions, state.mark, (queue_digest(q) for q in state.queues)
    )


def queue_ids(store: StoreLog, partition: int, partitions: int) -> list[str]:
    """The recipient ids of the partition's queues in the store, sorted."""
    return sorted(
        queue for queue in store.queues if ids.partition_of(queue, partitions) == partition
    )


def collect_queue(journal: QueueJournal, store: StoreLog, queue_id: str) -> QueueState | None:
    """One queue's state as the engines hold it now; None if the store does not hold it."""
    record = store.queues.get(queue_id)
    if record is None:
        return None
    info = journal.info(queue_id)
    return QueueState(record, info.suspended, tuple(journal.messages(queue_id)))


def collect(
    journal: QueueJournal, store: StoreLog, partition: int, partitions: int
) -> PartitionState:
    """The partition's state as the engines hold it now (read-only: nothing is acknowledged or
    expired; queues it opens may stay open, as after any read)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not in 0..{partitions - 1}")
    queues = []
    for queue_id in queue_ids(store, partition, partitions):
        state = collect_queue(journal, store, queue_id)
        assert state is not None  # listed from the store just now
        queues.append(state)
    return PartitionState(
        partition, partitions, journal.marks.get(mark_key(partition), ""), tuple(queues)
    )


def drop_queue(journal: QueueJournal, store: StoreLog, queue_id: str) -> int:
    """Delete a queue this instance holds from both engines; returns the store seq."""
    journal.delete(queue_id)
    return store.delete(queue_id)


def put_queue(journal: QueueJournal, store: StoreLog, queue: QueueState, *, held: bool) -> int:
    """Make the queue exactly `queue` on both engines, from scratch (`held`: the store holds a
    queue of that id now, deleted first); returns the store seq."""
    queue_id = queue.record.recipient_id
    if held:
        drop_queue(journal, store, queue_id)
    else:
        journal.delete(queue_id)  # a folder the store did not know (nothing, most times)
    seq = store.new(queue.record)
    for m in queue.messages:
        if m.quota:
            # Below the quota too: the messages before it may have been acked or expired.
            with contextlib.suppress(journal_errors.QuotaExceeded):
                journal.write(queue_id, m.msg_id, b"", ts_ms=m.ts_ms, marker=True)
            continue
        journal.write(queue_id, m.msg_id, m.body, ts_ms=m.ts_ms, expires_ms=m.expires_ms)
    if queue.suspended:
        journal.suspend(queue_id)
    return seq


def _replacing(
    journal: QueueJournal,
    store: StoreLog,
    partition: int,
    queues: Iterable[QueueState],
    gone: Iterable[str],
    mark: str,
    held: Mapping[str, bytes],
) -> Iterator[int]:
    """Delete the `gone` queues held here, rebuild each of `queues` not held exactly so, then
    set the mark: one step per queue deleted or rebuilt, each yielding the store seq so far,
    then one for the mark."""
    seq = 0
    for queue_id in gone:
        if queue_id in held:
            seq = drop_queue(journal, store, queue_id)
            yield seq
    for queue in queues:
        queue_id = queue.record.recipient_id
        if held.get(queue_id) != queue_digest(queue):
            seq = put_queue(journal, store, queue, held=queue_id in held)
            yield seq
    journal.mark(mark_key(partition), mark, alone=True)
    yield seq


def installing(
    journal: QueueJournal, store: StoreLog, state: PartitionState, held: Mapping[str, bytes]
) -> Iterator[int]:
    """The steps of `install` given `held`, the `queue_digest` of each queue of the partition
    held here now (a caller may let other work run between steps, as long as nothing changes
    the partition)."""
    wanted = {q.record.recipient_id for q in state.queues}
    gone = [queue_id for queue_id in held if queue_id not in wanted]
    return _replacing(journal, store, state.partition, state.queues, gone, state.mark, held)


def install(journal: QueueJournal, store: StoreLog, state: PartitionState) -> tuple[int, int]:
    """Make the partition's queues on this journal and store exactly `state`'s, and its mark
    `state.mark` ("" forgets where reading was); returns (journal lsn, store seq) to wait
    durable for. Queues of the partition held here and absent from `state` are deleted; a queue
    held here exactly as in `state` (its digest) is left as it is, any other is rebuilt from
    scratch: a catch-up after a prefetch rewrites only the queues changed in between."""
    now = collect(journal, store, state.partition, state.partitions)
    held = {q.record.recipient_id: queue_digest(q) for q in now.queues}
    *_, seq = installing(journal, store, state, held)
    return journal.wal.written_lsn, seq


@dataclass(frozen=True)
class Changes:
    """The queues of a partition changed since a whole state of it was taken (`since` names
    that state, `relay_queues.partition_watch`): their states now and the ids of those gone,
    the mark now, and `digest`, the whole partition's digest now."""

    partition: int
    partitions: int
    since: str
    mark: str
    queues: tuple[QueueState, ...]
    deleted: tuple[str, ...]
    digest: str


def installing_changes(
    journal: QueueJournal, store: StoreLog, changes: Changes, held: Mapping[str, bytes]
) -> Iterator[int]:
    """As `installing`, for the queues `changes` names only (the others are left as held)."""
    return _replacing(
        journal, store, changes.partition, changes.queues, changes.deleted, changes.mark, held
    )


def empty(partition: int, partitions: int) -> PartitionState:
    """No queue and no mark: what `install` leaves of a partition this instance forgets (read
    from offset 0 if it is ever served here again without an import, as a volume that never
    held it)."""
    return PartitionState(partition, partitions, "", ())


# -- JSON form -----------------------------------------------------------------------------


def _queue_json(queue: QueueState) -> dict[str, Any]:
    return {
        "record": queue.record._asdict(),
        "suspended": queue.suspended,
        "messages": [
            [ids.b64u(m.msg_id), m.ts_ms, m.expires_ms, ids.b64u(m.body), m.quota]
            for m in queue.messages
        ],
    }


def to_json(state: PartitionState, since: str | None = None) -> dict[str, Any]:
    """The whole state; `since` names it for a later `Changes` (a watch's token)."""
    unit = {
        "format": FORMAT,
        "partition": state.partition,
        "partitions": state.partitions,
        "mark": state.mark,
        "digest": digest(state),
        "queues": [_queue_json(q) for q in state.queues],
    }
    return unit if since is None else {**unit, "since": since}


def changes_to_json(changes: Changes) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "changes": True,
        "since": changes.since,
        "partition": changes.partition,
        "partitions": changes.partitions,
        "mark": changes.mark,
        "digest": changes.digest,
        "queues": [_queue_json(q) for q in changes.queues],
        "deleted": list(changes.deleted),
    }


def _int(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise ValueError(f"{what} must be an integer of at least {low}")
    return value


def _bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be base64url text")
    try:
        return ids.unb64u(value)
    except ValueError:
        raise ValueError(f"{what} is not base64url") from None


def _message(value: Any, where: str) -> Message:
    if not isinstance(value, list) or len(value) != 5:
        raise ValueError(f"{where}: a message is [msg_id, ts_ms, expires_ms, body, quota]")
    msg_id = _bytes(value[0], f"{where} msg_id")
    if len(msg_id) != MSG_ID_BYTES:
        raise ValueError(f"{where}: msg_id must be {MSG_ID_BYTES} bytes")
    if not isinstance(value[4], bool):
        raise ValueError(f"{where}: quota must be true or false")
    return Message(
        msg_id,
        _int(value[1], f"{where} ts_ms"),
        _int(value[2], f"{where} expires_ms"),
        _bytes(value[3], f"{where} body"),
        value[4],
    )


def _record(value: Any, where: str, partition: int, partitions: int) -> QueueRecord:
    if not isinstance(value, dict) or set(value) != set(QueueRecord._fields):
        raise ValueError(f"{where}: a record has exactly {', '.join(QueueRecord._fields)}")
    for name in ("recipient_id", "sender_id", "recipient_key", "status"):
        if not isinstance(value[name], str):
            raise ValueError(f"{where}: {name} must be text")
    ids.id_bytes(value["recipient_id"])  # InvalidId (a ValueError) for a malformed id
    ids.id_bytes(value["sender_id"])
    if value["status"] not in STATUSES:
        raise ValueError(f"{where}: status must be one of {sorted(STATUSES)}")
    if ids.partition_of(value["recipient_id"], partitions) != partition:
        raise ValueError(f"{where}: queue {value['recipient_id']} is not on partition {partition}")
    return QueueRecord(
        value["recipient_id"],
        value["sender_id"],
        value["recipient_key"],
        _int(value["quota"], f"{where} quota", 1),
        _int(value["created_at"], f"{where} created_at"),
        _int(value["updated_at"], f"{where} updated_at"),
        value["status"],
    )


def _queues(raw_queues: Any, partition: int, partitions: int) -> tuple[QueueState, ...]:
    if not isinstance(raw_queues, list):
        raise ValueError("queues must be a list")
    queues = []
    seen: set[str] = set()
    for n, raw in enumerate(raw_queues):
        where = f"queues[{n}]"
        if not isinstance(raw, dict) or set(raw) != {"record", "suspended", "messages"}:
            raise ValueError(f"{where}: a queue has exactly record, suspended, messages")
        record = _record(raw["record"], where, partition, partitions)
        if record.recipient_id in seen:
            raise ValueError(f"{where}: queue {record.recipient_id} listed twice")
        seen.add(record.recipient_id)
        if not isinstance(raw["suspended"], bool) or not isinstance(raw["messages"], list):
            raise ValueError(f"{where}: suspended is true or false, messages a list")
        messages = tuple(
            _message(m, f"{where}.messages[{i}]") for i, m in enumerate(raw["messages"])
        )
        if any(m.quota for m in messages[:-1]):
            raise ValueError(f"{where}: only the last message may be the quota marker")
        queues.append(QueueState(record, raw["suspended"], messages))
    return tuple(queues)


def _deleted(raw: Any, partition: int, partitions: int, kept: set[str]) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(q, str) for q in raw):
        raise ValueError("deleted must be a list of queue ids")
    for queue_id in raw:
        ids.id_bytes(queue_id)  # InvalidId (a ValueError) for a malformed id
        if ids.partition_of(queue_id, partitions) != partition:
            raise ValueError(f"deleted: queue {queue_id} is not on partition {partition}")
    if len(set(raw)) != len(raw) or kept & set(raw):
        raise ValueError("deleted lists a queue twice, or one it also carries")
    return tuple(raw)


def from_json(data: Any) -> PartitionState | Changes:
    """The state `to_json` gave (the digest it carries must be the digest of what it holds),
    or the changes `changes_to_json` gave (their digest is the whole partition's: checked
    after the install); `ValueError` saying what is wrong otherwise."""
    if not isinstance(data, dict):
        raise ValueError("a partition state is a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"format must be {FORMAT}")
    partitions = _int(data.get("partitions"), "partitions", 1)
    partition = _int(data.get("partition"), "partition")
    if partition >= partitions:
        raise ValueError(f"partition {partition} is not in 0..{partitions - 1}")
    mark = data.get("mark")
    if not isinstance(mark, str) or (mark and not _is_mark(mark)):
        raise ValueError("mark must be '' or '<epoch>:<offset>'")
    queues = _queues(data.get("queues"), partition, partitions)
    since = data.get("since")
    if since is not None and (not isinstance(since, str) or not since):
        raise ValueError("since must be a non-empty text")
    claimed = data.get("digest")
    if data.get("changes", False) is not False:
        if data["changes"] is not True or since is None:
            raise ValueError("changes is true and comes with since, or is absent")
        if not isinstance(claimed, str) or len(claimed) != 64:
            raise ValueError("digest must be 64 hex digits")
        kept = {q.record.recipient_id for q in queues}
        deleted = _deleted(data.get("deleted"), partition, partitions, kept)
        return Changes(partition, partitions, since, mark, queues, deleted, claimed)
    state = PartitionState(partition, partitions, mark, queues)
    if claimed != digest(state):
        raise ValueError("digest does not match the state it comes with")
    return state


def _is_mark(mark: str) -> bool:
    epoch, sep, offset = mark.rpartition(":")
    return bool(sep and epoch and offset.isdigit())


def summary(states: Iterable[PartitionState]) -> list[dict[str, Any]]:
    """Digest, mark and counts of each state (what the hand-off endpoints answer)."""
    return [
        {
            "partition": s.partition,
            "mark": s.mark,
            "digest": digest(s),
            "queues": len(s.queues),
            "messages": s.messages,
        }
        for s in states
    ]
