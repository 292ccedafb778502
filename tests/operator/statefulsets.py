"""A stand-in for Kubernetes' StatefulSet controller and kubelet, for one StatefulSet of
queue-writers or retainers on the test API server: the operator's scale acts on real
processes.

A thread watches the StatefulSet's `spec.replicas` (polling the emulator) and, as the
controller does (`OrderedReady`): starts the missing ordinals lowest first and stops the extra
ones highest first, one at a time. Ordinal k is a real service process (`script`) with its own
data folder (`pvc-k`, kept when the pod goes, as a PersistentVolumeClaim is), bound on its own
loopback address with the port every ordinal shares (a pod IP and the pool's container port):
127.0.r.(10 + k) at its r-th start, so a restarted pod comes back at a new IP, as on
Kubernetes. Its Pod is written with `status.podIP` and a Ready condition that follows the
process's `/readyz`, and deleted when the process stopped; the StatefulSet's
`status.readyReplicas` follows.

The invariant: a Pod says Ready only while its process answers `/readyz` 200, and an ordinal at
or above `spec.replicas` has no process once the stand-in caught up.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from relayctl import processes
from tests import helpers
from tests.operator import kube

POLL_S = 0.1


def ip_of(ordinal: int, start: int) -> str:
    """The pod IP of the ordinal's `start`-th start (0 first)."""
    return f"127.0.{start}.{10 + ordinal}"


@dataclass
class Instance:
    ordinal: int
    process: processes.Forked
    ip: str
    port: int
    ready: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"


class StatefulSetStandIn:
    def __init__(
        self,
        api: kube.Served,
        namespace: str,
        name: str,
        root: Path,
        env: Callable[[int], dict[str, str]],
        script: str = "relay-queue-writer",
    ) -> None:
        self.api = api
        self.script = script
        self.namespace = namespace
        self.name = name
        self.root = root
        self.env = env
        self.port = helpers.free_port()
        self.instances: dict[int, Instance] = {}
        self.started: list[int] = []
        """Every ordinal start, in order (a restart appears twice)."""
        self.stopped: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    # --- what a test reads ------------------------------------------------------------------

    def urls(self) -> dict[int, str]:
        """The URL of every running ordinal (Ready or not)."""
        with self._lock:
            return {k: i.url for k, i in self.instances.items()}

    def ready(self) -> list[int]:
        with self._lock:
            return sorted(k for k, i in self.instances.items() if i.ready)

    def log(self, ordinal: int) -> str:
        return (self.root / f"{self.name}-{ordinal}.log").read_text(errors="replace")

    # --- life -------------------------------------------------------------------------------

    def __enter__(self) -> StatefulSetStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)
        with self._lock:
            instances = list(self.instances.values())
        for instance in instances:
            self._terminate(instance)

    def kill(self, ordinal: int) -> None:
        """SIGKILL the ordinal's process (the stand-in starts it again, as a kubelet would)."""
        with self._lock:
            instance = self.instances.get(ordinal)
        if instance is not None:
            instance.process.send_signal(signal.SIGKILL)

    def freeze(self, ordinal: int, frozen: bool = True) -> None:
        """SIGSTOP (a hung pod: connections accepted by the kernel, nothing answered) or, with
        `frozen=False`, SIGCONT the ordinal's process. The Pod stays Ready meanwhile, as it
        would until its readiness probe fails."""
        with self._lock:
            instance = self.instances[ordinal]
        instance.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
                time.sleep(POLL_S)
        except BaseException as error:  # reported by the test through `error`
            self.error = error
            raise

    def _step(self) -> None:
        statefulset = self.api.get("statefulsets", self.namespace, self.name)
        if statefulset is None:
            return
        wanted = int(statefulset["spec"].get("replicas", 0))
        with self._lock:
            running = dict(self.instances)
        for ordinal, instance in list(running.items()):
            if instance.process.poll() is not None:  # died: its pod restarts the container
                self._set_pod(ordinal, None)
                with self._lock:
                    del self.instances[ordinal]
                running.pop(ordinal)
        for ordinal, instance in running.items():
            if not instance.ready and self._answers(instance):
                instance.ready = True
                self._set_pod(ordinal, instance)
        extra = sorted((k for k in running if k >= wanted), reverse=True)
        missing = sorted(k for k in range(wanted) if k not in running)
        if extra:  # highest first, one at a time
            self._terminate(running[extra[0]])
            with self._lock:
                del self.instances[extra[0]]
            self._set_pod(extra[0], None)
            self.stopped.append(extra[0])
        elif missing and all(i.ready for i in running.values()):  # OrderedReady
            self._start(missing[0])
        ready = sum(1 for i in self.instances.values() if i.ready)
        if statefulset.get("status", {}).get("readyReplicas") != ready:
            self.api.patch(
                self._path("apps/v1", "statefulsets", self.name),
                {"status": {"readyReplicas": ready, "replicas": len(self.instances)}},
            )

    def _start(self, ordinal: int) -> None:
        folder = self.root / f"pvc-{ordinal}"
        folder.mkdir(parents=True, exist_ok=True)
        ip = ip_of(ordinal, self.started.count(ordinal))
        env = helpers.service_env(
            RELAY_HTTP__HOST=ip,
            RELAY_HTTP__PORT=str(self.port),
            RELAY_INSTANCE=f"{self.name}-{ordinal}",
            RELAY_DATA__DIR=str(folder),
            RELAY_DATA__ORDINAL=str(ordinal),
            **self.env(ordinal),
        )
        process = helpers.start_service(self.script, env, self.root / f"{self.name}-{ordinal}.log")
        instance = Instance(ordinal, process, ip, self.port)
        with self._lock:
            self.instances[ordinal] = instance
        self.started.append(ordinal)
        self._set_pod(ordinal, instance)

    def _terminate(self, instance: Instance) -> None:
        """SIGTERM, as the kubelet stops a pod (SIGKILL after the grace period)."""
        if instance.process.poll() is None:
            instance.process.terminate()
            try:
                instance.process.wait(20)
            except subprocess.TimeoutExpired:
                instance.process.kill()
                instance.process.wait()

    def _answers(self, instance: Instance) -> bool:
        try:
            return httpx.get(f"{instance.url}/readyz", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    def _path(self, version: str, plural: str, name: str = "") -> str:
        base = f"/apis/{version}" if "/" in version else f"/api/{version}"
        return "/".join(p for p in (f"{base}/namespaces/{self.namespace}/{plural}", name) if p)

    def _set_pod(self, ordinal: int, instance: Instance | None) -> None:
        """Write the ordinal's Pod as the kubelet reports it (None: the pod is gone)."""
        name = f"{self.name}-{ordinal}"
        path = self._path("v1", "pods", name)
        if instance is None:
            self.api.delete(path)
            return
        status: dict[str, Any] = {
            "phase": "Running",
            "podIP": instance.ip,
            "conditions": [{"type": "Ready", "status": "True" if instance.ready else "False"}],
        }
        if self.api.get("pods", self.namespace, name) is None:
            with contextlib.suppress(kube.ApiError):
                self.api.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": name,
                            "namespace": self.namespace,
                            "labels": {"statefulset.kubernetes.io/pod-name": name},
                        },
                        "spec": {"hostname": name},
                        "status": status,
                    }
                )
                return
        self.api.patch(path, {"status": status})
