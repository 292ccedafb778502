"""Carrying out a pool's scale: its StatefulSet, its RelayPartitionMoves, its
status. Called once a tick by the pool's timer in `handlers` (no kopf here); the rules are in
`pools` (plan, order, addresses) and `moves` (one move's steps).

Invariants:
- everything is read again from the API server at each tick and each step's outcome is written
  before the next call that depends on it, so an operator killed anywhere resumes from the
  resources alone (a move from its status, the pool's generation and assignment from its
  status or, when the kill fell between a commit and the pool's write, from its installed
  moves);
- at most one move of a pool runs at a time, in the order `pools.schedule` gives; a move runs
  only once every pod of the StatefulSet at its working size is Ready (scale up: the
  StatefulSet is raised first), and the StatefulSet is lowered only once every move is
  released (scale down: the highest ordinal is emptied first);
- a Failed move stops the pool's scale (ScaleBlocked) until a person deletes it (then the
  pool plans again from its status); `MAX_ROLLBACKS` rolled-back moves for one target size
  stop it too;
- Released and RolledBack moves are deleted `move_retention_s` after they finished, once the
  pool's status counts them (its generation past theirs), never before: the catch-up above
  reads them until then;
- a plan is made only while no move of the pool runs, so a move's generation, assignment and
  `replicas` never change under it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from relay_operator import conditions, kube, moves, pools, relay, times
from relay_operator.settings import OperatorSettings

GROUP, VERSION = "relay.dev", "v1alpha1"
MAX_ROLLBACKS = 3
"""Rolled-back moves of one scale (one target size) before the pool stops trying."""

log = logging.getLogger("relay_operator.scaling")


@dataclass
class Pool:
    """What one tick works on: the pool's spec and status, and its moves."""

    name: str
    uid: str
    spec: dict[str, Any]
    status: dict[str, Any]
    moves: list[dict[str, Any]]

    @property
    def generation(self) -> int:
        return int(self.status.get("generation") or 1)

    @property
    def assignment(self) -> list[int]:
        return [int(o) for o in self.status.get("assignment") or []]


def _phase(move: dict[str, Any]) -> str:
    return str((move.get("status") or {}).get("phase", moves.PLANNED))


def _status(move: dict[str, Any]) -> dict[str, Any]:
    return dict(move.get("status") or {})


class Scaler:
    """One tick of one pool (queue-writers or retainers), with the operator's clients."""

    def __init__(
        self,
        client: kube.Kube,
        instances: relay.Instances,
        namespace: str,
        cluster: dict[str, Any],
        config: OperatorSettings,
    ) -> None:
        self.kube = client
        self.instances = instances
        self.namespace = namespace
        self.cluster = cluster
        self.config = config
        self.policy = moves.Policy(
            budget_s=float(cluster.get("moveBudgetSeconds", 2)),
            timeout_s=float(cluster.get("moveTimeoutSeconds", 300)),
            keep_s=float(cluster.get("moveKeepSeconds", 60)),
        )
        self._urls: dict[int, str | None] = {}

    # --- paths ------------------------------------------------------------------------------

    def _pool_path(self, name: str, sub: str = "") -> str:
        return kube.path(GROUP, VERSION, "relaypools", self.namespace, name, sub)

    def _moves_path(self, name: str = "", sub: str = "") -> str:
        return kube.path(GROUP, VERSION, "relaypartitionmoves", self.namespace, name, sub)

    async def _read(self, name: str) -> Pool:
        body = await self.kube.get(self._pool_path(name))
        found = (await self.kube.get(self._moves_path())).get("items", [])
        mine = [m for m in found if m.get("spec", {}).get("pool") == name]
        uid = str(body["metadata"].get("uid", ""))
        return Pool(name, uid, dict(body["spec"]), dict(body.get("status") or {}), mine)

    async def _write(self, pool: Pool, changes: dict[str, Any], *new: conditions.Condition) -> None:
        """Patch the pool's status with `changes` and the conditions that changed."""
        merged = list(pool.status.get("conditions") or [])
        for condition in new:
            merged = conditions.merge(merged, condition, times.iso(time.time()))
        if merged != list(pool.status.get("conditions") or []):
            changes = {**changes, "conditions": merged}
        changes = {k: v for k, v in changes.items() if pool.status.get(k) != v}
        if changes:
            await self.kube.patch(self._pool_path(pool.name, "status"), {"status": changes})
            pool.status.update(changes)

    # --- the tick ---------------------------------------------------------------------------

    async def tick(self, name: str) -> None:
        pool = await self._read(name)
        if pool.status.get("replicas") is None:
            return  # not adopted yet (the pool's create/resume handler does it)
        await self._catch_up(pool)
        await self._clean_up(pool)
        failed = [m for m in pool.moves if _phase(m) == moves.FAILED]
        if failed:
            names = ", ".join(m["metadata"]["name"] for m in failed)
            why = _status(failed[0]).get("message", "")
            await self._write(
                pool,
                {"failedMove": failed[0]["metadata"]["name"]},
                _blocked(
                    "MoveFailed",
                    f"partition move {names} failed: {why}. Check the pods' GET "
                    "/internal/ownership, put the partition right, then delete the move "
                    "(kubectl delete rmove) to let the operator plan again",
                ),
                pools.migrating(),
            )
            return
        if pool.status.get("failedMove"):
            # A person deleted the Failed move, having put the partitions right (perhaps by
            # installing a newer generation on the pods, or publishing one for a lost
            # ordinal): adopt what the pods report if newer, and plan again from there (the
            # rest of the old plan assumed the failed move).
            changes: dict[str, Any] = {"failedMove": None, "plannedReplicas": None}
            generation, owners = await self._reported(pool)
            if generation > pool.generation:
                changes.update(generation=generation, assignment=owners)
                log.info("pool %s adopts generation %d from its pods", pool.name, generation)
            await self._write(pool, changes)
        if int(pool.status.get("rollbacks") or 0) >= MAX_ROLLBACKS:
            await self._write(
                pool,
                {},
                _blocked(
                    "MovesRolledBack",
                    f"{MAX_ROLLBACKS} moves rolled back for {pool.spec['replicas']} instances "
                    "(see the RolledBack RelayPartitionMoves' messages); change spec.replicas "
                    "to try again",
                ),
                pools.migrating(),
            )
            return
        await self._plan(pool)
        active = [m for m in pool.moves if not moves.finished(_status(m))]
        held, wanted = int(pool.status["replicas"]), int(pool.spec["replicas"])
        if not active:
            await self._finish(pool, held, wanted)
            return
        size = max(held, wanted, int(pool.status.get("statefulSetReplicas") or held))
        if not await self._pods_ready(pool, size):
            return
        await self._run(pool, sorted(active, key=lambda m: int(m["spec"]["generation"])), size)

    async def _catch_up(self, pool: Pool) -> None:
        """Bring the pool's generation and assignment up to its finished moves (a kill between
        a move's commit, or its rollback, and the pool's write leaves them behind)."""
        generation, owners = pool.generation, pool.assignment
        wanted = int(pool.spec["replicas"])
        rollbacks = int(pool.status.get("rollbacks") or 0)
        if pool.status.get("rollbacksFor") != wanted:
            rollbacks = 0  # a new size gets its own tries
        planned = pool.status.get("plannedReplicas")
        for move in sorted(pool.moves, key=lambda m: int(m["spec"]["generation"])):
            spec, status = move["spec"], _status(move)
            if moves.installed(status) and int(spec["generation"]) > generation:
                generation = int(spec["generation"])
                owners[int(spec["partition"])] = int(spec["toOrdinal"])
            elif (
                status.get("phase") == moves.ROLLED_BACK
                and moves.finished(status)
                and int(spec["generation"]) + 1 > generation
            ):
                generation = int(spec["generation"]) + 1
                rollbacks += 1
                planned = None  # the rest of the plan assumed this move: plan again
        await self._write(
            pool,
            {
                "generation": generation,
                "assignment": owners,
                "rollbacks": rollbacks,
                "rollbacksFor": wanted,
                "plannedReplicas": planned,
            },
        )

    async def _clean_up(self, pool: Pool) -> None:
        """Delete the moves finished longer ago than `move_retention_s` that the pool's status
        already counts (`pools.expired`), so a pool's moves do not grow with every scale."""
        old = pools.expired(pool.moves, pool.generation, time.time(), self.config.move_retention_s)
        for name in old:
            await self.kube.delete(self._moves_path(name))
        if old:
            log.info("pool %s: %d finished move(s) deleted: %s", pool.name, len(old), old)
            pool.moves = [m for m in pool.moves if m["metadata"]["name"] not in old]

    async def _reported(self, pool: Pool) -> tuple[int, list[int]]:
        """The newest generation and assignment the pool's pods report (`adopt`; ValueError
        when they disagree: the tick fails and is tried again)."""
        size = max(int(pool.status["replicas"]), int(pool.status.get("statefulSetReplicas") or 0))
        return await adopt(
            self.kube,
            self.instances,
            self.namespace,
            str(pool.spec["statefulSet"]),
            size,
            len(pool.assignment),
            int(pool.spec.get("port", 8080)),
            self.config.request_timeout_s,
        )

    async def _plan(self, pool: Pool) -> None:
        """Plan the moves to `spec.replicas` when no move runs and the plan in place is for
        another size (or every move finished)."""
        wanted = int(pool.spec["replicas"])
        active = [m for m in pool.moves if not moves.finished(_status(m))]
        running = [m for m in active if _phase(m) != moves.PLANNED]
        if running or (pool.status.get("plannedReplicas") == wanted and active):
            return
        base = max([pool.generation] + [int(m["spec"]["generation"]) + 1 for m in pool.moves])
        shrinking = wanted < int(pool.status["replicas"])
        planned = {
            pools.move_name(pool.name, generation, move): (generation, move)
            for generation, move in pools.schedule(
                base, pools.plan(pool.assignment, wanted), shrinking
            )
        }
        specs = {
            name: pools.move_spec(pool.name, generation, move)
            for name, (generation, move) in planned.items()
        }
        for stale in pools.superseded(pool.moves, pool.name, specs):
            await self.kube.delete(self._moves_path(stale))
        owner = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RelayPool",
            "name": pool.name,
            "uid": pool.uid,
            "controller": True,
        }
        for name, spec in specs.items():
            created = await self.kube.create(
                self._moves_path(),
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "RelayPartitionMove",
                    "metadata": {
                        "name": name,
                        "namespace": self.namespace,
                        **({"ownerReferences": [owner]} if owner["uid"] else {}),
                    },
                    "spec": spec,
                },
            )
            if created is not None:
                await self.kube.patch(
                    self._moves_path(name, "status"),
                    {"status": {"phase": moves.PLANNED, "message": "planned"}},
                )
        await self._write(pool, {"plannedReplicas": wanted})
        fresh = await self._read(pool.name)
        pool.moves = fresh.moves

    async def _finish(self, pool: Pool, held: int, wanted: int) -> None:
        """Every move finished: the StatefulSet and the owners in force are the asked size."""
        if pools.plan(pool.assignment, wanted):
            return  # not there yet: a plan follows at the next tick
        await self._scale_statefulset(pool, wanted)
        await self._write(
            pool,
            {"replicas": wanted, "statefulSetReplicas": wanted},
            conditions.Condition(
                pools.SCALE_BLOCKED, "False", "AtSize", f"{wanted} instance(s) own the partitions"
            ),
            pools.migrating(),
        )
        if held != wanted:
            log.info("pool %s: %d -> %d instances done", pool.name, held, wanted)

    async def _scale_statefulset(self, pool: Pool, replicas: int) -> None:
        """The StatefulSet at `replicas` (checked at every tick: the StatefulSet handler, one
        watch event behind, may have put back the count recorded before)."""
        path = kube.path("apps", "v1", "statefulsets", self.namespace, pool.spec["statefulSet"])
        # Recorded first: the StatefulSet handler puts a differing count back to this one.
        await self._write(pool, {"statefulSetReplicas": replicas})
        statefulset = await self.kube.get(path)
        if statefulset.get("spec", {}).get("replicas") != replicas:
            await self.kube.patch(path, {"spec": {"replicas": replicas}})

    async def _pods_ready(self, pool: Pool, size: int) -> bool:
        """The StatefulSet at `size` (raised first on a scale up); True once its pods
        0..size-1 are Ready."""
        await self._scale_statefulset(pool, size)
        waiting = [k for k in range(size) if await self._url(pool, k, fresh=True) is None]
        if waiting:
            await self._write(
                pool,
                {},
                conditions.Condition(
                    pools.SCALE_BLOCKED, "False", "Scaling", "moves wait for the pods"
                ),
                pools.migrating(
                    f"waiting for pod(s) {', '.join(map(str, waiting))} of "
                    f"{pool.spec['statefulSet']} to be Ready",
                    "WaitingForPods",
                ),
            )
            return False
        return True

    async def _url(self, pool: Pool, ordinal: int, *, fresh: bool = False) -> str | None:
        if fresh or self._urls.get(ordinal) is None:
            name = f"{pool.spec['statefulSet']}-{ordinal}"
            try:
                pod = await self.kube.get(kube.path("", "v1", "pods", self.namespace, name))
            except kube.KubeError as error:
                if error.status != 404:
                    raise
                pod = {}
            self._urls[ordinal] = pools.address(pod, int(pool.spec.get("port", 8080)))
        return self._urls[ordinal]

    # --- moves ------------------------------------------------------------------------------

    async def _run(self, pool: Pool, active: list[dict[str, Any]], size: int) -> None:
        """Run the pool's unfinished moves in order, one at a time, as far as they go now."""
        for move in active:
            spec = move["spec"]
            one = moves.Move(
                name=move["metadata"]["name"],
                partition=int(spec["partition"]),
                source=int(spec["fromOrdinal"]),
                target=int(spec["toOrdinal"]),
                generation=int(spec["generation"]),
                before=tuple(pool.assignment),
                replicas=size,
            )
            approved = self.cluster.get("approval", "Manual") == "Auto" or (
                (move["metadata"].get("annotations") or {}).get(moves.APPROVED) == "true"
            )
            if _phase(move) != moves.PLANNED or approved:
                await self._write(
                    pool,
                    {},
                    conditions.Condition(
                        pools.SCALE_BLOCKED, "False", "Scaling", "partition moves run"
                    ),
                    pools.migrating(f"{one.name}: p{one.partition} {one.source}->{one.target}"),
                )
            one = moves.resumed(one, _status(move))
            status = await self._drive(pool, one, _status(move), approved)
            if moves.installed(status):
                if one.generation > pool.generation:
                    owners = pool.assignment
                    owners[one.partition] = one.target
                    await self._write(pool, {"generation": one.generation, "assignment": owners})
                continue  # committed: the next move may start while this one keeps its copy
            if status.get("phase") == moves.PLANNED:
                await self._write(
                    pool,
                    {},
                    conditions.Condition(
                        pools.SCALE_BLOCKED, "False", "AwaitingApproval", status["message"]
                    ),
                    pools.migrating(),
                )
            break  # failed, rolled back, waiting for approval: the next tick looks again

    async def _drive(
        self, pool: Pool, move: moves.Move, status: dict[str, Any], approved: bool
    ) -> dict[str, Any]:
        """Run `move` from `status` until nothing is to be called now; its final status."""
        last: tuple[moves.Call, moves.Answer] | None = None
        tries = 0
        status.setdefault("phase", moves.PLANNED)
        while True:
            nxt = moves.decide(
                move, status, self.policy, time.time(), approved=approved, last=last, tries=tries
            )
            if nxt.status != status:
                await self.kube.patch(self._moves_path(move.name, "status"), {"status": nxt.status})
                if nxt.status.get("phase") != status.get("phase"):
                    log.info("move %s: %s", move.name, nxt.status["phase"])
                status = nxt.status
            if nxt.call is None:
                return status
            if nxt.delay_s:
                await asyncio.sleep(nxt.delay_s)
            answer = await self._call(pool, move, nxt.call, fresh=tries > 0)
            repeated = last is not None and last[0] == nxt.call
            tries = tries + 1 if repeated else 0
            last = (nxt.call, answer)

    async def _call(
        self, pool: Pool, move: moves.Move, call: moves.Call, *, fresh: bool
    ) -> moves.Answer:
        url = await self._url(pool, call.on, fresh=fresh)
        if url is None:
            return moves.Answer(None, {"detail": f"pod of ordinal {call.on} not Ready"})
        body = call.body
        if call.source_url:
            source = await self._url(pool, move.source, fresh=fresh)
            if source is None:
                return moves.Answer(None, {"detail": f"pod of ordinal {move.source} not Ready"})
            body = {"source": source}
        if call.step == "prefetch":
            timeout = self.config.prefetch_timeout_s
        elif call.step in ("pause", "catch-up", "commit"):
            timeout = self.policy.budget_s + 1.0
        else:
            timeout = self.config.request_timeout_s
        code, answer = await self.instances.call(url, call.method, call.path, body, timeout)
        return moves.Answer(code, answer)


def _blocked(reason: str, message: str) -> conditions.Condition:
    return conditions.Condition(pools.SCALE_BLOCKED, "True", reason, message)


async def adopt(
    client: kube.Kube,
    instances: relay.Instances,
    namespace: str,
    statefulset: str,
    replicas: int,
    partitions: int,
    port: int,
    timeout_s: float,
) -> tuple[int, list[int]]:
    """The (generation, assignment) a pool adopts: the newest its instances report at `GET
    /internal/ownership` (`pools.adopted`; ValueError when they conflict)."""
    reported: list[dict[str, Any]] = []
    for ordinal in range(replicas):
        try:
            pod = await client.get(
                kube.path("", "v1", "pods", namespace, f"{statefulset}-{ordinal}")
            )
        except kube.KubeError:
            continue
        url = pools.address(pod, port)
        if url is None:
            continue
        code, answer = await instances.call(url, "GET", "/internal/ownership", None, timeout_s)
        if code == 200:
            reported.append(answer)
    return pools.adopted(partitions, replicas, reported)
