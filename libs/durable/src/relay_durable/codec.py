"""base64url without padding (RFC 4648 §5), the one text form of bytes in Relay: ids, bodies
and payloads, stream and iterator strings, Kafka cluster ids.

Invariant: `unb64u` accepts `[A-Za-z0-9_-]*` of a length that is not 1 mod 4, the strings `b64u`
makes (and, as every decoder does, ones whose unused last bits are not zero), and raises
`ValueError` for anything else: padding, `+`, `/`, white space, a trailing newline. The copies it
replaced differed here: `base64.b64decode(..., altchars=b"-_")` also took `+`, `/` and padding,
which gave a stream token a second spelling.

It lives in `relay_durable`, the lowest layer, so that every layer above may use it: it imports
nothing but the standard library.
"""

from __future__ import annotations

import base64
import re

PATTERN = r"^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?$"
"""The strings `unb64u` accepts, as a regular expression (the API's schemas use it): the
alphabet, never a length of 1 mod 4."""
_FORM = re.compile(PATTERN)


def b64u(data: bytes) -> str:
    """`data` as base64url without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    """The bytes of base64url `text` without padding; `ValueError` for anything else."""
    if not _FORM.fullmatch(text):
        raise ValueError("not base64url")
    # Every string of the alphabet whose length is not 1 mod 4 decodes: no error is left.
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
