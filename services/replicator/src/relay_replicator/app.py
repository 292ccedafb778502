"""Replicator: keeps replicated key-value data (`/v1/kv`) across sites (seed 004).

Wiring only: settings (`relay_replicator.settings`), the store, the peers, the coordinator
consuming `relay.replication` in the consumer group `relay.replicator`, the replica's internal
HTTP routes, hinted handoff, anti-entropy and membership-change loops, probe routes. The rules
live in `relay_kv`; decision 0011 records the transport, storage, clock and membership choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from starlette.applications import Starlette

from relay_bus import ping, schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_bus.lifecycle import BusLifecycle
from relay_kv import hints
from relay_kv.clock import HybridClock
from relay_replicator import replica, routes
from relay_replicator.changes import Changes
from relay_replicator.coordinator import Coordinator, CoordinatorSettings, Replicas
from relay_replicator.handoff import Handoff
from relay_replicator.peers import Peers
from relay_replicator.settings import ReplicatorSettings
from relay_replicator.site import load_or_create_site
from relay_replicator.store import KvStore
from relay_replicator.sync import Sync
from relay_runtime.probes import probe_routes
from relay_runtime.readiness import Readiness

log = structlog.get_logger(__name__)
SERVICE = "replicator"
GROUP = "relay.replicator"


def _wall_clock(offset_ms: int) -> Callable[[], int]:
    def now_ms() -> int:
        return int(time.time() * 1000) + offset_ms

    return now_ms


def build(config: ReplicatorSettings) -> tuple[Starlette, BusLifecycle]:
    readiness = Readiness("store")
    bus = Bus(config.kafka, client_id=f"{SERVICE}-{config.instance}", readiness=readiness)
    forward = ping.forwarder(bus, SERVICE, config.instance, topics.INGRESS_INBOX)
    root = config.data.dir / "kv"
    site = load_or_create_site(root)
    kv = config.kv
    _now_ms = _wall_clock(kv.clock_offset_ms)
    token = config.admin_token.get_secret_value() if config.admin_token else None
    store = KvStore(
        root / "db",
        hints.HintLimits(kv.hint_max_bytes, int(kv.hint_max_age_s * 1000)),
    )
    clock = HybridClock(site, _now_ms, kv.max_skew_ms)
    peers = Peers(
        site,
        kv.peers,
        token=token,
        timeout_s=kv.replica_timeout_s,
        down_s=kv.down_s,
        members_file=root / "members.json",
        readiness=readiness,
    )
    local = replica.LocalReplica(site, store, clock, _now_ms)
    replicas = Replicas(local, peers, kv.replica_timeout_s)
    coordinator = Coordinator(
        bus,
        config.instance,
        replicas,
        clock,
        CoordinatorSettings(kv.replica_timeout_s, kv.max_value_bytes),
        _now_ms,
    )
    handoff = Handoff(replicas, _now_ms, kv.handoff_interval_s)
    sync = Sync(replicas, _now_ms, kv.sync_interval_s, gc_guard=kv.gc_guard)
    changes = Changes(peers, sync, store, kv.replica_timeout_s)
    coordinator.view_ops = changes.handle

    async def handle(received: Received) -> None:
        if isinstance(received.record, schemas.KvRequest):
            await coordinator.handle(received)
        else:
            await forward(received)

    # A static member named by its site: a replicator restarted under its name takes its
    # partitions back at once instead of waiting out the killed process's session
    # (kv_faults_bench: ready 5.4 s), and one whose site is gone (its address refuses
    # connections) is removed by the peers that see it, so its partitions go to them at once.
    consumer = bus.consumer(topics.REPLICATION, handle, group_id=GROUP, member=site)

    async def gone(other: str) -> None:
        removed = await bus.remove_static_member(GROUP, other)
        log.info("kv_coordinator_removed", site=other, removed=removed)

    peers.on_gone = gone

    async def open_store() -> None:
        store.open()
        readiness.set("store", True)
        peers.start()
        handoff.start()
        sync.start()
        changes.start()

    async def close_store() -> None:
        readiness.set("store", False)
        await changes.stop()
        await handoff.stop()
        await sync.stop()
        await replicas.close()
        await peers.stop()
        await store.close()

    app = Starlette(
        routes=[
            *probe_routes(readiness),
            *routes.internal(site, peers, store, sync, consumer.held, coordinator, changes, token),
            *replica.routes(local, token, sync),
        ],
    )
    app.state.kv = (store, coordinator, handoff, sync)
    lifecycle = BusLifecycle(
        bus,
        config.startup_timeout_s,
        before_start=(open_store,),
        drain=(coordinator.drain,),
        after_stop=(close_store,),
    )
    return app, lifecycle
