"""Ids and signatures: shapes, partitions, the timestamp window, Ed25519 with a real key."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given
from hypothesis import strategies as st

from relay_queues import auth, ids


def test_ids_are_24_random_bytes_in_32_chars() -> None:
    made = {ids.new_id() for _ in range(1000)}
    assert len(made) == 1000
    assert all(len(i) == 32 and len(ids.id_bytes(i)) == 24 for i in made)


@pytest.mark.parametrize("partitions", [1, 3, 8, 64])
def test_queue_ids_share_a_partition(partitions: int) -> None:
    for _ in range(50):
        recipient, sender = ids.new_queue_ids(partitions)
        assert recipient != sender
        assert ids.partition_of(recipient, partitions) == ids.partition_of(sender, partitions)


@given(st.text(max_size=40))
def test_bad_ids_are_refused_not_crashing(text: str) -> None:
    try:
        raw = ids.id_bytes(text)
    except ids.InvalidId:
        return
    assert len(raw) == 24
    assert ids.b64u(raw) == text


def _key() -> tuple[Ed25519PrivateKey, str]:
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, ids.b64u(public)


def test_signatures_verify_only_for_their_text_and_key() -> None:
    private, public = _key()
    text = auth.rest_text("GET", "/v1/queues/x", 100, b"")
    assert text == (
        "GET\n/v1/queues/x\n100\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    signature = private.sign(text.encode())
    assert auth.verify(public, text, signature)
    assert not auth.verify(public, text.replace("GET", "PUT"), signature)
    assert not auth.verify(_key()[1], text, signature)
    assert not auth.verify(None, text, signature)  # unknown queue
    assert not auth.verify("not-a-key", text, signature)


def test_timestamp_window() -> None:
    now = time.time()
    assert auth.parse_timestamp(str(int(now) - 299), now) == int(now) - 299
    for bad in [str(int(now) - 301), str(int(now) + 301), "", "12a", "-5", None, True, "1" * 13]:
        with pytest.raises(auth.AuthError):
            auth.parse_timestamp(bad, now)  # type: ignore[arg-type]
    # Header bytes read as latin-1 ("1\xb2" is "1²", a digit to str.isdigit), and integers
    # no float holds (a WebSocket frame's ts): refused as AuthError, never another exception.
    for hostile in ["1\xb2", "\u0661\u0662", "1\x00", 10**400, -(10**400), 2**63]:
        with pytest.raises(auth.AuthError):
            auth.parse_timestamp(hostile, now)


@given(st.one_of(st.text(max_size=20), st.integers(), st.none(), st.booleans()))
def test_any_timestamp_is_taken_or_refused_with_auth_error(value: str | int | None) -> None:
    now = time.time()
    try:
        taken = auth.parse_timestamp(value, now)
    except auth.AuthError:
        return
    assert isinstance(taken, int)
    assert abs(taken - now) <= auth.SKEW_S


@pytest.mark.parametrize("value", [None, "", "@@@", ids.b64u(b"x" * 63)])
def test_malformed_signatures_are_refused(value: str | None) -> None:
    with pytest.raises(auth.AuthError):
        auth.parse_signature(value)


@given(st.one_of(st.text(max_size=120), st.binary(max_size=90).map(ids.b64u)))
def test_any_signature_is_taken_or_refused_with_auth_error(value: str) -> None:
    """Header text of any characters (bytes read as latin-1 included): AuthError or 64 bytes."""
    try:
        signature = auth.parse_signature(value)
    except auth.AuthError:
        return
    assert len(signature) == auth.SIG_BYTES


def test_public_keys_must_be_32_byte_ed25519() -> None:
    assert len(auth.parse_public_key(_key()[1])) == 32
    for bad in ["", ids.b64u(b"k" * 31), "***"]:
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the API's detail
            auth.parse_public_key(bad)
