"""kopf wiring: which Kubernetes events call which rule. Run as
`kopf run -m relay_operator.handlers --namespace NS --peering relay`.

The only module that imports kopf. Each handler reads the object, asks a pure rule (`dumps`,
`pools`, `dsreplicas`) what to do, does it through a client (`relay`, `kube`), and writes the
outcome into the object's status through kopf's `patch`. No rule lives here.

Handlers and what they keep true:
- RelayCluster timer (`dumps`): a dump runs only when `dumps.is_due` says so from the status (and
  from the last attempt this process made, which covers the moment between its status patch
  and the watch event that brings it back); ScaleBlocked, Migrating and Ready summarize the
  namespace's pools.
- RelayPool create/resume/replicas change (`pool`): adopts the StatefulSet's count as the
  owners in force, with the newest assignment its pods report (`scaling.adopt`).
- RelayPool timer (`pool_scale`, queue-writer and retainer pools alike: both serve the hand-off
  routes of `relay_bus.handoff_routes`): `scaling.Scaler.tick` carries out a change of
  `spec.replicas` (StatefulSet, moves one at a time, status), from the resources alone, so a
  restarted operator resumes where the last one stopped.
- StatefulSet events (`statefulset`): a pool's StatefulSet is put back to the count the
  operator set (`status.statefulSetReplicas`) when edited directly; its ready count is copied
  to the pool.
- RelayDsStorage create/resume/spec change and timer (`ds_storage`): the target is PUT to
  `/ds/storages/{ds}/replicas`; a 400 becomes Reconciled=False with Relay's message.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import kopf

from relay_operator import (
    backoff,
    conditions,
    dsreplicas,
    dumps,
    kube,
    pools,
    relay,
    scaling,
    times,
)
from relay_operator.settings import OperatorSettings

GROUP, VERSION = "relay.dev", "v1alpha1"
TICK_S = 1.0
SCALE_TICK_S = 1.0
"""How often a pool's timer looks at its scale (a tick with nothing to do reads
the pool, its moves and, mid-scale, its pods; it writes nothing)."""
"""How often a RelayCluster's timer looks at its status for a due dump (cheap: no call unless
due). kopf fixes timer intervals when handlers are registered, so this is not a setting."""
DS_REFRESH_S = 30.0
"""How often a RelayDsStorage's status is refreshed from `GET /ds/info` (and the target PUT
again if Relay's replica set drifted)."""
RELAY_LABELS = {"app.kubernetes.io/name": "relay"}
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105

ClusterIndex = kopf.Index[str | None, dict[str, Any]]
"""namespace → the RelayCluster's spec (`clusters`)."""
PoolIndex = kopf.Index[tuple[str | None, str], dict[str, Any]]
"""(namespace, StatefulSet) → the pool's state (`pool_states`)."""


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.level = 30  # warnings and errors become Kubernetes events
    settings.peering.lifetime = config.peering_lifetime_s
    in_pod = kopf.login_with_service_account(settings=settings)
    info = in_pod or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials (service account or kubeconfig)")
    credentials = kube.Credentials(
        server=info.server,
        token=info.token,
        ca_path=str(info.ca_path) if info.ca_path else None,
        ca_data=info.ca_data.encode() if isinstance(info.ca_data, str) else info.ca_data,
        certificate_path=str(info.certificate_path) if info.certificate_path else None,
        private_key_path=str(info.private_key_path) if info.private_key_path else None,
        insecure=bool(info.insecure),
        token_path=SERVICE_ACCOUNT_TOKEN if in_pod is not None else None,
    )
    memo.config = config
    memo.kube = kube.Kube(
        credentials, backoff.Backoff(attempts=config.kube_attempts, base_s=config.kube_backoff_s)
    )
    memo.last_dumps = {}


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.kube.close()


# --- indexes: what one handler needs to know of other objects -------------------------------


@kopf.index(GROUP, VERSION, "relayclusters")
def clusters(namespace: str | None, spec: kopf.Spec, **_: Any) -> dict[str | None, dict[str, Any]]:
    return {namespace: dict(spec)}


@kopf.index(GROUP, VERSION, "relaypools")
def pool_states(
    namespace: str | None, name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Per (namespace, StatefulSet): the pool's name, owners in force, the StatefulSet count
    the operator set, ready count, and its ScaleBlocked and Migrating conditions."""
    blocked = conditions.find(status.get("conditions"), pools.SCALE_BLOCKED) or {}
    migrating = conditions.find(status.get("conditions"), pools.MIGRATING) or {}
    held = status.get("replicas")
    return {
        (namespace, spec["statefulSet"]): {
            "pool": name,
            "held": held,
            "sts": status.get("statefulSetReplicas", held),
            "ready": status.get("readyReplicas"),
            "blocked": blocked.get("status") == "True",
            "message": blocked.get("message", ""),
            "migrating": migrating.get("message", "")
            if migrating.get("status") == "True"
            else None,
        }
    }


async def _admin(
    memo: kopf.Memo, namespace: str | None, cluster: dict[str, Any]
) -> relay.RelayAdmin:
    """A client of Relay's admin API with the token of `spec.adminSecret`; `relay.Unreachable`
    when the Secret cannot be read or has no token (the caller reports it like a silent Relay)."""
    token = await _token(memo, namespace, cluster)
    return relay.RelayAdmin(cluster["adminUrl"], token, memo.config.request_timeout_s)


async def _token(memo: kopf.Memo, namespace: str | None, cluster: dict[str, Any]) -> str:
    """The admin token (`spec.adminSecret`'s key `adminSecretKey`), or `relay.Unreachable`."""
    name = cluster["adminSecret"]
    try:
        secret = await memo.kube.get(kube.path("", "v1", "secrets", _ns(namespace), name))
    except kube.KubeError as error:
        raise relay.Unreachable(f"admin Secret {name} unreadable: {error}") from error
    key = cluster.get("adminSecretKey", "token")
    token = base64.b64decode(secret.get("data", {}).get(key, "")).decode().strip()
    if not token:
        raise relay.Unreachable(f"admin Secret {name} has no key {key}")
    return token


def _ns(namespace: str | None) -> str:
    """Every Relay resource is namespaced (the CRDs say so)."""
    if namespace is None:
        raise kopf.PermanentError("Relay's resources are namespaced")
    return namespace


def _set(patch: kopf.Patch, status: kopf.Status, *new: conditions.Condition) -> None:
    """Put conditions in the patch, only when one of them changes (no status write per tick)."""
    merged = list(status.get("conditions") or [])
    for condition in new:
        merged = conditions.merge(merged, condition, times.iso(time.time()))
    if merged != list(status.get("conditions") or []):
        patch.status["conditions"] = merged


# --- RelayCluster: dumps -------------------------------------------------------------------


@kopf.timer(GROUP, VERSION, "relayclusters", interval=TICK_S, id="dumps")
async def dump_timer(
    uid: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    pool_states: PoolIndex = kwargs["pool_states"]
    states = [s for key, found in pool_states.items() if key[0] == namespace for s in found]
    blocked = [state["message"] for state in states if state["blocked"]]
    scale = conditions.Condition(
        pools.SCALE_BLOCKED,
        "True" if blocked else "False",
        "PoolBlocked" if blocked else "NoBlockedScale",
        "; ".join(blocked) or "no pool's scale is blocked",
    )
    moving = [f"{s['pool']}: {s['migrating']}" for s in states if s.get("migrating")]
    policy = dumps.Policy(
        float(spec.get("dumpIntervalSeconds", 3600)),
        float(spec.get("dumpTimeoutSeconds", 120)),
        memo.config.dump_retry_s,
    )
    record = dict(status.get("dumps") or {})
    # The status may lag our own last patch by one watch event: the later attempt wins.
    last = memo.last_dumps.get(uid)
    if last is not None and _attempted(last) > _attempted(record):
        record = last
    now = time.time()
    health = (scale, pools.readiness(states), pools.migrating("; ".join(moving) or None))
    if not dumps.is_due(record, policy, now):
        _set(patch, status, *health)
        return
    try:
        admin = await _admin(memo, namespace, dict(spec))
        async with admin:
            code, body = await admin.dump(policy.timeout_s)
        outcome = dumps.from_answer(code, body)
    except relay.Unreachable as error:
        outcome = dumps.Outcome(ok=False, error=str(error))
    new_record = dumps.record(record, outcome, now)
    memo.last_dumps[uid] = new_record
    due = dumps.due_at(new_record, policy)
    if due is not None:
        new_record["nextDueAt"] = times.iso(due)
    patch.status["dumps"] = new_record
    _set(patch, status, dumps.condition(outcome, policy), *health)
    if outcome.ok:
        logger.info(f"dump {outcome.dump} finished on {len(outcome.writers)} queue-writer(s)")
    else:
        logger.warning(f"dump failed: {outcome.error}")


def _attempted(record: dict[str, Any]) -> float:
    return times.parse(record.get("lastAttemptAt")) or 0.0


# --- RelayPool: adoption and (blocked) scaling --------------------------------------------


async def _reconcile_pool(
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    clusters: ClusterIndex,
) -> None:
    cluster = next(iter(clusters.get(namespace, [])), None)
    if cluster is None:
        raise kopf.TemporaryError(f"no RelayCluster in namespace {namespace}", delay=10)
    sts_path = kube.path("apps", "v1", "statefulsets", _ns(namespace), spec["statefulSet"])
    try:
        statefulset = await memo.kube.get(sts_path)
    except kube.KubeError as error:
        # The chart creates the pool and its StatefulSet together: either may come first.
        raise kopf.TemporaryError(f"StatefulSet {spec['statefulSet']}: {error}", delay=5) from error
    held = status.get("replicas")
    if held is None:
        # Adoption: the StatefulSet's pods own what the newest generation they report says
        # (`p mod n`, generation 1, when none answers).
        held = int(statefulset["spec"].get("replicas", 1))
        try:
            token = await _token(memo, namespace, cluster)
        except relay.Unreachable:
            token = ""
        async with relay.Instances(token) as instances:
            try:
                generation, assignment = await scaling.adopt(
                    memo.kube,
                    instances,
                    _ns(namespace),
                    spec["statefulSet"],
                    held,
                    int(cluster["partitions"]),
                    int(spec.get("port", 8080)),
                    memo.config.request_timeout_s,
                )
            except ValueError as error:
                raise kopf.TemporaryError(f"adoption: {error}", delay=15) from error
        labels = statefulset["spec"]["selector"]["matchLabels"]
        patch.status.update(
            replicas=held,
            statefulSetReplicas=held,
            generation=generation,
            assignment=assignment,
            readyReplicas=int(statefulset.get("status", {}).get("readyReplicas", 0)),
            selector=",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        )


@kopf.on.create(GROUP, VERSION, "relaypools")
@kopf.on.resume(GROUP, VERSION, "relaypools")
@kopf.on.field(GROUP, VERSION, "relaypools", field="spec.replicas")
async def pool(
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    clusters: ClusterIndex = kwargs["clusters"]
    await _reconcile_pool(namespace, spec, status, patch, memo, clusters)


@kopf.timer(GROUP, VERSION, "relaypools", interval=SCALE_TICK_S)
async def pool_scale(
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """One tick of a pool's scale (`scaling.Scaler.tick`)."""
    clusters: ClusterIndex = kwargs["clusters"]
    cluster = next(iter(clusters.get(namespace, [])), None)
    if cluster is None:
        return
    try:
        token = await _token(memo, namespace, cluster)
    except relay.Unreachable as error:
        raise kopf.TemporaryError(str(error), delay=10) from error
    async with relay.Instances(token) as instances:
        scaler = scaling.Scaler(memo.kube, instances, _ns(namespace), cluster, memo.config)
        try:
            await scaler.tick(name)
        except kube.KubeError as error:  # retried with backoff already: look again soon
            raise kopf.TemporaryError(f"pool {name}: {error}", delay=2) from error


# --- StatefulSets of pools: direct edits are put back ------------------------------------


@kopf.on.event("apps", "v1", "statefulsets", labels=RELAY_LABELS)
async def statefulset(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    event: kopf.RawEvent,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    pool_states: PoolIndex = kwargs["pool_states"]
    if event.get("type") == "DELETED":
        return
    for state in pool_states.get((namespace, name), []):
        actual = body.get("spec", {}).get("replicas")
        restore = pools.restore_replicas(state["sts"], actual)
        if restore is not None:
            logger.warning(
                f"StatefulSet {name} was set to {actual} replicas directly; put back to "
                f"{restore} (scale the RelayPool {state['pool']} instead)"
            )
            await memo.kube.patch(
                kube.path("apps", "v1", "statefulsets", _ns(namespace), name),
                {"spec": {"replicas": restore}},
            )
        ready = int(body.get("status", {}).get("readyReplicas", 0))
        if state["held"] is not None and ready != state["ready"]:
            await memo.kube.patch(
                kube.path(GROUP, VERSION, "relaypools", _ns(namespace), state["pool"], "status"),
                {"status": {"readyReplicas": ready}},
            )


# --- RelayDsStorage: replica sets ---------------------------------------------------------


async def _reconcile_storage(
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    clusters: ClusterIndex,
    put: bool,
) -> None:
    cluster = next(iter(clusters.get(namespace, [])), None)
    if cluster is None:
        raise kopf.TemporaryError(f"no RelayCluster in namespace {namespace}", delay=10)
    database = spec["database"]
    try:
        admin = await _admin(memo, namespace, cluster)
    except relay.Unreachable as error:
        _set(patch, status, dsreplicas.unreachable(str(error)))
        raise kopf.TemporaryError(str(error), delay=15) from error
    async with admin:
        try:
            code, info = await admin.ds_info()
            if code != 200:
                raise relay.Unreachable(f"GET /ds/info answered {code}: {info.get('detail')}")
            try:
                wanted = dsreplicas.target(dict(spec), info)
            except dsreplicas.Unresolved as error:  # the pods may come up: looked at again
                _set(patch, status, dsreplicas.unresolved(error))
                return
            drifted = dsreplicas.replicas(info, database) != sorted(wanted)
            refused_before = (
                conditions.find(status.get("conditions"), dsreplicas.RECONCILED) or {}
            ).get("reason") == "Refused"
            if put or (drifted and not refused_before):
                code, answer = await admin.set_replicas(database, wanted)
                if code in (400, 404):
                    patch.status["target"] = wanted
                    _set(patch, status, dsreplicas.refused(code, str(answer.get("detail"))))
                    return
                if code != 202:
                    raise relay.Unreachable(f"PUT replicas answered {code}: {answer}")
                _set(patch, status, dsreplicas.accepted(wanted))
                code, info = await admin.ds_info()
            if code == 200:
                patch.status.update(dsreplicas.mirror(info, database, wanted))
        except relay.Unreachable as error:
            _set(patch, status, dsreplicas.unreachable(str(error)))
            raise kopf.TemporaryError(str(error), delay=15) from error


@kopf.on.create(GROUP, VERSION, "relaydsstorages")
@kopf.on.resume(GROUP, VERSION, "relaydsstorages")
@kopf.on.update(GROUP, VERSION, "relaydsstorages", field="spec")
async def ds_storage(
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    await _reconcile_storage(namespace, spec, status, patch, memo, kwargs["clusters"], put=True)


@kopf.timer(GROUP, VERSION, "relaydsstorages", interval=DS_REFRESH_S, initial_delay=DS_REFRESH_S)
async def ds_storage_refresh(
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    await _reconcile_storage(namespace, spec, status, patch, memo, kwargs["clusters"], put=False)
