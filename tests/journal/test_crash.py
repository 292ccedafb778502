"""Crash tests: a child writing and acking is SIGKILLed at random moments (50 kill points per
case, 6 cases: 300 per run), about a quarter of them while it opens the journal (replay of the
previous kill's log, the opening checkpoint); after each kill the journal reopens with every
acknowledged write present, in order, and nothing acknowledged as acked comes back."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relay_durable import prealloc
from relay_journal.journal import QueueJournal
from tests.helpers import ROOT
from tests.journal import crash_child

KILLS_PER_CASE = 50


class Child:
    def __init__(self) -> None:
        self.open_s = 0.01
        """How long the last child took to open the journal (replay, checkpoint): kills meant
        for recovery land within it, whatever the load on the machine."""

    def run_until_killed(
        self, root: Path, seed: int, rng: random.Random, *, in_recovery: bool, handles: int = 0
    ) -> list[str]:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.journal.crash_child",
                str(root),
                str(seed),
                str(handles),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "opening\n"
        if in_recovery:
            time.sleep(rng.uniform(0.0, self.open_s))
            child.send_signal(signal.SIGKILL)
            out, _ = child.communicate()
            return ["opening", *out.splitlines()]
        started = time.perf_counter()
        assert child.stdout.readline() == "ready\n"
        self.open_s = time.perf_counter() - started
        time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        return ["opening", "ready", *out.splitlines()]


@pytest.mark.parametrize(
    ("case", "handles"),
    [(0, 0), (1, 0), (2, 0), (3, 0), (4, 2), (5, 3)],
    ids=["0", "1", "2", "3", "4-two-handles", "5-three-handles"],
)
def test_acknowledged_writes_survive_sigkill(tmp_path: Path, case: int, handles: int) -> None:
    """Cases 4 and 5 bound the queue files' handles to two and three for six queues: handles
    are closed and reopened between nearly every write and read (buffered appends written
    first), and nothing acknowledged is lost either."""
    rng = random.Random(case)
    root = tmp_path / "journal"
    present: dict[str, list[int]] = {q: [] for q in crash_child.QUEUES}
    runner = Child()
    killed_opening = spared = 0
    for kill in range(KILLS_PER_CASE):
        in_recovery = rng.random() < 0.25
        lines = runner.run_until_killed(
            root, case * 1000 + kill + 1, rng, in_recovery=in_recovery, handles=handles
        )
        killed_opening += "ready" not in lines
        expected = {q: list(ids) for q, ids in present.items()}
        in_flight: dict[str, tuple[str, int]] = {}
        for line in lines:
            parts = line.split()
            if len(parts) != 3:
                continue  # the last line may be cut by the kill
            op, queue, n = parts[0], parts[1], int(parts[2])
            if op in ("w", "a"):
                in_flight[queue] = (op, n)
            elif op == "W":
                expected[queue].append(n)
                in_flight.pop(queue, None)
            elif op == "A":
                assert expected[queue][0] == n, "the child acked something that was not the head"
                expected[queue].pop(0)
                in_flight.pop(queue, None)

        # Segments are written over spares (zero-filled, then recycled): they must be in play.
        spared += (root / "wal" / prealloc.READY).exists()
        journal = QueueJournal(crash_child.settings(root, handles))
        try:
            assert journal.check() == []
            for queue in crash_child.QUEUES:
                actual = [int.from_bytes(m.msg_id, "big") for m in journal.messages(queue)]
                want = expected[queue]
                allowed = [want]
                op, n = in_flight.get(queue, ("", 0))
                if op == "w":
                    allowed.append([*want, n])
                elif op == "a" and want and want[0] == n:
                    allowed.append(want[1:])
                assert actual in allowed, f"kill {kill}, queue {queue}: {actual} not in {allowed}"
                present[queue] = actual
        finally:
            journal.close()
    assert killed_opening > 0, "no kill landed while the journal was opening"
    assert spared > 0, "no kill found a spare segment ready"
