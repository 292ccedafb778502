"""Child process for `test_missing_write_file_report`: writes and acks one queue as the case
says, with the queue closed and a checkpoint after the first three writes (so `queue.log` records
them: closing writes its line; a checkpoint alone would table them), makes the
log durable, prints `recorded <write file the checkpoint recorded> <queue folder>`, and
SIGKILLs itself.

    python -m tests.journal.missing_write_file_child ROOT QUEUE CASE
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from relay_journal.journal import QueueJournal
from tests.journal.conftest import mid, small

CASES = {
    # The first file is read to its end, switched away from and deleted after the checkpoint;
    # the log holds every ACK of the three messages the state line counts in it.
    "consumed": "a1 a2 w4 w5 w6 a3 a4 a5 w7",
    # One more write after the checkpoint; nothing acknowledged.
    "unread": "w4",
}


def main(root: Path, queue: str, case: str) -> None:
    journal = QueueJournal(small(root, max_queue_messages=4, max_file_messages=5))
    for n in (1, 2, 3):
        journal.write(queue, mid(n), f"m{n}".encode(), ts_ms=n)
    journal.close_idle(0)
    journal.checkpoint()
    folder = journal.layout.paths(journal.root, queue)[0]
    # structlog's default output (the journal's own lines) goes to stdout too: a marked line
    print("recorded", journal.info(queue).write.file, folder, flush=True)
    for step in CASES[case].split():
        n = int(step[1:])
        if step[0] == "w":
            journal.write(queue, mid(n), f"m{n}".encode(), ts_ms=n)
        else:
            head = journal.peek(queue)
            assert head is not None
            assert head.msg_id == mid(n)
            journal.ack(queue, head.msg_id)
    journal.sync()
    print("synced", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
