"""The queue-writer restarting over many queues (issue 18, test-sized: 100,000): its stores
report ready without loading any queue record, and a queue not loaded yet is served at once
(SEND and SUB), read from the dump on demand. The full size is `bench/storelog_bench.py
--restart-queues 1000000`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queue_writer.stores import Stores
from relay_queues import ids
from relay_queues.delivery import Subscriber
from relay_queues.writer import QueueRules, Signed
from relay_runtime.readiness import Readiness
from relay_storelog import dumpfile
from relay_storelog.records import QueueRecord

QUEUES = 100_000
NOW = 1_800_000_000_000
KEY = Ed25519PrivateKey.generate()
PUBLIC = ids.b64u(KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def queue(i: int) -> QueueRecord:
    return QueueRecord(f"q{i:031d}", f"s{i:031d}", PUBLIC, 128, NOW, NOW)


def signed(text: str = "GET\n/x\n1\n-") -> Signed:
    return Signed(text, KEY.sign(text.encode()))


def _data_dir(root: Path) -> None:
    """100,000 queues in a dump, as the store log writes it, and a message in one journal."""
    (root / "store").mkdir(parents=True)
    with (root / "store" / "store-0.dump").open("wb") as f:
        dumpfile.write(f, (queue(i) for i in range(QUEUES)), {"epoch": "e", "p0": 5})
        f.flush()
        os.fsync(f.fileno())
    journal = QueueJournal(JournalSettings(root=root / "journal"))
    journal.write(queue(7).recipient_id, b"m" * 24, b"before the restart", ts_ms=NOW)
    journal.close()


def test_ready_without_loading_and_unloaded_queues_are_served(tmp_path: Path) -> None:
    _data_dir(tmp_path)

    async def run() -> None:
        readiness = Readiness()
        stores = Stores(tmp_path, readiness, 0, repair=False)
        await stores.open()
        assert stores.store is not None
        assert stores.journal is not None
        store = stores.store.store
        assert readiness.snapshot() == {"stores": True}
        assert len(store.queues) == QUEUES
        assert store.in_memory == 0  # ready, and not one queue record loaded
        rules = QueueRules(stores.journal.journal, store)

        # SUB to a queue with a message from before the restart: its head comes back.
        subscribed = rules.subscribe(
            ids.QueueId(queue(7).recipient_id), signed(), Subscriber(0, "c"), NOW
        )
        assert subscribed.status == 200
        (event,) = subscribed.events
        assert event.head is not None
        assert ids.unb64u(event.head.body) == b"before the restart"

        # SEND to another queue nobody has touched since the start, then SUB and read it.
        far = queue(91_234)
        sent = rules.send(ids.SenderId(far.sender_id), ids.new_id(), b"after", None, NOW)
        assert sent.status == 201, sent
        head = rules.head(ids.QueueId(far.recipient_id), signed(), NOW)
        assert head.status == 200
        assert ids.unb64u(head.data["body"]) == b"after"
        # A wrong key is still refused, and an unknown sender is still unknown.
        other = Ed25519PrivateKey.generate()
        text = "GET\n/x\n1\n-"
        refused = rules.head(
            ids.QueueId(far.recipient_id), Signed(text, other.sign(text.encode())), NOW
        )
        assert refused.status != 200
        unknown = rules.send(ids.SenderId("s" * 32), ids.new_id(), b"x", None, NOW)
        assert unknown.status == 404
        assert store.in_memory == 0  # served from the dump: still nothing loaded
        await stores.close()

    asyncio.run(run())
