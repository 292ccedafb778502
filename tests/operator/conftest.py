"""Fixtures of the operator tests: kmock as the API server (`kube.serve`, with the chart's CRDs)
and `kopf run` of the real operator module against it, as a subprocess that can be killed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BIN, ROOT
from tests.operator import kube

NAMESPACE = "relay"
CRDS = ROOT / "charts" / "relay" / "crds"


class Operator:
    """`kopf run -m relay_operator.handlers` against the test API server; its log in a file."""

    def __init__(self, config: Path, log: Path, env: dict[str, str]) -> None:
        self.config = config
        self.log = log
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "KUBE"))}
        # A killed operator's peering entry pauses the next one until it expires: keep it short.
        env.update(KUBECONFIG=str(self.config), RELAY_OPERATOR_PEERING_LIFETIME_S="3", **self.env)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(BIN / "kopf"),
                    "run",
                    "-m",
                    "relay_operator.handlers",
                    "--namespace",
                    NAMESPACE,
                    "--peering",
                    "relay",
                    "--verbose",
                ],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: no clean-up, as when a node dies under the operator's pod."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        self.process = None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 60.0, operator: Operator | None = None
) -> Any:
    """Poll `check` until it returns something true; fail naming `what` (and the operator's log
    tail) when `timeout_s` passes. A bound on waiting, not a timed assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            tail = operator.text()[-4000:] if operator is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.2)


@pytest.fixture
def api() -> Iterator[kube.Served]:
    with kube.serve(CRDS) as served:
        served.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        served.create(
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": "relay", "namespace": NAMESPACE},
            }
        )
        yield served


@pytest.fixture
def operator(api: kube.Served, tmp_path: Path) -> Iterator[Callable[..., Operator]]:
    started: list[Operator] = []

    def start(**env: str) -> Operator:
        config = kube.kubeconfig(tmp_path / "kubeconfig", api.url, NAMESPACE)
        op = Operator(config, tmp_path / f"operator-{len(started)}.log", env)
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.kill()
