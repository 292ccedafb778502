"""Crash tests: a child writing and acking is SIGKILLed at random moments (40 kill points per
case, 6 cases: 240 per run), about a quarter of them while it opens the journal (replay of the
previous kill's log, the opening checkpoint); after each kill the journal reopens with every
acknowledged write present, in order, and nothing acknowledged as acked comes back."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from relay_durable import prealloc
from relay_journal.journal import QueueJournal
from tests.helpers import ROOT, child_command
from tests.journal import crash_child

KILLS_PER_CASE = 40


class Child:
    def __init__(self) -> None:
        self.open_s = 0.01
        """How long the last child took to open the journal (replay, checkpoint): kills meant
        for recovery land within it, whatever the load on the machine."""

    def run_until_killed(
        self,
        root: Path,
        seed: int,
        rng: random.Random,
        *,
        in_recovery: bool,
        handles: int = 0,
        at_table: bool = False,
    ) -> list[str]:
        """Killed at a random moment of its opening (`in_recovery`), of its first 0.25 s of
        work, or (`at_table`) as soon as it reports its first to third table being written."""
        child = subprocess.Popen(
            child_command("tests.journal.crash_child", str(root), str(seed), str(handles)),
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
        if not at_table:
            time.sleep(rng.uniform(0.0, 0.25))
            child.send_signal(signal.SIGKILL)
            out, _ = child.communicate()
            return ["opening", "ready", *out.splitlines()]
        seen, wanted = [], rng.randint(1, 3)
        for line in child.stdout:
            seen.append(line.rstrip("\n"))
            wanted -= line == "table 1\n"
            if not wanted:
                break
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        return ["opening", "ready", *seen, *out.splitlines()]


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
    killed_opening = spared = killed_mid_table = 0
    for kill in range(KILLS_PER_CASE):
        in_recovery = rng.random() < 0.25
        lines = runner.run_until_killed(
            root, case * 1000 + kill + 1, rng, in_recovery=in_recovery, handles=handles
        )
        killed_opening += "ready" not in lines
        tables = [line for line in lines if line.startswith("table ")]
        killed_mid_table += bool(tables) and tables[-1] == "table 1"
        # Segments are written over spares (zero-filled, then recycled): they must be in play.
        spared += (root / "wal" / prealloc.READY).exists()
        _reopen_and_check(root, handles, present, lines, kill)
    assert killed_opening > 0, "no kill landed while the journal was opening"
    assert spared > 0, "no kill found a spare segment ready"
    print(f"case {case}: {killed_mid_table} of {KILLS_PER_CASE} kills while a table was written")


def test_kills_while_the_checkpoint_thread_writes_a_table_lose_nothing(tmp_path: Path) -> None:
    """A full segment's checkpoint writes its table on a thread while changes go on into the
    next segment; the older segments are deleted only once it is in force. The child is
    killed as soon as it reports a table being written (the first to third of its run), 30
    times: every acknowledged write is there after each, and most kills found the table
    unfinished (no `table 0` after it)."""
    rng = random.Random(7)
    root = tmp_path / "journal"
    present: dict[str, list[int]] = {q: [] for q in crash_child.QUEUES}
    runner = Child()
    mid_table = 0
    for kill in range(30):
        lines = runner.run_until_killed(root, 9000 + kill, rng, in_recovery=False, at_table=True)
        tables = [line for line in lines if line.startswith("table ")]
        mid_table += bool(tables) and tables[-1] == "table 1"
        _reopen_and_check(root, 0, present, lines, kill)
    print(f"{mid_table} of 30 kills landed while a table was written")
    assert mid_table >= 15, f"only {mid_table} of 30 kills landed while a table was written"


def _reopen_and_check(
    root: Path, handles: int, present: dict[str, list[int]], lines: list[str], kill: int
) -> None:
    """Reopen the journal the child was killed over: every write it acknowledged is there, in
    order, and nothing it acknowledged as acked came back (the write or ack in flight at the
    kill may or may not be). `present` becomes what the journal holds."""
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
