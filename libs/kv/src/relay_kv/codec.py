"""The stored and transmitted form of a value: a versioned envelope, canonical JSON bytes.

`{"f": 1, "t": "r" | "s" | "m", ...}`: `f` is the envelope format (BRIEF §4: every on-disk
format carries a version), `t` the value's type. Bytes travel as base64url, versions as their
text form.

Invariants:
- `decode(encode(v)) == v` for every value;
- the encoding is canonical (sorted keys, sorted dots, no spaces): equal values give equal
  bytes, so a hash of the bytes (`relay_kv.tictac`) is a hash of the value;
- `decode` raises `CorruptValue` for anything it cannot read, including an unknown format.
"""

from __future__ import annotations

import json
from typing import Any

from relay_durable.codec import b64u, unb64u
from relay_kv.clock import Version
from relay_kv.crdt import AWSet, Dot, KvMap, Register, Value

FORMAT = 1


class CorruptValue(ValueError):
    """Bytes that are not an envelope this build reads."""


def _register(register: Register) -> dict[str, Any]:
    return {
        "v": str(register.version),
        "x": None if register.value is None else b64u(register.value),
        "e": register.expires_at,
    }


def _unregister(raw: dict[str, Any]) -> Register:
    value = raw["x"]
    return Register(
        Version.parse(raw["v"]),
        None if value is None else unb64u(value),
        None if raw["e"] is None else int(raw["e"]),
    )


def to_json(value: Value) -> dict[str, Any]:
    if isinstance(value, Register):
        return {"f": FORMAT, "t": "r", **_register(value)}
    if isinstance(value, AWSet):
        return {
            "f": FORMAT,
            "t": "s",
            "c": dict(sorted(value.clock.items())),
            "m": {
                b64u(member): sorted(
                    [site, counter, expiry] for (site, counter), expiry in dots.items()
                )
                for member, dots in sorted(value.entries.items())
            },
            "u": str(value.updated),
        }
    return {
        "f": FORMAT,
        "t": "m",
        "d": {name: _register(register) for name, register in sorted(value.fields.items())},
    }


def from_json(raw: Any) -> Value:
    try:
        if not isinstance(raw, dict) or raw.get("f") != FORMAT:
            raise CorruptValue(
                f"unknown value format {raw.get('f') if isinstance(raw, dict) else raw!r}"
            )
        kind = raw["t"]
        if kind == "r":
            return _unregister(raw)
        if kind == "s":
            entries: dict[bytes, dict[Dot, int | None]] = {}
            for member, dots in raw["m"].items():
                entries[unb64u(member)] = {
                    (str(site), int(counter)): None if expiry is None else int(expiry)
                    for site, counter, expiry in dots
                }
            clock = {str(site): int(counter) for site, counter in raw["c"].items()}
            return AWSet(clock, entries, Version.parse(raw["u"]))
        if kind == "m":
            return KvMap({str(name): _unregister(r) for name, r in raw["d"].items()})
        raise CorruptValue(f"unknown value type {kind!r}")
    except CorruptValue:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptValue(f"unreadable value: {error}") from None


def encode(value: Value) -> bytes:
    return json.dumps(to_json(value), sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes) -> Value:
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptValue(f"not JSON: {error}") from None
    return from_json(raw)
