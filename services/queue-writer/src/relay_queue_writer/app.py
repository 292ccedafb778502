"""Queue-writer: applies the queue commands of the partitions it serves (those the newest
generation of the pool's assignment gives it, fenced: `relay_bus.fencing`, decision 0019) to
the queue journals and store log on its volume.

Wiring only: settings (`relay_queue_writer.settings`), the bus and its consumers, probe routes.
Domain logic lives in libs.
"""

from __future__ import annotations

from fastapi import FastAPI

from relay_bus import ping, schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_bus.fencing import Ownership
from relay_bus.lifecycle import BusLifecycle
from relay_bus.ownership_log import OwnershipLog
from relay_bus.ownership_routes import ownership_routes
from relay_queue_writer import announce
from relay_queue_writer.admin import AdminRequests
from relay_queue_writer.commands import Commands
from relay_queue_writer.handoff import Handoff
from relay_queue_writer.settings import QueueWriterSettings
from relay_queue_writer.stores import Stores
from relay_runtime import ownership
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

SERVICE = "queue-writer"
GROUP = "relay.queue-writer"


def build(config: QueueWriterSettings) -> tuple[FastAPI, BusLifecycle]:
    readiness = Readiness()
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.QUEUE_EVENTS)
    ordinal = ownership.resolve_ordinal(config.data)
    stores = Stores(
        config.data.dir,
        readiness,
        config.dump_interval_s,
        repair=config.store_repair,
        idempotency_window_s=config.idempotency_window_s,
    )
    commands = Commands(bus, stores, config.kafka.partitions, config.expire_interval_s)
    admin = AdminRequests(bus, stores, config.instance, commands)

    async def handle(received: Received) -> None:
        record = received.record
        if isinstance(record, schemas.QueueCommand | schemas.QueueResync):
            await commands.handle(received)
        elif isinstance(record, schemas.AdminRequest):
            await admin.handle(received, record)
        else:
            await forward(received)

    consumer = bus.consumer(
        topics.QUEUE_COMMANDS,
        handle,
        group_id=GROUP,
        partitions=[],
        start_offsets=announce.announcing(bus, commands.start_offsets),
    )
    owner = Ownership(
        OwnershipLog(config.kafka, SERVICE, f"{SERVICE}-{config.instance}"),
        config.data.dir,
        SERVICE,
        ordinal,
        config.kafka.partitions,
        config.data.replicas,
        consumer.reassign,
    )

    commands.served = lambda: owner.serving

    async def open_data_dir() -> None:
        ownership.claim_data_dir(config.data.dir, SERVICE, ordinal, config.kafka.partitions)
        await stores.open()
        await commands.open()

    async def take_ownership() -> None:
        await owner.start(config.startup_timeout_s)

    token = config.admin_token.get_secret_value() if config.admin_token else None
    handoff = Handoff(
        stores, owner, config.kafka.partitions, token, commands.sweep_lock, commands.watches
    )
    app = FastAPI(
        title="Relay queue-writer",
        routes=[
            *probe_routes(readiness),
            *ownership_routes(owner, token),
            *handoff.routes(),
        ],
    )
    lifecycle = BusLifecycle(
        bus,
        config.startup_timeout_s,
        before_start=(open_data_dir,),
        after_start=(take_ownership,),
        drain=(admin.close, commands.close, handoff.close),
        after_stop=(stores.close, owner.close),
    )
    return app, lifecycle
