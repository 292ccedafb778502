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
- `from_json` refuses anything malformed with `ValueError` before `install` changes anything.

Send keys (`relay_journal.keys`) are not carried: a producer retry of a SEND stored before the
move, reaching the new owner, is stored again (decision 0019, still to do).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
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


def _queue_digest(queue: QueueState) -> bytes:
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


def digest(state: PartitionState) -> str:
    """SHA-256 hex of the partition's state, whatever the order of `state.queues`."""
    h = hashlib.sha256(b"relay-partition-state/1\n")
    h.update(_field(f"{state.partition}/{state.partitions}".encode()))
    h.update(_field(state.mark.encode()))
    per_queue = sorted(_queue_digest(q) for q in state.queues)
    h.update(len(per_queue).to_bytes(8, "big"))
    for d in per_queue:
        h.update(d)
    return h.hexdigest()


def queue_ids(store: StoreLog, partition: int, partitions: int) -> list[str]:
    """The recipient ids of the partition's queues in the store, sorted."""
    return sorted(
        queue for queue in store.queues if ids.partition_of(queue, partitions) == partition
    )


def collect(
    journal: QueueJournal, store: StoreLog, partition: int, partitions: int
) -> PartitionState:
    """The partition's state as the engines hold it now (read-only: nothing is acknowledged or
    expired; queues it opens may stay open, as after any read)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not in 0..{partitions - 1}")
    queues = []
    for queue_id in queue_ids(store, partition, partitions):
        record = store.queues[queue_id]
        info = journal.info(queue_id)
        queues.append(QueueState(record, info.suspended, tuple(journal.messages(queue_id))))
    return PartitionState(
        partition, partitions, journal.marks.get(mark_key(partition), ""), tuple(queues)
    )


def install(journal: QueueJournal, store: StoreLog, state: PartitionState) -> tuple[int, int]:
    """Make the partition's queues on this journal and store exactly `state`'s, and its mark
    `state.mark` ("" forgets where reading was); returns (journal lsn, store seq) to wait
    durable for. Queues of the partition held here and absent from `state` are deleted; a queue
    held here exactly as in `state` (its digest) is left as it is, any other is rebuilt from
    scratch: a catch-up after a prefetch rewrites only the queues changed in between."""
    held = collect(journal, store, state.partition, state.partitions)
    same = {_queue_digest(q) for q in held.queues} & {_queue_digest(q) for q in state.queues}
    wanted = {q.record.recipient_id for q in state.queues}
    seq = 0
    dropped = set()
    for queue in held.queues:
        if queue.record.recipient_id not in wanted or _queue_digest(queue) not in same:
            journal.delete(queue.record.recipient_id)
            seq = store.delete(queue.record.recipient_id)
            dropped.add(queue.record.recipient_id)
    for queue in state.queues:
        if _queue_digest(queue) in same:
            continue
        queue_id = queue.record.recipient_id
        if queue_id not in dropped:
            journal.delete(queue_id)  # a folder the store did not know (nothing, most times)
        seq = store.new(queue.record)
        for m in queue.messages:
            if m.quota:
                try:
                    journal.write(queue_id, m.msg_id, b"", ts_ms=m.ts_ms)
                except journal_errors.QuotaExceeded:
                    continue
                raise ValueError(f"queue {queue_id}: quota marker below this journal's quota")
            journal.write(queue_id, m.msg_id, m.body, ts_ms=m.ts_ms, expires_ms=m.expires_ms)
        if queue.suspended:
            journal.suspend(queue_id)
    journal.mark(mark_key(state.partition), state.mark, alone=True)
    return journal.wal.written_lsn, seq


def empty(partition: int, partitions: int) -> PartitionState:
    """No queue and no mark: what `install` leaves of a partition this instance forgets (read
    from offset 0 if it is ever served here again without an import, as a volume that never
    held it)."""
    return PartitionState(partition, partitions, "", ())


# -- JSON form -----------------------------------------------------------------------------


def to_json(state: PartitionState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "partition": state.partition,
        "partitions": state.partitions,
        "mark": state.mark,
        "digest": digest(state),
        "queues": [
            {
                "record": q.record._asdict(),
                "suspended": q.suspended,
                "messages": [
                    [ids.b64u(m.msg_id), m.ts_ms, m.expires_ms, ids.b64u(m.body), m.quota]
                    for m in q.messages
                ],
            }
            for q in state.queues
        ],
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


def from_json(data: Any) -> PartitionState:
    """The state `to_json` gave; `ValueError` saying what is wrong otherwise (the digest it
    carries must be the digest of what it holds)."""
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
    raw_queues = data.get("queues")
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
    state = PartitionState(partition, partitions, mark, tuple(queues))
    if data.get("digest") != digest(state):
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
