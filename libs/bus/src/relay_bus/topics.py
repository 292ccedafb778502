"""Every Kafka topic Relay uses, with its partitioning rule, in one place.

Invariant: topics are created explicitly by the services at start (and again if a broker loses
them), with the partition counts below; nothing relies on broker auto-creation, which gives the
wrong count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay_bus.config import KafkaSettings

QUEUE_COMMANDS = "relay.queue.commands"
"""Commands for queues, keyed by queue id; each partition is applied by one queue-writer."""
QUEUE_EVENTS = "relay.queue.events"
"""What the queue-writers did, keyed by queue id; consumed by delivery."""
PUBLICATIONS = "relay.publications"
"""Topic publications, keyed by topic; consumed by the retainer shards and delivery."""
REPLICATION = "relay.replication"
"""Key-value requests for the replicators (any one coordinates), partition = the key's shard
mod partitions (`relay_kv.placement`)."""
INGRESS_INBOX = "relay.ingress.inbox"
"""Replies and deliveries to ingress instances; partition = the instance's leased slot."""
EPOCH = "relay.epoch"
"""One partition; the record at offset 0 names the broker's log epoch (see `relay_bus.bus`)."""
OWNERSHIP = "relay.ownership"
"""One partition, compacted, keyed `<service>/<ordinal>`: the assignment each stateful instance
last accepted (`relay_bus.ownership_log`, decision 0019)."""


MAX_RECORD_BYTES = 2 * 1024 * 1024
"""Largest record Relay sends (the producer's `max_request_size`, and `max.message.bytes` of
the topics that carry publications and their answers): a 1 MiB retained payload travels
base64-encoded in one record, ~1.4 MB with its topic."""


OWNERSHIP_CONFIG = {"cleanup.policy": "compact"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(settings: KafkaSettings) -> list[TopicSpec]:
    """The topics every Relay service makes sure exist."""
    keyed = settings.partitions
    return [
        TopicSpec(QUEUE_COMMANDS, keyed),
        TopicSpec(QUEUE_EVENTS, keyed),
        TopicSpec(PUBLICATIONS, keyed, {"max.message.bytes": str(MAX_RECORD_BYTES)}),
        TopicSpec(REPLICATION, keyed),
        # Replies are useless once their request timed out: an hour bounds the inbox.
        TopicSpec(
            INGRESS_INBOX,
            settings.inbox_partitions,
            {"retention.ms": "3600000", "max.message.bytes": str(MAX_RECORD_BYTES)},
        ),
        TopicSpec(EPOCH, 1),
        TopicSpec(OWNERSHIP, 1, OWNERSHIP_CONFIG),
    ]
