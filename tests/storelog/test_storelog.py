"""The store log: a crash at each dump step, restore rules, corruption messages, a model test."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from relay_storelog import records
from relay_storelog.store import DUMP_STEPS, StoreLog, StoreLogCorrupt, StoreLogSettings
from tests.helpers import ROOT, child_command
from tests.storelog import script


@pytest.mark.parametrize("step", DUMP_STEPS)
def test_a_crash_at_each_dump_step_restores_the_state_before_it(tmp_path: Path, step: str) -> None:
    result = subprocess.run(
        child_command("tests.storelog.dump_child", str(tmp_path), step),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -9, result.stderr  # killed at the step
    acked = [int(line) for line in result.stdout.split()]
    last = acked[-1]
    assert last >= script.DUMP_AFTER
    store = StoreLog(StoreLogSettings(root=tmp_path))
    restored = (dict(store.queues.items()), dict(store.offsets.items()))
    # The change in flight at the kill may or may not have landed; nothing acknowledged is lost.
    assert restored in (script.model(last), script.model(last + 1))
    store.close()


def test_dump_then_restore_keeps_everything_and_removes_old_files(tmp_path: Path) -> None:
    store = StoreLog(StoreLogSettings(root=tmp_path))
    for i in range(script.DUMP_AFTER + 1):
        script.apply(store, i)
    first = store.dump()
    assert store.dump() in (first, first + 1)  # a second trigger reports the running dump
    result = store.wait_dump()
    assert result is not None
    assert result.records == len(script.model(script.DUMP_AFTER)[0])
    for i in range(script.DUMP_AFTER + 1, script.DUMP_AFTER + 20):
        script.apply(store, i)
    store.close()
    dumps = [p for p in tmp_path.iterdir() if p.name.endswith(".dump")]
    assert len(dumps) == 1  # older dumps removed, no .saving left
    assert not list(tmp_path.glob("*.saving"))
    dumped = int(dumps[0].name.split("-")[1].split(".")[0])
    assert all(int(p.name.split("-")[1].split(".")[0]) > dumped for p in tmp_path.glob("*.log"))
    restored = StoreLog(StoreLogSettings(root=tmp_path))
    assert (dict(restored.queues.items()), dict(restored.offsets.items())) == script.model(
        script.DUMP_AFTER + 19
    )
    assert restored.by_sender("s00003") == script.record(3)
    restored.close()


def _store_with_log(root: Path) -> Path:
    store = StoreLog(StoreLogSettings(root=root))
    for i in range(5):
        script.apply(store, i)
    store.close()
    (path,) = [p for p in root.iterdir() if p.suffix == ".log"]
    return path


def test_torn_last_record_is_ignored(tmp_path: Path) -> None:
    path = _store_with_log(tmp_path)
    path.write_bytes(path.read_bytes()[:-5])
    store = StoreLog(StoreLogSettings(root=tmp_path))
    assert sorted(store.queues) == [f"r{i:05d}" for i in range(4)]
    store.new(script.record(9))  # appends after the torn record was cut
    store.close()
    again = StoreLog(StoreLogSettings(root=tmp_path))
    assert sorted(again.queues) == [*(f"r{i:05d}" for i in range(4)), "r00009"]
    again.close()


def test_corrupt_record_in_the_middle_stops_the_start_unless_repairing(tmp_path: Path) -> None:
    path = _store_with_log(tmp_path)
    data = bytearray(path.read_bytes())
    second_line = data.index(b"\n") + 1
    data[second_line + 12] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        StoreLogCorrupt,
        match=rf"^{path.name} line 2: checksum mismatch$",
    ):
        StoreLog(StoreLogSettings(root=tmp_path))
    store = StoreLog(StoreLogSettings(root=tmp_path), repair=True)
    assert sorted(store.queues) == [f"r{i:05d}" for i in (0, 2, 3, 4)]
    assert store.skipped == 1
    store.close()
    again = StoreLog(StoreLogSettings(root=tmp_path))  # the repair was dumped: a plain start
    assert sorted(again.queues) == [f"r{i:05d}" for i in (0, 2, 3, 4)]
    again.close()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"v1 new {}", "torn record (no end of line)"),
        (b"v1 new {} 00000000\n", "checksum mismatch"),
        (records.encode("new", {}).replace(b"v1", b"v7"), "checksum mismatch"),
    ],
)
def test_line_errors(raw: bytes, message: str) -> None:
    import re

    with pytest.raises(records.LineError, match=re.escape(message)):
        records.decode(raw)


def test_unknown_version_and_kind_are_named() -> None:
    import zlib

    def line(text: str) -> bytes:
        return f"{text} {zlib.crc32(text.encode()):08x}\n".encode()

    with pytest.raises(records.LineError, match="unknown record version 'v7'"):
        records.decode(line("v7 new {}"))
    with pytest.raises(records.LineError, match="unknown record kind 'rename'"):
        records.decode(line("v1 rename {}"))


class Killed(BaseException):
    """Stands for SIGKILL at a dump step: the dump stops there, its files stay as they are."""


def _quiet_about_kills(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is not Killed:
        threading.__excepthook__(args)


threading.excepthook = _quiet_about_kills


class StoreMachine(RuleBasedStateMachine):
    """Random changes and dumps, and kills at any dump step or between changes, restore to the
    model's state. A kill abandons the store without closing it (under FsyncPolicy.ALWAYS every
    returned change is already durable); a kill at a dump step stops the dump there, in the
    caller for steps 1-4 and in the dump thread for the others, leaving the files a SIGKILL at
    that step would (the SIGKILL itself is `test_a_crash_at_each_dump_step_...`)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="storelog-model-"))
        self.kill_at: str | None = None
        self.store = self._open()
        self.model: dict[str, records.QueueRecord] = {}
        self.offsets: dict[str, object] = {}
        self.n = 0

    def _on_step(self, name: str) -> None:
        if name == self.kill_at:
            raise Killed(name)

    def _open(self) -> StoreLog:
        return StoreLog(StoreLogSettings(root=self.dir, on_dump_step=self._on_step))

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule()
    def new(self) -> None:
        self.n += 1
        record = script.record(self.n)
        self.store.new(record)
        self.model[record.recipient_id] = record

    @rule(data=st.data())
    def suspend(self, data: st.DataObject) -> None:
        if self.model:
            rid = data.draw(st.sampled_from(sorted(self.model)))
            self.store.set_status(rid, "suspended", 7)
            self.model[rid] = self.model[rid]._replace(status="suspended", updated_at=7)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        if self.model:
            rid = data.draw(st.sampled_from(sorted(self.model)))
            self.store.delete(rid)
            del self.model[rid]

    @rule(partition=st.integers(0, 3), offset=st.integers(0, 10**6))
    def set_offsets(self, partition: int, offset: int) -> None:
        self.store.set_offsets({"epoch": "e", f"p{partition}": offset})
        self.offsets.update({"epoch": "e", f"p{partition}": offset})

    @rule(wait=st.booleans())
    def dump(self, wait: bool) -> None:
        self.store.dump()
        if wait:
            self.store.wait_dump()

    @rule(step=st.sampled_from([None, *DUMP_STEPS]))
    def kill(self, step: str | None) -> None:
        if step is None:
            self.store.wait_dump()  # a running dump would die with the process; files stay
        else:
            self.kill_at = step
            with contextlib.suppress(Killed):  # steps 1-4 stop here, the others in the thread
                self.store.dump()
            self.store.wait_dump()
            self.kill_at = None
        self.store.file.close()
        self.store = self._open()

    @invariant()
    def same_as_model(self) -> None:
        assert dict(self.store.queues.items()) == self.model
        assert dict(self.store.offsets.items()) == self.offsets


StoreMachine.TestCase.settings = hsettings(max_examples=40, stateful_step_count=30, deadline=None)
TestStoreModel = StoreMachine.TestCase


def test_async_store_log_shares_fsyncs_and_survives_a_dump_midway(tmp_path: Path) -> None:
    import asyncio

    from relay_storelog.aio import AsyncStoreLog

    async def run() -> None:
        store = AsyncStoreLog(StoreLogSettings(root=tmp_path))
        await asyncio.gather(*(store.new(script.record(i)) for i in range(100)))
        store.dump()  # switches the log file while writers keep going
        await asyncio.gather(*(store.new(script.record(i)) for i in range(100, 200)))
        assert store.store.file.synced == store.store.file.written
        assert 0 < store.commit.rounds < 100  # 200 changes shared the rounds
        await store.close()

    asyncio.run(run())
    restored = StoreLog(StoreLogSettings(root=tmp_path))
    assert sorted(restored.queues) == [f"r{i:05d}" for i in range(200)]
    restored.close()


def test_lines_written_with_the_json_module_read_back_byte_for_byte() -> None:
    """Lines written before orjson (json.dumps, compact, sorted) decode, and re-encode to the
    same bytes."""
    import json
    import zlib

    data = records.queue_to_data(script.record(7))
    text = f"v1 new {json.dumps(data, separators=(',', ':'), sort_keys=True)}"
    old = f"{text} {zlib.crc32(text.encode()):08x}\n".encode()
    assert records.decode(old) == records.Line("new", data)
    assert records.encode("new", data) == old
