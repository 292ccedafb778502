"""One service process's connection to Kafka: producer, admin, consumers and the topic keeper.

Invariants:
- `start()` either returns with every Relay topic present at its partition count, the producer
  up and every consumer started, or raises `StartupError` (exit 69 when Kafka does not answer
  within the start-up budget, exit 78 when a topic has a wrong partition count or the cluster
  has fewer brokers than the replication factor);
- every topic and consumer group name is the logical name (`relay_bus.topics`) behind
  `KafkaSettings.topic_prefix`; callers only ever see logical names;
- the keeper checks every `topic_check_interval_s` that the broker's log is the one this
  process has been reading, and every `TOPICS_EVERY` rounds (and in a round that finds the
  epoch missing or new, or follows a failed one) that the topics exist. A log wiped under
  running services (a volume lost, a cluster rebuilt) is detected through the epoch record at
  offset 0 of `relay.epoch`: the keeper recreates missing topics and tells every consumer to
  read again from offset 0, because old positions point past the end of the new log. Handlers
  are idempotent, so reading again is safe;
- readiness condition `kafka` is true only while the last check succeeded (a check that fails
  in any way counts as not answered: the keeper never stops); each consumer's
  condition follows its `assigned` as it changes (a restarted group member is ready the moment
  its partitions come back, not a check interval later).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import structlog
from prometheus_client import Counter

from relay_bus import clients, schemas, static_members, topics
from relay_bus.config import KafkaSettings
from relay_bus.consumers import Consumer, Handler, Revoked, StartOffsets, UnreadableHandler
from relay_runtime import exits
from relay_runtime.readiness import Readiness

log = structlog.get_logger(__name__)

_PRODUCED = Counter("relay_bus_records_produced_total", "Records sent", ["topic"])
_EPOCH_CHANGES = Counter("relay_bus_epoch_changes_total", "Broker log losses detected")
_TOPICS_CREATED = Counter(
    "relay_bus_topics_created_total", "Topics this process created", ["topic"]
)

_TOPIC_EXISTS = 36


SEND_BUDGET_S = 5.0
SEND_RETRY_S = 0.2
DESCRIBE_TRIES = 25
DESCRIBE_RETRY_S = 0.2
TOPICS_EVERY = 10
"""Keeper rounds per topic check. The other rounds read only the epoch (one fetch, no metadata:
a topic check is two metadata requests, three quarters of an idle service's keeper CPU); a lost
log shows there as a missing or new epoch, which checks the topics in the same round."""
STOP_BUDGET_S = 5.0
"""Longest `stop()` waits for a Kafka client to flush and close."""


class TopicMismatchError(Exception):
    pass


class BusUnavailableError(Exception):
    """Kafka did not take a record within the send budget; nothing can be assumed sent."""


class Bus:
    def __init__(self, settings: KafkaSettings, *, client_id: str, readiness: Readiness) -> None:
        self.settings = settings
        self.client_id = client_id
        self.readiness = readiness
        self.specs = {spec.name: spec for spec in topics.topic_specs(settings)}
        self.epoch: str | None = None
        self.consumers: list[Consumer] = []
        self._admin: clients.AIOKafkaAdminClient | None = None
        self._producer: clients.AIOKafkaProducer | None = None
        self._epoch_reader: clients.AIOKafkaConsumer | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._posted: set[asyncio.Task[tuple[int, int]]] = set()
        readiness.register("kafka")

    def consumer(
        self,
        topic: str,
        handler: Handler,
        *,
        group_id: str | None,
        partitions: Sequence[int] | None = None,
        start_offsets: StartOffsets | None = None,
        on_revoked: Revoked | None = None,
        member: str | None = None,
        on_unreadable: UnreadableHandler | None = None,
        fetch_min_bytes: int = 1,
    ) -> Consumer:
        """Register a consumer, started with the bus; see `Consumer` for the two modes and
        `Consumer.member` for static group membership."""
        consumer = Consumer(
            self.settings,
            topic=topic,
            physical_topic=self.physical(topic),
            handler=handler,
            client_id=self.client_id,
            group_id=None if group_id is None else self.settings.topic_prefix + group_id,
            partitions=partitions,
            start_offsets=start_offsets,
            on_revoked=on_revoked,
            member=member,
            on_unreadable=on_unreadable,
            fetch_min_bytes=fetch_min_bytes,
        )
        self.readiness.register(consumer.name)
        consumer.on_assigned = functools.partial(self.readiness.set, consumer.name)
        self.consumers.append(consumer)
        return consumer

    def physical(self, topic: str) -> str:
        """The name of logical topic `topic` on the cluster."""
        return self.settings.topic_prefix + topic

    async def start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        self._admin = await self._connect_admin(deadline)
        await self._wait_for_brokers(deadline)
        try:
            await self.ensure_topics()
        except TopicMismatchError as error:
            raise exits.StartupError(str(error), exits.EXIT_CONFIG) from None
        self._producer = clients.producer(self.settings, self.client_id)
        await self._producer.start()
        self._epoch_reader = clients.consumer(self.settings, self.client_id, None)
        await self._epoch_reader.start()
        epoch_partition = clients.TopicPartition(self.physical(topics.EPOCH), 0)
        self._epoch_reader.assign([epoch_partition])
        self._epoch_reader.pause(epoch_partition)
        self.epoch = await self._read_epoch()
        for consumer in self.consumers:
            await consumer.start()
        self.readiness.set("kafka", True)
        self._keeper = asyncio.create_task(self._keep(), name="kafka-keeper")
        log.info("kafka_connected", servers=self.settings.servers, epoch=self.epoch)

    async def _connect_admin(self, deadline: float) -> clients.AIOKafkaAdminClient:
        last_error = "no answer"
        while True:
            admin = clients.admin_client(self.settings, self.client_id)
            try:
                await asyncio.wait_for(admin.start(), max(0.1, deadline - time.monotonic()))
                await asyncio.wait_for(admin.list_topics(), max(0.1, deadline - time.monotonic()))
                return admin
            except (clients.KafkaError, TimeoutError, OSError) as error:
                last_error = str(error) or type(error).__name__
                await admin.close()
            if time.monotonic() + 0.5 >= deadline:
                raise exits.StartupError(
                    f"cannot reach Kafka at {self.settings.bootstrap_servers}: {last_error}",
                    exits.EXIT_UNAVAILABLE,
                )
            await asyncio.sleep(0.5)

    async def _wait_for_brokers(self, deadline: float) -> None:
        """Wait until the cluster has `replication_factor` brokers; fail the start if it never
        does within the budget (topics could not be created, or acks=all never answered)."""
        assert self._admin is not None
        needed = self.settings.replication_factor
        while True:
            try:
                brokers = len((await self._admin.describe_cluster())["brokers"])
            except (clients.KafkaError, OSError):
                brokers = 0
            if brokers >= needed:
                return
            if time.monotonic() + 0.5 >= deadline:
                raise exits.StartupError(
                    f"Kafka at {self.settings.bootstrap_servers} has {brokers} broker(s), "
                    f"RELAY_KAFKA__REPLICATION_FACTOR is {needed}",
                    exits.EXIT_CONFIG,
                )
            await asyncio.sleep(0.5)

    async def ensure_topics(self) -> list[str]:
        """Create missing Relay topics; check the partition counts of existing ones.
        Returns the logical names of the topics created."""
        assert self._admin is not None
        existing = set(await self._admin.list_topics())
        missing = [spec for name, spec in self.specs.items() if self.physical(name) not in existing]
        present = [self.physical(name) for name in self.specs if self.physical(name) in existing]
        if present:
            for description in await self._describe(present):
                name = description["topic"].removeprefix(self.settings.topic_prefix)
                count = len(description["partitions"])
                if count != self.specs[name].partitions:
                    raise TopicMismatchError(
                        f"topic {description['topic']} has {count} partitions, Relay needs "
                        f"{self.specs[name].partitions}; fix the topic or the partition settings "
                        "(RELAY_KAFKA__PARTITIONS, RELAY_KAFKA__INBOX_PARTITIONS)"
                    )
        if missing:
            insync = {"min.insync.replicas": str(self.settings.min_insync_replicas)}
            response = await self._admin.create_topics(
                [
                    clients.NewTopic(
                        self.physical(spec.name),
                        spec.partitions,
                        self.settings.replication_factor,
                        topic_configs={**insync, **spec.config},
                    )
                    for spec in missing
                ]
            )
            for name, code, message in response.topic_errors:
                if code not in (0, _TOPIC_EXISTS):
                    raise clients.KafkaError(f"creating {name} failed: {code} {message}")
                if code == 0:
                    _TOPICS_CREATED.labels(name).inc()
            log.info("topics_created", topics=[spec.name for spec in missing])
        return [spec.name for spec in missing]

    async def _describe(self, names: list[str]) -> list[dict[str, Any]]:
        """Describe topics, waiting out the moment after another process created one, when a
        broker answers for it with an error or no partitions yet."""
        assert self._admin is not None
        for attempt in range(DESCRIBE_TRIES):
            described: list[dict[str, Any]] = await self._admin.describe_topics(names)
            if attempt == DESCRIBE_TRIES - 1 or all(
                d["error_code"] == 0 and d["partitions"] for d in described
            ):
                break
            await asyncio.sleep(DESCRIBE_RETRY_S)
        for d in described:
            if d["error_code"] != 0:
                raise clients.KafkaError(f"describing {d['topic']} failed: {d['error_code']}")
        return described

    async def _read_epoch(self, *, write: bool = True) -> str | None:
        """The epoch at offset 0 of `relay.epoch`, writing one first if the topic is empty
        (None instead when not `write`)."""
        assert self._epoch_reader is not None
        tp = clients.TopicPartition(self.physical(topics.EPOCH), 0)
        for _ in range(2):
            # Paused but for this read: an assigned partition is otherwise fetched from again
            # and again (a long poll every `fetch_max_wait_ms`) for records never read.
            self._epoch_reader.seek(tp, 0)
            self._epoch_reader.resume(tp)
            try:
                batch = await self._epoch_reader.getmany(tp, timeout_ms=1000, max_records=1)
            finally:
                self._epoch_reader.pause(tp)
            for message in batch.get(tp, []):
                record = schemas.decode(message.value)
                if isinstance(record, schemas.Epoch) and message.offset == 0:
                    return record.epoch
            if not write:
                return None
            # Several processes may race here; whichever record lands at offset 0 wins.
            await self.send(
                topics.EPOCH,
                schemas.Epoch(epoch=uuid.uuid4().hex, created_by=self.client_id),
                partition=0,
            )
        raise clients.KafkaError("epoch record did not appear")

    async def _keep(self) -> None:
        healthy = True
        rounds = 0
        while True:
            await asyncio.sleep(self.settings.topic_check_interval_s)
            rounds += 1
            healthy = await self.check(healthy, full=not healthy or rounds % TOPICS_EVERY == 0)

    async def check(self, healthy: bool = True, *, full: bool = True) -> bool:
        """One keeper round: the epoch, and the topics when `full` or when the epoch is not
        the one this process has been reading (missing or new); returns whether Kafka answered.
        Never raises (the keeper must outlive any failure: writing a missing epoch record to a
        broker that just went away raised `BusUnavailableError`, which ended the keeper for
        good)."""
        try:
            created: list[str] = []
            epoch = None if full else await self._read_epoch(write=False)
            if epoch is None or epoch != self.epoch:
                created = await self.ensure_topics()
                epoch = await self._read_epoch()
        except Exception as error:
            if healthy:
                log.warning("kafka_unavailable", error=str(error) or type(error).__name__)
            self.readiness.set("kafka", False)
            return False
        if epoch != self.epoch:
            _EPOCH_CHANGES.inc()
            log.warning("kafka_log_lost", old_epoch=self.epoch, epoch=epoch, recreated=created)
            self.epoch = epoch
            for consumer in self.consumers:
                consumer.reset_to_beginning()
        if not healthy:
            log.info("kafka_available", epoch=epoch)
        self.readiness.set("kafka", True)
        return True

    async def send(
        self,
        topic: str,
        record: schemas.Record,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> tuple[int, int]:
        """Send and wait for the broker's acknowledgement; returns (partition, offset).

        Errors are retried with fresh metadata for up to `SEND_BUDGET_S` (a broker that has
        just restarted answers with errors until the topics exist again); every Relay record
        may be delivered twice (BRIEF §4), so a retry after an unclear failure is safe. Raises
        `BusUnavailableError` when the budget runs out.
        """
        assert self._producer is not None, "bus not started"
        schemas.check_topic(record, topic)
        value = schemas.encode(record)
        deadline = time.monotonic() + SEND_BUDGET_S
        while True:
            sending = self._producer.send_and_wait(
                self.physical(topic), value, key=key, partition=partition
            )
            try:
                metadata = await asyncio.wait_for(sending, max(0.01, deadline - time.monotonic()))
            except (clients.KafkaError, TimeoutError) as error:
                if time.monotonic() + SEND_RETRY_S >= deadline:
                    raise BusUnavailableError(
                        f"sending to {topic} failed: {str(error) or type(error).__name__}"
                    ) from error
                log.debug("send_retry", topic=topic, error=str(error))
                await asyncio.sleep(SEND_RETRY_S)
                self._producer.client.force_metadata_update()
                continue
            _PRODUCED.labels(topic).inc()
            return metadata.partition, metadata.offset

    async def end_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The offset the next record of each partition will get (the high watermark: with
        acks=all, everything below it is acknowledged and will not be lost)."""
        assert self._epoch_reader is not None, "bus not started"
        tps = [clients.TopicPartition(self.physical(topic), p) for p in partitions]
        found = await self._epoch_reader.end_offsets(tps)
        return {tp.partition: offset for tp, offset in found.items()}

    @contextlib.asynccontextmanager
    async def _group_client(self, group_id: str) -> AsyncIterator[clients.AIOKafkaConsumer]:
        """A short-lived consumer of `group_id` (a logical name, as every caller's), for its
        committed offsets only."""
        group = self.settings.topic_prefix + group_id
        consumer = clients.consumer(self.settings, f"{self.client_id}-offsets", group)
        await consumer.start()
        try:
            yield consumer
        finally:
            await consumer.stop()

    async def remove_static_member(self, group_id: str, member: str) -> bool:
        """Remove the static member `member` (`Consumer.member`) from `group_id`, known dead:
        its partitions go to the live members now, not when its session expires
        (`relay_bus.static_members`). True if it was removed; False if it was no member or
        Kafka did not answer (logged: the member's session expires all the same)."""
        assert self._admin is not None, "bus not started"
        group = self.settings.topic_prefix + group_id
        try:
            return await static_members.remove(self._admin, group, member)
        except (clients.KafkaError, OSError, TimeoutError) as error:
            log.warning("static_member_not_removed", group=group, member=member, error=repr(error))
            return False

    async def committed_offsets(
        self, topic: str, group_id: str, partitions: Sequence[int]
    ) -> dict[int, int | None]:
        """`group_id`'s committed offset of each partition of `topic` (None: none committed)."""
        tps = [clients.TopicPartition(self.physical(topic), p) for p in partitions]
        async with self._group_client(group_id) as consumer:
            return {tp.partition: await consumer.committed(tp) for tp in tps}

    async def commit_offsets(self, topic: str, group_id: str, offsets: dict[int, int]) -> None:
        """Set `group_id`'s committed offsets of `topic` (a restored retainer's resume points,
        before its consumer reads them). Only for a group read by manual assignment (Relay's
        fixed-partition consumers): Kafka takes such commits from any client."""
        if not offsets:
            return
        wanted = {clients.TopicPartition(self.physical(topic), p): o for p, o in offsets.items()}
        async with self._group_client(group_id) as consumer:
            consumer.assign(list(wanted))
            await consumer.commit(wanted)

    def post(
        self,
        topic: str,
        record: schemas.Record,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> None:
        """`send` without waiting for the broker's acknowledgement. Records reach the producer
        in call order (each send runs in a task, and tasks start in creation order), so records
        posted to one partition keep their order. A record that cannot be sent within the send
        budget is logged and dropped: post only what a later resync repairs, or what has no
        waiter left to tell."""
        task = asyncio.create_task(self.send(topic, record, key=key, partition=partition))
        self._posted.add(task)
        task.add_done_callback(self._posted_done)

    def _posted_done(self, task: asyncio.Task[tuple[int, int]]) -> None:
        self._posted.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("post_failed", error=str(task.exception()))

    async def stop(self, drain: Sequence[Callable[[], Awaitable[None]]] = ()) -> None:
        """Stop the keeper, then consumers (they commit), then run the `drain` hooks (work
        started by handled records may still send), then flush the producer."""
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        for consumer in self.consumers:
            await consumer.stop()
        for hook in drain:
            await hook()
        await asyncio.gather(*self._posted, return_exceptions=True)
        for client in (self._epoch_reader, self._producer):
            if client is not None:
                try:
                    await asyncio.wait_for(client.stop(), STOP_BUDGET_S)
                except TimeoutError:
                    # Records whose send already failed its budget are still queued in the
                    # producer while no broker answers; their callers were told
                    # (BusUnavailableError) and the rest were posts (dropped by definition).
                    log.warning("kafka_client_stop_abandoned", client=type(client).__name__)
        self._epoch_reader = self._producer = None
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
