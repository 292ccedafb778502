"""Every setting of every service is listed in docs/architecture.md's configuration section,
by its environment variable, with its default: the page a newcomer reads stays complete."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from relay_archiver.settings import ArchiverSettings
from relay_delivery.settings import DeliverySettings
from relay_ingress.settings import IngressSettings
from relay_queue_writer.settings import QueueWriterSettings
from relay_replicator.settings import ReplicatorSettings
from relay_retainer.settings import RetainerSettings
from relay_runtime.settings import ENV_PREFIX, NESTED_DELIMITER

ROOT = Path(__file__).resolve().parents[2]
SERVICES = [IngressSettings, QueueWriterSettings, DeliverySettings, RetainerSettings]
SERVICES += [ReplicatorSettings, ArchiverSettings]


def variables(model: type[BaseModel], prefix: str = ENV_PREFIX) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from variables(annotation, variable + NESTED_DELIMITER)
        else:
            yield variable, field


def configuration_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = re.search(r"^## Configuration\n(.*?)^## ", text, re.S | re.M)
    assert found, "docs/architecture.md has no Configuration section"
    return found.group(1)


@pytest.mark.parametrize("settings", SERVICES, ids=lambda s: s.__name__)
def test_every_variable_is_documented(settings: type[BaseModel]) -> None:
    section = configuration_section()
    missing = [v for v, _ in variables(settings) if f"`{v}`" not in section]
    assert not missing, f"not in docs/architecture.md#configuration: {missing}"
