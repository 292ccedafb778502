from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helpers


@pytest.fixture
def kafka() -> Iterator[helpers.Broker]:
    with helpers.broker() as b:
        yield b


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with helpers.redis_server(tmp_path) as url:
        yield url
