"""Recipient signatures (API.md): what is signed, the timestamp window, Ed25519 verification.

Invariants:
- the signed text is built by the server from the request it received, never taken from the
  client, so a signature only ever authorizes the request it was made for;
- verification takes the same path whether or not the queue exists (`verify` with `None` checks
  against a fixed key), so its outcome and its cost do not tell whether a recipient id exists;
- malformed keys, signatures and timestamps are refusals, never exceptions escaping this module;
- a session-bound text (`bound_text`) ends with the connection's session id, which the server
  draws (`new_session`) and never takes from a frame, so a bound signature authorizes its command
  on that one connection only: it needs no replay cache.
"""

from __future__ import annotations

import hashlib
import secrets

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from relay_queues.ids import b64u, unb64u

SKEW_S = 300
"""Accepted clock skew either way, in seconds."""
KEY_BYTES = 32
SIG_BYTES = 64
SESSION_BYTES = 32
"""Random bytes of a WebSocket session id (API.md HELLO)."""

# Unknown queues verify against this key, whose private half is dropped at once.
_NOBODY = Ed25519PrivateKey.generate().public_key()


class AuthError(ValueError):
    """Why a request is refused with AUTH; the text is for logs and the `detail` field."""


def rest_text(method: str, path: str, timestamp: int, body: bytes) -> str:
    """S = METHOD + "\\n" + PATH + "\\n" + TIMESTAMP + "\\n" + hex(SHA-256(raw body))."""
    return f"{method}\n{path}\n{timestamp}\n{hashlib.sha256(body).hexdigest()}"


def sub_text(queue: str, timestamp: int) -> str:
    return f"SUB\n{queue}\n{timestamp}"


def ack_text(queue: str, msg_id: str, timestamp: int) -> str:
    return f"ACK\n{queue}\n{msg_id}\n{timestamp}"


def new_session() -> str:
    """A WebSocket connection's session id: b64u of 32 bytes from the OS's CSPRNG."""
    return b64u(secrets.token_bytes(SESSION_BYTES))


def bound_text(text: str, session: str) -> str:
    """A SUB or ACK text bound to a session (API.md `"bound": true`): its usual text, then
    "\n" and the session id. SMP binds its signatures to the session the same way: a signature
    over it is useless on any other connection, so the server keeps no record of it."""
    return f"{text}\n{session}"


MAX_TIMESTAMP = 10**12
"""Larger timestamps are refused before any arithmetic (unix seconds, ~ year 33,000)."""


def parse_timestamp(value: str | int | None, now_s: float, skew_s: float = SKEW_S) -> int:
    """The timestamp as an int if it is within `skew_s` of now; `AuthError` otherwise."""
    if isinstance(value, bool) or value is None:
        raise AuthError("missing timestamp")
    if isinstance(value, str):
        # isascii: str.isdigit() takes other scripts' digits ("1²"), which int() then refuses.
        if not (value.isascii() and value.isdigit()) or len(value) > 12:
            raise AuthError("timestamp must be unix seconds")
        value = int(value)
    if not -MAX_TIMESTAMP <= value <= MAX_TIMESTAMP:  # a float cannot hold 10**400
        raise AuthError("timestamp outside the accepted window")
    if abs(value - now_s) > skew_s:
        raise AuthError("timestamp outside the accepted window")
    return value


def parse_signature(value: str | None) -> bytes:
    if not value:
        raise AuthError("missing signature")
    try:
        sig = unb64u(value)
    except ValueError:
        raise AuthError("signature is not base64url") from None
    if len(sig) != SIG_BYTES:
        raise AuthError("signature must be 64 bytes")
    return sig


def parse_public_key(value: str) -> bytes:
    """A b64u Ed25519 public key's 32 bytes; `ValueError` if it is not one."""
    raw = unb64u(value)
    if len(raw) != KEY_BYTES:
        raise ValueError("recipient_key must be a 32-byte Ed25519 public key")
    Ed25519PublicKey.from_public_bytes(raw)  # refuses bytes that are not a key
    return raw


def verify(key: str | None, text: str, signature: bytes) -> bool:
    """Whether `signature` signs `text` under the b64u `key`; `None` (no such queue) verifies
    against a key nobody holds, so it is refused at the same cost."""
    public = _NOBODY
    if key is not None:
        try:
            public = Ed25519PublicKey.from_public_bytes(unb64u(key))
        except ValueError:
            public = _NOBODY
    try:
        public.verify(signature, text.encode())
    except InvalidSignature:
        return False
    return key is not None
