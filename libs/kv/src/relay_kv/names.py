"""Namespaces, keys and fields: what is allowed, and a namespace's definition.

A namespace is created by the admin with its own (N, R, W), `gc_grace` and bearer token; the
definition is itself a replicated register, key `<namespace>` in the reserved namespace
`NAMESPACES` (quorum-written on the replicators like any key). Only the SHA-256 of the token
is stored and carried over Kafka: the token itself is shown once, to the admin who made it.

Invariants: `check_*` raise `BadName` for anything the store could not keep exactly (a NUL
separates namespace and key on disk), so a refused name changes nothing; `1 <= R, W <= N`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass

NAMESPACES = "$ns"
"""Reserved namespace holding namespace definitions (clients cannot name it: `$` is refused)."""
SYSTEM = {"$retained": 3, "$ds": 3}
"""Relay's own replicated data (admin requests only, no token): namespace -> N. `$retained`:
retained messages; `$ds`: the `/ds` replica-set targets, one record per storage
(`relay_ds.targets`)."""
NAMESPACE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_NAMESPACE = re.compile(NAMESPACE_PATTERN)
MAX_KEY_BYTES = 512
MAX_N = 7


class BadName(ValueError):
    pass


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE.match(namespace):
        raise BadName(f"namespace must match {NAMESPACE_PATTERN}")
    return namespace


def check_key(key: str, what: str = "key") -> str:
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadName(f"{what} is not valid UTF-8") from None
    if not 0 < size <= MAX_KEY_BYTES:
        raise BadName(f"{what} must be 1..{MAX_KEY_BYTES} bytes of UTF-8")
    if "\0" in key:
        raise BadName(f"{what} must not contain NUL")
    return key


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Namespace:
    n: int
    r: int
    w: int
    gc_grace_s: int
    token_sha256: str

    def __post_init__(self) -> None:
        if not 1 <= self.n <= MAX_N:
            raise BadName(f"n must be 1..{MAX_N}")
        if not (1 <= self.r <= self.n and 1 <= self.w <= self.n):
            raise BadName("r and w must be 1..n")
        if self.gc_grace_s < 0:
            raise BadName("gc_grace_s must be >= 0")

    def quorum(self, r: int | None, w: int | None) -> tuple[int, int]:
        """R and W for one request (`?r=`, `?w=` within 1..n)."""
        r, w = r or self.r, w or self.w
        if not (1 <= r <= self.n and 1 <= w <= self.n):
            raise BadName(f"r and w must be 1..{self.n} in this namespace")
        return r, w

    def accepts(self, presented_sha256: str) -> bool:
        return hmac.compare_digest(self.token_sha256, presented_sha256)

    def encode(self) -> bytes:
        return json.dumps({"f": 1, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Namespace:
        raw = json.loads(data)
        raw.pop("f", None)
        return cls(**raw)


def system_namespace(namespace: str, sites: int) -> Namespace | None:
    """The definition of one of Relay's own namespaces (`SYSTEM`), R and W a majority of the
    home replicas that exist; None for any other namespace."""
    n = SYSTEM.get(namespace)
    if n is None:
        return None
    majority = min(n, max(sites, 1)) // 2 + 1
    return Namespace(n=n, r=majority, w=majority, gc_grace_s=864_000, token_sha256="")
