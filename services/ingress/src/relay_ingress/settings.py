"""The ingress's settings (`RELAY_*`), validated once at start; nothing else lives here, so every
module can import them without importing the wiring."""

from __future__ import annotations

from pydantic import Field, RedisDsn

from relay_bus.config import KafkaSettings
from relay_runtime.settings import ServiceSettings


class IngressSettings(ServiceSettings):
    kafka: KafkaSettings = KafkaSettings()
    redis_url: RedisDsn = RedisDsn("redis://127.0.0.1:6379/0")
    """Redis for connection routing, leases and rate limits (ephemeral state only)."""
    ping_timeout_s: float = Field(10.0, gt=0, le=60)
    """How long `/admin/ping` waits for its ping to come back."""
    request_timeout_s: float = Field(10.0, gt=0, le=60)
    """How long a client request waits for its queue-writer's answer before 503."""
    kv_lane: bool = True
    """Answer a string's `PUT` and `GET /v1/kv/{ns}/{key}` in `relay_ingress.kv_lane`, ahead
    of FastAPI's routing (the same answers for half of the ingress's CPU); off, every request
    goes through the routes."""
    kv_resend_s: float = Field(1.0, gt=0, le=60)
    """How long a key-value request waits for its coordinating replicator before the ingress
    sends it again (the same id, within `request_timeout_s`): a coordinator that holds it runs
    it once and answers again; a replicator that took the partition over from a dead one runs
    it (its consumer resumes past records the dead one had read)."""
    ws_connections_per_address: int = Field(256, ge=1)
    """WebSocket connections one client address may hold at this instance."""
    ws_frames_per_s: float = Field(100.0, gt=0)
    """Frames per second a connection may send (RATE_LIMITED beyond), with a burst of
    `ws_frame_burst`."""
    ws_frame_burst: int = Field(200, ge=1)
    ws_max_frame_bytes: int = Field(65536, ge=1024, le=1 << 20)
    """Largest text frame answered; larger ones get TOO_LARGE (past 1 MiB the connection is
    closed by the WebSocket layer)."""
    ws_commands_in_flight: int = Field(64, ge=1, le=10_000)
    """Commands of one connection waiting for the queue-writer at once."""
    ws_max_outbound_frames: int = Field(10_000, ge=100, le=1_000_000)
    """Frames one connection may have waiting to be written: a reader slower than that is
    disconnected (close code 1008) instead of buffered without end."""
    lame_duck_unready_s: float = Field(0.0, ge=0, le=120)
    """On SIGTERM: how long the ingress keeps serving while unready (`/readyz` 503) before it
    closes WebSockets, so that load balancers stop sending new clients first (the chart sets
    `ingress.preStopSeconds`, 10; 0 where nothing balances, as under `relayctl up`)."""
    ws_close_per_s: float = Field(500.0, gt=0)
    """On SIGTERM, after `lame_duck_unready_s`: WebSockets closed per second (code 1012,
    service restart), so reconnecting clients do not all arrive at the other instances at once;
    faster when that would not fit `lame_duck_s`."""
    ws_max_subscriptions: int = Field(10_000, ge=1, le=1_000_000)
    """Queues one connection may be subscribed to (QUOTA beyond)."""
    ws_max_topic_filters: int = Field(1_000, ge=1, le=100_000)
    """Topic filters one connection may be subscribed to (QUOTA beyond)."""
    ws_idle_timeout_s: float = Field(300.0, ge=0, le=86_400)
    """How long a WebSocket that holds no subscription (no queue, no topic filter) may go
    without sending a frame before it is closed (1001); 0: never. A subscriber that only
    answers pings is never idle: it is waiting for what it subscribed to."""
    json_max_depth: int = Field(32, ge=2, le=500)
    """Arrays and objects nested in one another in a request body or WebSocket frame (a flat
    object is 1); deeper JSON is refused 400 before any model reads it. Relay's own deepest
    is 3."""
    json_max_number_chars: int = Field(32, ge=20, le=4000)
    """Characters of one number literal in a request body or WebSocket frame (sign, digits,
    point, exponent); longer ones are refused 400 before they are converted. A Unix ms
    timestamp has 13."""
    max_body_bytes: int = Field(16384, gt=0, le=1 << 20)
    """Largest message body accepted, decoded (TOO_LARGE beyond)."""
    ds_max_batch_messages: int = Field(1000, ge=1, le=100_000)
    """Messages one `POST /v1/ds/{db}/messages` may carry (TOO_LARGE beyond)."""
    ds_max_batch_bytes: int = Field(524_288, ge=1024, le=700_000)  # bytes
    """Topic and decoded payload bytes one durable-stream batch may carry (TOO_LARGE beyond):
    each part travels as one Kafka record, base64 included, under the 1 MiB record limit."""
    max_publish_bytes: int = Field(1 << 20, ge=1, le=1 << 20)
    """Largest publish payload accepted, decoded (TOO_LARGE beyond; MQTT brokers' usual 1 MiB)."""
    publish_per_s: int = Field(1000, ge=1)
    """Publishes one client address may make per second, over every ingress instance
    (RATE_LIMITED beyond)."""
    admin_timeout_s: float = Field(30.0, gt=0, le=600)
    """How long admin requests to every queue-writer (`/admin/dump`) wait for all answers."""
