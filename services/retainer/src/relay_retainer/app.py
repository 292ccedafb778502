"""Retainer: keeps retained messages and durable streams for the publication partitions it
serves (those the newest generation of the pool's assignment gives it, fenced:
`relay_bus.fencing`, decision 0019).

Wiring only: settings (`relay_retainer.settings`), the bus and its consumers, the stores'
lifecycles, probe, ownership and hand-off routes. Request handling lives in `relay_retainer.ds`
(durable streams) and `relay_retainer.retained` (retained messages), the hand-off in
`relay_retainer.handoff`, the stores in `relay_streams`.
"""

from __future__ import annotations

from fastapi import FastAPI

from relay_bus import ping, routing, schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_bus.fencing import Ownership
from relay_bus.lifecycle import BusLifecycle
from relay_bus.ownership_log import OwnershipLog
from relay_bus.ownership_routes import ownership_routes
from relay_retainer import resume
from relay_retainer.ds import DsRequests
from relay_retainer.ds_targets import TargetSync
from relay_retainer.exports import RetainerExports
from relay_retainer.handoff import RetainerHandoff
from relay_retainer.replication import RetainedReplication
from relay_retainer.retained import RetainedHost, RetainedRequests
from relay_retainer.settings import RetainerSettings
from relay_retainer.streams import StreamHost
from relay_runtime import assignment, ownership
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "retainer"
GROUP = "relay.retainer"


def _target_sync(
    config: RetainerSettings, host: StreamHost, token: str | None
) -> TargetSync | None:
    """Replica-set targets from their replicated records, when the replicators are known."""
    if not config.retained.replicators:
        return None
    return TargetSync(
        host,
        config.retained.replicators,
        token,
        config.instance,
        config.retained.replication_timeout_s,
    )


def _replication(config: RetainerSettings, token: str | None) -> RetainedReplication | None:
    if config.retained.replication != "quorum":
        return None
    return RetainedReplication(
        config.retained.replicators,
        token,
        config.instance,
        config.retained.replication_timeout_s,
    )


def build(config: RetainerSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.REPLICATION)
    ordinal = ownership.resolve_ordinal(config.data)
    owned: list[int] = []
    """The partitions served now (`serve` replaces its contents)."""
    host = StreamHost(config.data.dir / "streams", config.instance, config.streams, readiness)
    token = config.admin_token.get_secret_value() if config.admin_token else None
    targets = _target_sync(config, host, token)
    ds = DsRequests(bus, host, config.instance, owned, config.kafka.partitions, targets)
    replication = _replication(config, token)
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
            retained.handle(record, received.partition, received.offset)
        elif isinstance(record, schemas.Ping):
            await forward(received)
        # topic subscriptions share the topic: not for the retainer

    consumer = bus.consumer(topics.PUBLICATIONS, handle, group_id=GROUP, partitions=[])

    async def serve(partitions: list[int]) -> None:
        await consumer.reassign(partitions)
        owned[:] = partitions
        ds.owned = list(partitions)
        retained.owned = list(partitions)
        exports.owned = set(partitions)

    owner = Ownership(
        OwnershipLog(config.kafka, SERVICE, f"{SERVICE}-{config.instance}"),
        config.data.dir,
        SERVICE,
        ordinal,
        config.kafka.partitions,
        config.data.replicas,
        serve,
    )

    handoff = RetainerHandoff(bus, host, retained_host, owner, config.kafka.partitions, token)

    async def open_data_dir() -> None:
        ownership.claim_data_dir(config.data.dir, SERVICE, ordinal, config.kafka.partitions)

    async def open_stores(decided: assignment.Assignment) -> None:
        # A retained store rebuilt from the replicators takes the partitions owned here.
        owned[:] = decided.owned(ordinal)
        await host.open()
        await retained_host.open()
        await resume.commit(bus, GROUP, config.data.dir, owned)
        owned[:] = []
        if targets is not None:
            await targets.start()

    async def take_ownership() -> None:
        await owner.start(config.startup_timeout_s, open_stores)

    close_replication = () if replication is None else (replication.close,)
    close_targets = () if targets is None else (targets.close,)
    app = FastAPI(
        title="Relay retainer",
        routes=[*probe_routes(readiness), *ownership_routes(owner, token), *handoff.routes()],
    )
    lifecycle = BusLifecycle(
        bus,
        config.startup_timeout_s,
        before_start=(open_data_dir,),
        after_start=(take_ownership, exports.warm),
        drain=(
            exports.close,
            ds.drain,
            retained.drain,
            host.stop_writing,
            retained_host.stop_writing,
        ),
        after_stop=(
            handoff.close,
            *close_targets,
            host.close,
            retained_host.close,
            *close_replication,
            owner.close,
        ),
    )
    return app, lifecycle
