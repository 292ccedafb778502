"""`db.json`: a database's settings, generations and replica set, the source of truth for its
schema.

Invariants:
- generations are listed in increasing number; exactly the last one is open (`until` is None)
  and takes writes; numbers are never reused (the current one cannot be dropped, and new ones
  are the current number + 1);
- a schema change is written here first, then applied to each shard; a shard that missed it
  (crash in between) is brought in line when the database opens (`shard.Shard.reconcile`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay_ds import errors as ds_errors
from relay_ds import tokens
from relay_ds.tokens import GenerationId
from relay_streams import files, sites
from relay_streams.errors import BadInput, CorruptRecord
from relay_streams.settings import DbSettings


def parse_name(name: object) -> str:
    """`relay_ds.tokens.parse_name`, refusing with this store's `BadInput`."""
    try:
        return tokens.parse_name(name)
    except ds_errors.Refused as e:
        raise BadInput(str(e)) from None


@dataclass
class GenerationSpec:
    number: GenerationId
    layout: str
    options: dict[str, Any]
    since: int
    """Unix ms when the generation was created (began taking writes)."""
    until: int | None
    """Unix ms when the next generation replaced it; None for the current generation."""

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "layout": self.layout,
            "options": self.options,
            "since": self.since,
            "until": self.until,
        }

    @classmethod
    def from_json(cls, data: object, path: Path) -> GenerationSpec:
        if not isinstance(data, dict):
            raise CorruptRecord(f"{path}: a generation is not an object")
        until = data.get("until")
        if until is not None and not isinstance(until, int):
            raise CorruptRecord(f"{path}: generation field 'until' has the wrong type")
        return cls(
            GenerationId(files.field(data, "number", int, path)),
            files.field(data, "layout", str, path),
            files.field(data, "options", dict, path),
            files.field(data, "since", int, path),
            until,
        )


@dataclass
class DbRecord:
    name: str
    created_at: int
    settings: DbSettings
    generations: list[GenerationSpec]
    replicas: sites.ReplicaSet

    @property
    def current(self) -> GenerationSpec:
        return self.generations[-1]

    def generation(self, number: int) -> GenerationSpec | None:
        for spec in self.generations:
            if spec.number == number:
                return spec
        return None

    def save(self, path: Path) -> None:
        files.write_json(
            path,
            {
                "name": self.name,
                "created_at": self.created_at,
                "settings": self.settings.to_json(),
                "generations": [g.to_json() for g in self.generations],
                "replicas": self.replicas.to_json(),
            },
        )

    @classmethod
    def load(cls, path: Path) -> DbRecord:
        data = files.read_json(path)
        try:
            settings = DbSettings.from_json(files.field(data, "settings", dict, path))
        except (BadInput, TypeError) as e:
            raise CorruptRecord(f"{path}: settings: {e}") from None
        generations = [
            GenerationSpec.from_json(g, path) for g in files.field(data, "generations", list, path)
        ]
        record = cls(
            files.field(data, "name", str, path),
            files.field(data, "created_at", int, path),
            settings,
            generations,
            sites.ReplicaSet.from_json(data.get("replicas"), path),
        )
        numbers = [g.number for g in generations]
        if not numbers or numbers != sorted(set(numbers)):
            raise CorruptRecord(f"{path}: generations must be listed in increasing number")
        if any(g.until is None for g in generations[:-1]) or generations[-1].until is not None:
            raise CorruptRecord(f"{path}: exactly the last generation must be open")
        return record
