"""The operator's settings, from `RELAY_OPERATOR_*` variables, built once at start-up (never at
import) by `handlers.startup`."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RELAY_OPERATOR_", frozen=True)

    dump_retry_s: float = 60.0
    """Wait after a failed dump before the next try (never longer than the dump interval)."""
    request_timeout_s: float = 10.0
    """Timeout of one call to Relay's admin API (a dump waits `dumpTimeoutSeconds` more)."""
    kube_attempts: int = 6
    """Tries of one Kubernetes API call on a retryable answer (409, 429, 5xx, no answer)."""
    kube_backoff_s: float = 0.2
    """First wait between two tries; doubled each time, at most 10 s."""
    peering_lifetime_s: int = 60
    """How long this operator's entry in the KopfPeering lives without renewal: a replica that
    died without cleaning up holds the others paused for at most this long."""
    prefetch_timeout_s: float = 120.0
    """Timeout of a move's prefetch call (the target pulls and installs the whole partition;
    the calls within the pause are bounded by the move budget instead)."""
    move_retention_s: float = 7 * 24 * 3600.0
    """How long a Released or RolledBack RelayPartitionMove is kept (the pool's history, for
    `kubectl get rmove`) before the operator deletes it; Failed ones stay until a person does."""
