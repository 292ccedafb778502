"""The plain-Python rebuild (pyarrow, one process): archived commands joined with their
replies, replayed by `relay_archive.replay`. The Spark jobs do the same work distributed; this
one is the reference they are tested against, and the benchmark's baseline.

Invariants: only the archive of one epoch is read; a command at or past the cut's offset for
its partition is left out (the live state had not applied it); a publication stands where
the retainer's cut puts it (`relay_archive.standing`: exact per store where the stores' marks
are known, a bounded window's records unanswered where not); the first reply archived for a
command id is the one used (every copy of a reply says the same).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from relay_archive import reader, replay, tables
from relay_archive.store import ArchiveStore
from relay_bus import topics


def first_replies(store: ArchiveStore, epoch: str, kind: str) -> dict[str, bytes]:
    inbox = reader.scan(store, epoch, topics.INGRESS_INBOX, kinds=[kind]).table
    replies: dict[str, bytes] = {}
    for request_id, value in zip(inbox["id"].to_pylist(), inbox["value"].to_pylist(), strict=True):
        replies.setdefault(request_id, value)
    return replies


def answered(
    requests: pa.Table, replies: dict[str, bytes], cut: dict[int, int] | None
) -> Iterator[replay.Answered]:
    """Each request before the cut (every one when None) with its first reply."""
    columns = (requests[c].to_pylist() for c in ("partition", "offset", "id", "value"))
    for partition, offset, request_id, value in zip(*columns, strict=True):
        if cut is not None and offset >= cut.get(partition, 0):
            continue
        yield replay.Answered(partition, offset, value, replies.get(request_id))


def rebuild_queues(store: ArchiveStore, cut: tables.Cut) -> replay.QueueState:
    commands = reader.scan(store, cut.epoch, topics.QUEUE_COMMANDS, kinds=["queue_cmd"]).table
    replies = first_replies(store, cut.epoch, "queue_reply")
    return replay.replay_queues(answered(commands, replies, cut.offsets))


def rebuild_retained(store: ArchiveStore, cut: tables.Cut) -> replay.RetainedState:
    kinds = ["publication", "retained_request"]
    publications = reader.scan(store, cut.epoch, topics.PUBLICATIONS, kinds=kinds).table
    replies = first_replies(store, cut.epoch, "ds_reply")
    return replay.replay_retained(answered(publications, replies, None), cut=cut.publication_cut())


def rebuild_streams(store: ArchiveStore, cut: tables.Cut) -> replay.StreamState:
    requests = reader.scan(store, cut.epoch, topics.PUBLICATIONS, kinds=["ds_request"]).table
    replies = first_replies(store, cut.epoch, "ds_reply")
    return replay.replay_streams(answered(requests, replies, None), cut=cut.publication_cut())
