"""A Kubernetes API server for the operator's tests: kmock's emulator, adapted.

kmock (by kopf's author) serves the Kubernetes API from memory. STACK.md lists where it falls short
for kopf; this adapter closes those gaps and adds what the tests need to check the operator:

- `GET /api/v1/namespaces` lists namespaces (kmock answered 500: a path-parsing bug);
- stored objects get `metadata.uid`, `creationTimestamp`, `resourceVersion` (and `generation`,
  raised when a patch changes `spec`), so kopf's patches and create handlers work;
- a CustomResourceDefinition, when created, registers its resources (with their subresources),
  so `kopf run` discovers them as it would on a real server;
- custom objects are checked against their CRD as the API server checks them: defaults applied,
  the OpenAPI v3 schema validated (jsonschema's draft 4 validator, OpenAPI 3.0's dialect) and
  every `x-kubernetes-validations` CEL rule evaluated (the `cel` package; `oldSelf` on updates);
  a refusal is 422 `Invalid` and changes nothing;
- listings carry the newest resource version and a watch from it replays nothing older;
- a JSON patch whose `test` of `metadata.resourceVersion` fails is 422, as kopf expects;
- faults can be injected: the next matching requests fail with the given statuses *before* the
  emulator changes anything (kmock's own reactions answer after its state changed, which would
  let a "failed" PATCH land).

The invariant: an object in `objects` went through the same checks a real API server applies to
it (schema, defaults, CEL rules, status subresource), and a request answered with an error left
no trace but its entry in the request log.

Served from a background thread with its own event loop (`serve`), so that synchronous tests can
run `kopf run` and real Relay beside it; read it through `call`, never directly across threads.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cel
import jsonschema
import kmock
import yaml
from kmock._internal import k8s_dicts, parsing, rendering

T = TypeVar("T")

CRD = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
BUILTIN = {
    "v1/namespaces": ("Namespace", False),
    "v1/secrets": ("Secret", True),
    "v1/configmaps": ("ConfigMap", True),
    "v1/events": ("Event", True),
    "v1/pods": ("Pod", True),
    "apps/v1/statefulsets": ("StatefulSet", True),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False),
}


_parse_path = parsing.parse_path


def _parse_path_fixed(path: str) -> parsing.ParsedPath:
    """kmock reads `/api/v1/namespaces[/NAME]` as "namespace NAME, no resource" and fails on
    the listing (500): these paths are the namespaces resource itself."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        name = parts[3] if len(parts) == 4 else None
        return parsing.ParsedPath("", "v1", "namespaces", None, name, None)
    return _parse_path(path)


parsing.parse_path = _parse_path_fixed  # kmock's request parser looks it up on the module


@dataclass
class Fault:
    method: str
    plural: str
    statuses: list[int]
    subresource: str | None = None
    when: Callable[[Any], bool] | None = None
    """Only requests whose parsed body this accepts (None: every matching request)."""
    hits: list[int] = field(default_factory=list)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in, as the API server does before validating."""
    if isinstance(value, dict) and schema.get("type") == "object":
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [_defaults(schema["items"], item) for item in value]
    return value


def _cel_errors(schema: dict[str, Any], value: Any, old: Any, path: str) -> Iterator[str]:
    """Every failing `x-kubernetes-validations` rule at or under `schema` (transition rules,
    those naming `oldSelf`, only where an old value exists)."""
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule["rule"]
        if "oldSelf" in text and old is None:
            continue
        context = {"self": value, **({"oldSelf": old} if old is not None else {})}
        if cel.evaluate(text, context) is not True:
            yield f"{path}: Invalid value: {rule.get('message', text)}"
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                previous = old.get(name) if isinstance(old, dict) else None
                yield from _cel_errors(sub, value[name], previous, f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _cel_errors(schema["items"], item, None, f"{path}[{index}]")


def validate(schema: dict[str, Any], obj: dict[str, Any], old: Any = None) -> list[str]:
    """What the API server says of `obj` against a CRD version's `openAPIV3Schema` (defaults
    filled into `obj` first, as the server does); empty when it accepts it."""
    _defaults(schema, obj)
    problems = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in jsonschema.Draft4Validator(schema).iter_errors(obj)
    ]
    return problems + list(_cel_errors(schema, obj, old, "<root>"))


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the fixes and checks the module docstring lists."""

    schemas: dict[Any, dict[str, Any]] = attrs.field(factory=dict)
    faults: list[Fault] = attrs.field(factory=list)
    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))
    _version_now: int = 0

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, (kind, namespaced) in BUILTIN.items():
            self.resources[key] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs={"list", "watch", "get", "patch"}
            )

    def _next_version(self) -> str:
        self._version_now = next(self._versions)
        return str(self._version_now)

    async def _serve_list(self, request: rendering.Request) -> Any:
        """A listing carries the newest resource version, for the watch that follows it."""
        answer = await super()._serve_list(request)
        answer["metadata"]["resourceVersion"] = str(self._version_now)
        return answer

    async def _serve_watch(self, request: rendering.Request) -> Any:
        """A watch from a resource version does not replay what is not newer (kmock sent every
        object again as ADDED, so kopf saw old versions after its own patches)."""
        since = request.params.get("resourceVersion", "")
        async for event in super()._serve_watch(request):
            if since.isdigit() and isinstance(event, dict) and event.get("type") == "ADDED":
                version = event["object"].get("metadata", {}).get("resourceVersion", "0")
                if version.isdigit() and int(version) <= int(since):
                    continue
            yield event

    def register(self, crd: dict[str, Any]) -> None:
        """Declare the CRD's resources (what a real server does once the CRD is established)."""
        spec = crd["spec"]
        for version in spec["versions"]:
            resource = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            self.resources[resource] = kmock.ResourceInfo(
                kind=spec["names"]["kind"],
                singular=spec["names"].get("singular"),
                namespaced=spec["scope"] == "Namespaced",
                verbs={"list", "watch", "get", "patch", "create", "delete", "update"},
                subresources=set(version.get("subresources", {})),
            )
            self.schemas[resource] = version["schema"]["openAPIV3Schema"]

    def inject(
        self,
        method: str,
        plural: str,
        statuses: list[int],
        subresource: str | None = None,
        when: Callable[[Any], bool] | None = None,
    ) -> Fault:
        """The next `len(statuses)` `method` requests on `plural` (whose body `when` accepts)
        fail with these statuses."""
        fault = Fault(method.upper(), plural, list(statuses), subresource, when)
        self.faults.append(fault)
        return fault

    def _fault(self, request: rendering.Request) -> int | None:
        for fault in self.faults:
            if (
                fault.statuses
                and request.method.value.upper() == fault.method
                and request.resource is not None
                and request.resource.plural == fault.plural
                and request.subresource == fault.subresource
                and (fault.when is None or fault.when(request.data))
            ):
                status = fault.statuses.pop(0)
                fault.hits.append(status)
                return status
        return None

    def _check(self, request: rendering.Request, obj: dict[str, Any], old: Any) -> None:
        schema = self.schemas.get(request.resource)
        if schema is None:
            return
        problems = validate(schema, obj, old)
        if problems:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message="; ".join(sorted(problems))
            )

    async def _handle(self, request: rendering.Request) -> Any:
        status = self._fault(request)
        if status is not None:
            raise kmock.KubernetesError(status=status, reason="Injected", message="injected fault")
        if request.resource == CRD and request.action == kmock.action.CREATE:
            self.register(request.data)
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.namespace and "namespace" not in meta:
                meta["namespace"] = request.namespace
            meta.update(
                uid=str(uuid.uuid4()),
                creationTimestamp=_now(),
                resourceVersion=self._next_version(),
                generation=1,
            )
            self._check(request, request.data, None)
        elif request.action == kmock.action.UPDATE and request.name is not None:
            if isinstance(request.data, dict):
                await self._prepare_patch(request)
            elif isinstance(request.data, list):
                await self._prepare_json_patch(request)
        return await super()._handle(request)

    async def _prepare_json_patch(self, request: rendering.Request) -> None:
        """A JSON patch (kopf's finalizer and annotation changes): its `test` of the resource
        version fails with 422 as on a real server (kmock answered 500), then it stamps a new
        one."""
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return
            current = self.objects[key].raw
        version = current.get("metadata", {}).get("resourceVersion")
        for op in request.data:
            tests_version = op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion"
            if tests_version and op.get("value") != version:
                raise kmock.KubernetesError(
                    status=422, reason="Invalid", message="the resource version changed"
                )
        request.data.append(
            {
                "op": "add",
                "path": "/metadata/resourceVersion",
                "value": self._next_version(),
            }
        )

    async def _prepare_patch(self, request: rendering.Request) -> None:
        """Apply the subresource's rules, then check the patched object before it is stored."""
        key = (request.resource, request.namespace, request.name)
        info = self.resources.get(request.resource) if request.resource is not None else None
        subresources = info.subresources if info is not None else set()
        patch = copy.deepcopy(request.data)
        if request.subresource == "status":
            patch = {"status": patch["status"]} if "status" in patch else {}
        elif "status" in subresources:
            patch.pop("status", None)
        async with self._lock:
            current = self.objects[key].raw if key in self.objects else None
        if current is None or self.objects[key].deleted:
            return
        meta = patch.setdefault("metadata", {})
        meta["resourceVersion"] = self._next_version()
        if "spec" in patch and patch["spec"] != current.get("spec"):
            meta["generation"] = current.get("metadata", {}).get("generation", 1) + 1
        merged = k8s_dicts.Object(copy.deepcopy(current))
        merged.patch(copy.deepcopy(patch))
        self._check(request, merged.raw, current)
        request.data.clear()
        request.data.update(patch)


@dataclass
class Served:
    """An `ApiServer` served on a loopback port from its own thread."""

    api: ApiServer
    url: str
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[ApiServer], T]) -> T:
        """Run `fn(api)` on the server's loop (the thread that owns its state)."""

        async def run() -> T:
            return fn(self.api)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        def read(api: ApiServer) -> dict[str, Any] | None:
            for (resource, ns, obj_name), obj in api.objects.items():
                if resource.plural == plural and ns == namespace and obj_name == name:
                    return None if obj.deleted else copy.deepcopy(obj.raw)
            return None

        return self.call(read)

    def items(self, plural: str) -> list[dict[str, Any]]:
        return self.call(
            lambda api: [
                copy.deepcopy(obj.raw)
                for (resource, _, _), obj in api.objects.items()
                if resource.plural == plural and not obj.deleted
            ]
        )

    def requests(self, method: str, plural: str) -> list[rendering.Request]:
        return self.call(
            lambda api: [
                r
                for r in list(api)
                if r.method.value.upper() == method.upper()
                and r.resource is not None
                and r.resource.plural == plural
            ]
        )

    def sent(self, method: str, plural: str) -> list[Any]:
        """The bodies clients sent with these requests, as sent (the emulator stamps its own
        copy with metadata)."""
        return [json.loads(r.body) if r.body else None for r in self.requests(method, plural)]

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        """POST `doc` as a client would (so it goes through the same checks)."""
        return asyncio.run_coroutine_threadsafe(self._create(doc), self.loop).result(timeout=30)

    async def _create(self, doc: dict[str, Any]) -> dict[str, Any]:
        group, _, version = doc["apiVersion"].rpartition("/")
        plural = self._plural(doc)
        namespace = doc["metadata"].get("namespace")
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
        response = await self.api.post(path, json=doc)
        body: dict[str, Any] = await response.json()
        if response.status >= 300:
            raise ApiError(response.status, body.get("message", ""))
        return body

    def patch(self, doc_path: str, patch: dict[str, Any]) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            response = await self.api.patch(
                doc_path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
            )
            body: dict[str, Any] = await response.json()
            if response.status >= 300:
                raise ApiError(response.status, body.get("message", ""))
            return body

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def delete(self, doc_path: str) -> None:
        """DELETE the object at `doc_path` (gone already: nothing to do)."""

        async def run() -> None:
            response = await self.api.delete(doc_path)
            if response.status >= 300 and response.status != 404:
                body = await response.json()
                raise ApiError(response.status, body.get("message", ""))

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def _plural(self, doc: dict[str, Any]) -> str:
        """The plural of `doc`'s kind (called on the server's loop)."""
        for resource in self.api.resources:
            info = self.api.resources[resource]
            version = f"{resource.group}/{resource.version}".lstrip("/")
            if info.kind == doc["kind"] and version == doc["apiVersion"]:
                return str(resource.plural)
        raise LookupError(doc["kind"])


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@contextmanager
def serve(crd_dir: Path | None = None) -> Iterator[Served]:
    """Serve a fresh `ApiServer` (with the CRDs of `crd_dir` created through the API)."""
    ready: dict[str, Any] = {}
    started = threading.Event()
    stop: asyncio.Future[None] | None = None

    async def main() -> None:
        nonlocal stop
        async with ApiServer() as api, kmock.Server(api) as server:
            stop = asyncio.get_running_loop().create_future()
            ready.update(api=api, url=str(server.url).rstrip("/"), loop=asyncio.get_running_loop())
            started.set()
            await stop

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise TimeoutError("the API server did not start")
    served = Served(ready["api"], ready["url"], ready["loop"])
    try:
        for path in sorted(crd_dir.glob("*.yaml")) if crd_dir else []:
            served.create(yaml.safe_load(path.read_text()))
        yield served
    finally:
        assert stop is not None
        served.loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)


def kubeconfig(path: Path, url: str, namespace: str) -> Path:
    """A kubeconfig pointing at `url` (what `kopf run` and kopf's login read)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [
                    {
                        "name": "kmock",
                        "context": {"cluster": "kmock", "user": "test", "namespace": namespace},
                    }
                ],
                "current-context": "kmock",
            }
        )
    )
    return path


@dataclass
class Proxy:
    """A recording proxy in front of Relay's ingress: kmock serves it, so every admin call the
    operator makes is in its request log, while real Relay answers it."""

    handler: kmock.RawHandler
    url: str
    loop: asyncio.AbstractEventLoop

    def sent(self, method: str, path: str) -> list[Any]:
        """The JSON bodies (None when empty) of the requests `method path` received."""

        async def read() -> list[Any]:
            return [
                json.loads(r.body) if r.body else None
                for r in list(self.handler)
                if r.method.value.upper() == method.upper() and r.url.path == path
            ]

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(timeout=30)


@contextmanager
def proxy(target: str) -> Iterator[Proxy]:
    """Serve a `Proxy` forwarding every request to `target` (method, path, query, headers, body
    as received; the answer's status and body as Relay gave them)."""
    import httpx

    ready: dict[str, Any] = {}
    started = threading.Event()
    stop: asyncio.Future[None] | None = None

    async def main() -> None:
        nonlocal stop
        async with (
            httpx.AsyncClient(base_url=target, timeout=120) as client,
            kmock.RawHandler() as handler,
            kmock.Server(handler) as server,
        ):

            async def forward(request: rendering.Request) -> kmock.Response:
                headers = {
                    k: v
                    for k, v in request.headers.items()
                    if k.lower() in ("authorization", "content-type")
                }
                answer = await client.request(
                    request.method.value,
                    request.url.path,
                    params=dict(request.params),
                    content=request.body,
                    headers=headers,
                )
                return kmock.Response(
                    status=answer.status_code,
                    payload=answer.content,
                    headers={"Content-Type": answer.headers.get("content-type", "")},
                )

            handler.fallback << forward
            stop = asyncio.get_running_loop().create_future()
            ready.update(handler=handler, url=str(server.url).rstrip("/"))
            ready["loop"] = asyncio.get_running_loop()
            started.set()
            await stop

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise TimeoutError("the proxy did not start")
    served = Proxy(ready["handler"], ready["url"], ready["loop"])
    try:
        yield served
    finally:
        assert stop is not None
        served.loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)
