"""Which topics the archiver copies, and which records of each it keeps.

A rebuild needs what was asked and what was answered (decision 0012): the queue commands, the
publications (retained publishes, retained deletes, durable-stream writes) and the replies to
them on the ingress inbox. The inbox also carries deliveries and live fan-outs, which a rebuild
never reads and which hold payloads again: those offsets are read and covered by the files'
ranges but their records are not kept.

Invariant: a topic listed here is archived whole unless it names the kinds it keeps; records this
build cannot read (no `kind`) are kept on topics archived whole, so the archive is the log.
Pure: no I/O.
"""

from __future__ import annotations

from relay_bus import topics

ARCHIVED: dict[str, frozenset[str] | None] = {
    topics.QUEUE_COMMANDS: None,
    topics.PUBLICATIONS: None,
    topics.INGRESS_INBOX: frozenset({"queue_reply", "ds_reply", "admin_reply"}),
}
"""Logical topic → the record kinds kept (None: every record)."""


def keeps(topic: str, kind: str) -> bool:
    kinds = ARCHIVED[topic]
    return kinds is None or kind in kinds
