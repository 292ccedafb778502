from __future__ import annotations

import pytest

from relay_bus.config import KafkaSettings
from relay_runtime import exits, settings


class _Settings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("RELAY_"):
            monkeypatch.delenv(key)


def test_defaults_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    loaded = settings.load_settings(_Settings)
    assert loaded.http.port == 8080
    assert loaded.kafka.servers == ["127.0.0.1:9092"]


def test_nested_values_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv("RELAY_KAFKA__BOOTSTRAP_SERVERS", "a:1, b:2")
    monkeypatch.setenv("RELAY_HTTP__PORT", "9000")
    loaded = settings.load_settings(_Settings)
    assert loaded.kafka.servers == ["a:1", "b:2"]
    assert loaded.http.port == 9000


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("RELAY_KAFKA__BOOTSTRAP_SERVERS", "nohost", "RELAY_KAFKA__BOOTSTRAP_SERVERS"),
        ("RELAY_KAFKA__BOOTSTRAP_SERVERS", "h:99999", "is not host:port"),
        ("RELAY_HTTP__PORT", "eighty", "RELAY_HTTP__PORT"),
        ("RELAY_HTTP__PORT", "70000", "less than or equal to 65535"),
        ("RELAY_LOG_LEVEL", "loud", "RELAY_LOG_LEVEL"),
        ("RELAY_KAFKA__SECURITY_PROTOCOL", "SASL_SSL", "needs sasl_mechanism"),
        ("RELAY_KAFKA__SSL_CAFILE", "/nonexistent/ca.pem", "does not exist"),
    ],
)
def test_invalid_values_give_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv(variable, value)
    with pytest.raises(exits.StartupError) as caught:
        settings.load_settings(_Settings)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert caught.value.exit_code == exits.EXIT_CONFIG


def test_secrets_are_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv("RELAY_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("RELAY_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(exits.StartupError) as caught:
        settings.load_settings(_Settings)
    assert "needs sasl_mechanism" in str(caught.value)
    assert "hunter2" not in str(caught.value)
