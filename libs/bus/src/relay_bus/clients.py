"""The Kafka clients Relay uses (aiokafka), configured once. The only module importing them, with
`relay_bus.static_members` (one request aiokafka does not make).

Why aiokafka: the services are asyncio programs (FastAPI, WebSockets); aiokafka is faust's
client, and commits, resumes, rebalances and produces idempotently against Apache Kafka. The
idempotent producer removes duplicates from the producer's own retries; Relay's idempotence
across processes still comes from command ids (BRIEF §4). See docs/decisions/0001-kafka-client.md.

Invariant: no Relay client ever asks a broker to auto-create a topic. A broker that auto-creates
would give a missing topic its default partition count, while Relay partitions by key and needs
its own counts; see `relay_bus.topics`.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import aiokafka.client
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import OffsetAndMetadata

from relay_bus import topics
from relay_bus.config import KafkaSettings

# aiokafka offers no setting for this: every metadata request it sends allows auto-creation.
# The metadata request is built in one place, so a partial with the flag set is enough.
aiokafka.client.MetadataRequest = functools.partial(
    MetadataRequest, allow_auto_topic_creation=False
)

__all__ = [
    "AIOKafkaAdminClient",
    "AIOKafkaConsumer",
    "AIOKafkaProducer",
    "ConfigResource",
    "ConfigResourceType",
    "ConsumerRebalanceListener",
    "KafkaError",
    "NewTopic",
    "OffsetAndMetadata",
    "TopicPartition",
    "admin_client",
    "consumer",
    "producer",
]


def _common(settings: KafkaSettings, client_id: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bootstrap_servers": settings.servers,
        "client_id": client_id,
        "request_timeout_ms": settings.request_timeout_ms,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        context: ssl.SSLContext = create_ssl_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None,
            certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
            keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        )
        options["ssl_context"] = context
    if settings.security_protocol.startswith("SASL"):
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = (
            settings.sasl_password.get_secret_value() if settings.sasl_password else None
        )
    return options


def admin_client(settings: KafkaSettings, client_id: str) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**_common(settings, client_id))


def producer(settings: KafkaSettings, client_id: str) -> AIOKafkaProducer:
    # acks=all: a record counts as sent once every in-sync replica has it (at least
    # min.insync.replicas). Idempotence: the producer's own retries never duplicate or reorder a
    # partition's records. linger_ms=0: records that arrive while a request is in flight share
    # the next one anyway, so waiting only adds latency; they share it only if the batch has
    # room for them (`batch_bytes`).
    return AIOKafkaProducer(
        **_common(settings, client_id),
        acks="all",
        enable_idempotence=True,
        linger_ms=0,
        max_batch_size=settings.batch_bytes,
        max_request_size=topics.MAX_RECORD_BYTES,
    )


def consumer(
    settings: KafkaSettings,
    client_id: str,
    group_id: str | None,
    member: str | None = None,
    fetch_min_bytes: int = 1,
) -> AIOKafkaConsumer:
    # Offsets are committed by hand after the handler has run (at-least-once); a partition
    # without a committed offset starts at the beginning: "latest" would skip records written
    # before a group's first commit, or after a log loss.
    return AIOKafkaConsumer(
        **_common(settings, client_id),
        group_id=group_id,
        group_instance_id=member,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        max_poll_records=500,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        fetch_min_bytes=fetch_min_bytes,
    )
