"""Send keys under SIGKILL (`relay_journal.keys`): a child writing keyed messages, with
checkpoints (and so key-file appends) every few dozen writes, is killed again and again; after
each kill every key it acknowledged is answered with its own message, each message is stored
once, and the next child's retries of the last keys find them instead of writing again."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

from relay_journal.journal import QueueJournal
from tests.helpers import ROOT, child_command
from tests.journal import send_key_child as child

KILLS = 12


def _run_until_killed(root: Path, start: int, count: int) -> tuple[dict[int, str], int]:
    """(retried key → what the journal answered, last acknowledged n) of one child."""
    process = subprocess.Popen(
        child_command("tests.journal.send_key_child", str(root), str(start)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    retried: dict[int, str] = {}
    acked = start - 1
    for line in process.stdout:
        if line.startswith("R "):
            _, n, answer = line.split()
            retried[int(n)] = answer
            continue
        acked = int(line)
        if acked >= start + count:
            break
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return retried, acked


def test_acknowledged_keys_survive_sigkill_and_are_never_written_twice(tmp_path: Path) -> None:
    rng = random.Random(18)
    root = tmp_path / "journal"
    start = 0
    for _ in range(KILLS):
        retried, acked = _run_until_killed(root, start, rng.randint(5, 400))
        # Every retried key below `start` had been acknowledged: answered with its own message.
        assert retried == {n: str(n) for n in range(max(0, start - child.RETRIES), start)}
        journal = QueueJournal(child.settings(root))
        try:
            now = time.time() * 1000
            for n in range(acked + 1):
                sent = journal.sent(child.key(n), int(now))
                assert sent is not None, n
                assert sent.msg_id == child.msg_id(n)
            stored = [m.msg_id for q in child.QUEUES for m in journal.messages(q)]
            assert len(stored) == len(set(stored))
        finally:
            journal.close()
        start = acked + 1
    assert list((root / "keys").iterdir())
