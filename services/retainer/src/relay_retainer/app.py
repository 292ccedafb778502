"""Retainer: keeps retained messages and durable streams for the publication partitions it owns
(instance k of n owns partitions p with p mod n == k).

Wiring only: settings, the bus and its consumers, the stores' lifecycles, probe routes.
Request handling lives in `relay_retainer.ds` (durable streams) and `relay_retainer.retained`
(retained messages), the stores in `relay_streams`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from relay_bus import ping, routing, schemas, topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.consumers import Received
from relay_bus.lifecycle import BusLifecycle
from relay_retainer.ds import DsRequests
from relay_retainer.ds_targets import TargetSync
from relay_retainer.exports import RetainerExports
from relay_retainer.replication import RetainedReplication
from relay_retainer.retained import RetainedHost, RetainedRequests, RetainedServiceSettings
from relay_retainer.streams import StreamHost, StreamSettings
from relay_runtime import ownership, settings
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "retainer"
GROUP = "relay.retainer"


class RetainerSettings(settings.ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    data: settings.DataSettings = settings.DataSettings(dir=Path("./var/retainer"))
    streams: StreamSettings = StreamSettings()
    retained: RetainedServiceSettings = RetainedServiceSettings()


def build(config: RetainerSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.REPLICATION)
    ordinal = ownership.resolve_ordinal(config.data)
    replicas = config.data.replicas
    owned = ownership.owned_partitions(config.kafka.partitions, ordinal, replicas)
    host = StreamHost(config.data.dir / "streams", config.instance, config.streams, readiness)
    token = config.admin_token.get_secret_value() if config.admin_token else None
    targets = None
    if config.retained.replicators:  # replica-set targets from their replicated records
        targets = TargetSync(
            host,
            config.retained.replicators,
            token,
            config.instance,
            config.retained.replication_timeout_s,
        )
    ds = DsRequests(bus, host, config.instance, owned, config.kafka.partitions, targets)
    replication = None
    if config.retained.replication == "quorum":
        replication = RetainedReplication(
            config.retained.replicators,
            config.admin_token.get_secret_value() if config.admin_token else None,
            config.instance,
            config.retained.replication_timeout_s,
        )
    retained_host = RetainedHost(
        config.data.dir / "retained",
        config.retained,
        readiness,
        replication,
        owns=lambda topic: routing.partition_of_topic(topic, config.kafka.partitions) in owned,
    )
    retained = RetainedRequests(bus, retained_host, config.instance, owned, config.kafka.partitions)
    exports = RetainerExports(bus, host, retained_host, config.instance, config.data.dir, owned)

    async def handle(received: Received) -> None:
        record = received.record
        exports.seen(received)
        if isinstance(record, schemas.AdminRequest):
            exports.handle(received, record)
        elif isinstance(record, schemas.DsRequest):
            await ds.handle(received, record)
        elif isinstance(record, schemas.Publication | schemas.RetainedRequest):
            retained.handle(record, received.partition)
        elif isinstance(record, schemas.Ping):
            await forward(received)
        # topic subscriptions share the topic: not for the retainer

    bus.consumer(topics.PUBLICATIONS, handle, group_id=GROUP, partitions=owned)

    async def open_data_dir() -> None:
        ownership.claim_data_dir(config.data.dir, SERVICE, ordinal, replicas)
        await host.open()
        await retained_host.open()
        if targets is not None:
            await targets.start()

    close_replication = () if replication is None else (replication.close,)
    close_targets = () if targets is None else (targets.close,)
    app = FastAPI(title="Relay retainer", routes=probe_routes(readiness))
    lifecycle = BusLifecycle(
        bus,
        config.startup_timeout_s,
        before_start=(open_data_dir,),
        drain=(
            exports.close,
            ds.drain,
            retained.drain,
            host.stop_writing,
            retained_host.stop_writing,
        ),
        after_stop=(*close_targets, host.close, retained_host.close, *close_replication),
    )
    return app, lifecycle
