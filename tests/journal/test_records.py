from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_journal import records
from relay_journal.records import LogRecord, Message, Op, Pos, QueueState

_messages = st.builds(
    Message,
    msg_id=st.binary(min_size=24, max_size=24),
    ts_ms=st.integers(0, 2**63 - 1),
    expires_ms=st.integers(0, 2**63 - 1),
    body=st.binary(max_size=300),
    quota=st.booleans(),
)
_files = st.text("abcdef0123456789", min_size=8, max_size=8)
_pos = st.builds(Pos, _files, st.integers(0, 10**6), st.integers(0, 10**9))


@given(_messages)
def test_message_round_trip(message: Message) -> None:
    data = records.encode_message(message)
    assert records.decode_message(data) == (message, len(data))


@given(_messages, st.data())
def test_any_truncation_or_bit_flip_of_a_message_is_detected(
    message: Message, data: st.DataObject
) -> None:
    encoded = records.encode_message(message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(records.RecordError):
        records.decode_message(encoded[:cut])
    at = data.draw(st.integers(0, len(encoded) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(encoded)
    flipped[at] ^= 1 << bit
    with pytest.raises(records.RecordError):
        records.decode_message(bytes(flipped))


@given(_pos, _pos, st.integers(0, 1000), st.booleans(), st.booleans(), st.integers(0, 2**62))
def test_state_line_round_trip(
    read: Pos, write: Pos, size: int, can_write: bool, suspended: bool, lsn: int
) -> None:
    state = QueueState(read, write, size, can_write, suspended, lsn)
    line = records.encode_state(state)
    assert line.endswith(b"\n")
    assert records.decode_state(line) == state
    for cut in range(len(line)):
        with pytest.raises(records.RecordError):
            records.decode_state(line[:cut])


def test_unknown_versions_are_refused_by_name() -> None:
    message = bytearray(records.encode_message(Message(b"m" * 24, 1, 0, b"x")))
    message[0] = 7
    with pytest.raises(records.RecordError, match="unknown message record version 7"):
        records.decode_message(bytes(message))
    state = QueueState(Pos("a", 0, 0), Pos("a", 0, 0), 0)
    text = records.encode_state(state).decode().replace("v1 ", "v9 ", 1).rsplit(" crc=", 1)[0]
    import zlib

    line = f"{text} crc={zlib.crc32(text.encode()):08x}\n".encode()
    with pytest.raises(records.RecordError, match="unknown state line version 9"):
        records.decode_state(line)
    frame = records.encode_log(LogRecord(Op.SUSPEND, 5, "q" * 32))
    payload = bytearray(frame[8:])
    payload[0] = 3  # the version byte, re-framed with a valid checksum
    reframed = len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big")
    with pytest.raises(records.RecordError, match="unknown log record version 3"):
        records.decode_log(reframed + bytes(payload), 0)


@given(
    _messages, _files, st.integers(0, 2**62), st.text("abcdefXYZ_-0123", min_size=1, max_size=40)
)
def test_log_record_round_trip(message: Message, file: str, lsn: int, queue: str) -> None:
    for record in (
        LogRecord(Op.WRITE, lsn, queue, file=file, message=message),
        LogRecord(Op.ACK, lsn, queue, msg_id=message.msg_id, expired=True),
        LogRecord(Op.DROP, lsn, queue),
    ):
        data = records.encode_log(record)
        decoded, end = records.decode_log(data, 0)
        assert end == len(data)
        assert decoded._replace(message_bytes=b"") == record._replace(message_bytes=b"")
    # The write path's fast form is the same bytes.
    prefix = records.write_log_prefix(queue.encode(), file.encode())
    flags = records.FLAG_QUOTA if message.quota else 0
    fast = records.encode_write(
        lsn, prefix, message.msg_id, message.ts_ms, message.expires_ms, message.body, flags
    )
    logged = records.encode_log(LogRecord(Op.WRITE, lsn, queue, file=file, message=message))
    assert fast == (records.encode_message(message), logged)
