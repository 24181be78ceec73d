"""A fake of the Azure services the Slurm node provider and the node-side functions talk to, on 127.0.0.1 over real
HTTP, written from Azure's REST documentation (none has an emulator):

- Azure Resource Manager: Virtual Machines - Create Or Update / Get / Delete (api-version 2024-07-01) and
  Network Interfaces - Create Or Update / Get / Delete (2024-05-01), each PUT and DELETE a long-running
  operation as "Track asynchronous Azure operations" describes: 201/202 with an ``Azure-AsyncOperation`` URL
  (and ``Retry-After``) whose GET answers {"status": "InProgress"} until "Succeeded" or "Failed" with
  {"error": {"code", "message"}}. A DELETE of a resource that is not there answers 204. Deleting a VM deletes
  its NIC and OS disk when their ``deleteOption`` is Delete; a NIC still attached to a VM refuses to be deleted
  (400 NicInUse). Every request needs ``Authorization: Bearer`` with a token for https://management.azure.com
  (401 InvalidAuthenticationToken otherwise).
- Injectable faults: a capacity error (SkuNotAvailable, AllocationFailed, ...) for a VM name or a VM size,
  answered at the PUT (409) or by the operation (Failed); throttling (429 with ``Retry-After``) and server
  errors (503) for the next n requests.
- The instance metadata service: ``GET /metadata/instance?api-version=...`` (the instance document,
  ``compute.tagsList``) and the managed identity's token endpoint ``GET /metadata/identity/oauth2/token
  ?api-version=2018-02-01&resource=R&client_id=C`` answering the documented fields (access_token, expires_in,
  expires_on, resource, token_type), both only with ``Metadata: true``. azure-identity reaches it through
  AZURE_POD_IDENTITY_AUTHORITY_HOST.
- Key Vault secrets (api-version 7.4): ``GET /secrets/{name}[/{version}]``, ``PUT /secrets/{name}`` (a new
  version: a 32-hex id, ``attributes.created`` in epoch seconds), ``GET /secrets/{name}/versions`` (ids,
  attributes and tags, no values; ``nextLink`` pages). Tokens for https://vault.azure.net only.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from urllib.parse import parse_qs, urlparse

from infra.demo.loopback_http import LoopbackServer, QuietHandler

COMPUTE_API, NETWORK_API, VAULT_API, IDENTITY_API = "2024-07-01", "2024-05-01", "7.4", "2018-02-01"
MANAGEMENT, VAULT = "https://management.azure.com", "https://vault.azure.net"


class FakeAzure(LoopbackServer):
    def __init__(self, client_id: str = "cid-controller", op_polls: int = 1):
        self.client_id = client_id
        self.op_polls = op_polls              # InProgress answers before an operation ends
        self.op_retry_after = "0"             # Retry-After of operation polls (seconds)
        self.hold_operations = False          # True: VM operations stay InProgress, however often polled
        self.vms: dict[str, dict] = {}        # name -> the VM as GET answers it
        self.nics: dict[str, dict] = {}
        self.disks: dict[str, dict] = {}      # OS disks: name -> {"vm", "deleteOption"}
        self.ops: dict[str, dict] = {}        # operation id -> {"polls", "error", "done"}
        self.deleting: dict[str, str] = {}    # VM name -> its delete operation
        self.requests: list[tuple[str, str]] = []   # (method, path) in order
        self.bodies: dict[str, dict] = {}     # VM name -> the body of its PUT
        self.capacity: dict[str, tuple[str, str, str]] = {}  # VM name or size -> (code, message, "put"|"async")
        self.throttle_left, self.retry_after, self.throttled = 0, "1", 0
        self.server_errors_left = 0
        self.instance: dict = {"compute": {"name": "", "tagsList": [], "osProfile": {"computerName": ""}}}
        self.instance_gets = 0
        self.secrets: dict[str, list[dict]] = {}    # name -> versions, oldest first
        self.secret_puts = 0
        self.page_size = 25
        self.put_barrier: threading.Barrier | None = None  # holds secret PUTs until n have arrived
        self.clock = lambda: int(time.time())
        self._ips = 3
        self._lock = threading.RLock()
        super().__init__(self._handler())

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, resource: str) -> str:
        return f"token-{self.client_id}-{resource}"

    # test helpers

    def fail_capacity(self, key: str, code: str = "AllocationFailed", where: str = "async",
                      message: str = "Allocation failed. We do not have sufficient capacity for the requested VM "
                                     "size in this region.") -> None:
        self.capacity[key] = (code, message, where)

    def finish_operations(self) -> None:
        """Let every running operation end now (as Azure would, polled or not)."""
        with self._lock:
            for op_id in list(self.ops):
                self._finish(op_id)

    def add_secret_version(self, name: str, value: str, state: str | None, created: int | None = None) -> str:
        with self._lock:
            version = uuid.uuid4().hex
            created = self.clock() if created is None else created
            self.secrets.setdefault(name, []).append({
                "value": value, "version": version, "tags": {"gpufleet-munge": state} if state else {},
                "attributes": {"enabled": True, "created": created, "updated": created,
                               "recoveryLevel": "Recoverable+Purgeable"}})
            return version

    # operations

    def _operation(self, provider: str, sub: str, location: str, error: tuple | None = None, done=None) -> str:
        op_id = uuid.uuid4().hex
        self.ops[op_id] = {"polls": self.op_polls, "error": error, "done": done, "finished": False,
                           "compute": provider == "Microsoft.Compute"}
        return (f"{self.base_url}/subscriptions/{sub}/providers/{provider}/locations/{location}/operations/{op_id}"
                f"?api-version={COMPUTE_API if provider == 'Microsoft.Compute' else NETWORK_API}")

    def _finish(self, op_id: str) -> None:
        op = self.ops[op_id]
        if not op["finished"]:
            op["finished"] = True
            if op["done"]:
                op["done"]()

    def _delete_vm(self, name: str) -> None:
        self.deleting.pop(name, None)
        vm = self.vms.pop(name, None)
        if vm is None:
            return
        props = vm["properties"]
        for ref in props["networkProfile"]["networkInterfaces"]:
            nic = ref["id"].rsplit("/", 1)[-1]
            if nic in self.nics:
                self.nics[nic]["properties"].pop("virtualMachine", None)
                if (ref.get("properties") or {}).get("deleteOption") == "Delete":
                    del self.nics[nic]
        for disk, record in list(self.disks.items()):
            if record["vm"] == name and record["deleteOption"] == "Delete":
                del self.disks[disk]

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            content_type = "application/json"

            def _send(self, code: int, doc: dict | None = None, headers: dict | None = None) -> None:
                data = json.dumps(doc).encode() if doc is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, code: int, err: str, message: str, headers: dict | None = None) -> None:
                self._send(code, {"error": {"code": err, "message": message}}, headers)

            def _body(self) -> dict:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                return json.loads(raw) if raw else {}

            def _bearer(self, resource: str) -> bool:
                auth = self.headers.get("Authorization") or ""
                return auth.startswith(f"Bearer token-{fake.client_id}-{resource}")

            def do_GET(self):
                self._route("GET")

            def do_PUT(self):
                self._route("PUT")

            def do_DELETE(self):
                self._route("DELETE")

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                path = url.path.rstrip("/")
                with fake._lock:
                    fake.requests.append((method, path))
                if path.startswith("/metadata/"):
                    return self._metadata(method, path, query)
                if path.startswith("/secrets/"):
                    return self._vault(method, path, query)
                if path.startswith("/subscriptions/"):
                    return self._arm(method, path, query)
                self._error(404, "NotFound", path)

            # instance metadata service

            def _metadata(self, method: str, path: str, query: dict) -> None:
                if self.headers.get("Metadata") != "true" or method != "GET":
                    return self._send(400, {"error": "Bad request. Required metadata header not specified"})
                if path == "/metadata/identity/oauth2/token":
                    if query.get("api-version") != IDENTITY_API or "resource" not in query:
                        return self._send(400, {"error": "invalid_request"})
                    if query.get("client_id", fake.client_id) != fake.client_id:
                        return self._send(400, {"error": "invalid_request", "error_description": "Identity not found"})
                    now = int(time.time())
                    return self._send(200, {
                        "access_token": fake.token(query["resource"]), "client_id": fake.client_id,
                        "expires_in": "3599", "expires_on": str(now + 3599), "ext_expires_in": "3599",
                        "not_before": str(now), "resource": query["resource"], "token_type": "Bearer"})
                if path == "/metadata/instance" and query.get("api-version"):
                    with fake._lock:
                        fake.instance_gets += 1
                        doc = json.loads(json.dumps(fake.instance))
                    return self._send(200, doc)
                self._send(404, {"error": "Not found"})

            # Key Vault

            def _vault(self, method: str, path: str, query: dict) -> None:
                if query.get("api-version") != VAULT_API:
                    return self._error(400, "BadParameter", "api-version")
                if not self._bearer(VAULT):
                    return self._error(401, "Unauthorized", "AKV10000: Request is missing a Bearer or PoP token.")
                parts = path.split("/")[2:]  # name[, version | "versions"]
                name = parts[0]
                if method == "PUT" and len(parts) == 1:
                    body = self._body()
                    if fake.put_barrier is not None:
                        fake.put_barrier.wait(10)
                    with fake._lock:
                        version = fake.add_secret_version(name, body["value"], (body.get("tags") or {}).get(
                            "gpufleet-munge"))
                        fake.secrets[name][-1]["tags"] = body.get("tags") or {}
                        fake.secret_puts += 1
                        return self._send(200, self._bundle(name, fake.secrets[name][-1], version))
                with fake._lock:
                    versions = list(fake.secrets.get(name) or [])
                if method != "GET":
                    return self._error(405, "BadRequest", method)
                if not versions:
                    return self._error(404, "SecretNotFound", f"A secret with (name/id) {name} was not found in "
                                                              "this key vault.")
                if len(parts) == 2 and parts[1] == "versions":
                    start, size = int(query.get("$skiptoken", 0)), min(int(query.get("maxresults", 25)),
                                                                        fake.page_size)
                    page = versions[start:start + size]
                    doc = {"value": [{"id": f"{fake.base_url}/secrets/{name}/{v['version']}",
                                      "attributes": v["attributes"], "tags": v["tags"]} for v in page],
                           "nextLink": None}
                    if start + size < len(versions):
                        doc["nextLink"] = (f"{fake.base_url}/secrets/{name}/versions?api-version={VAULT_API}"
                                           f"&$skiptoken={start + size}&maxresults={size}")
                    return self._send(200, doc)
                if len(parts) == 2:
                    match = [v for v in versions if v["version"] == parts[1]]
                    if not match:
                        return self._error(404, "SecretNotFound", f"{name}/{parts[1]}")
                    return self._send(200, self._bundle(name, match[0], parts[1]))
                self._send(200, self._bundle(name, versions[-1], versions[-1]["version"]))

            def _bundle(self, name: str, v: dict, version: str) -> dict:
                return {"value": v["value"], "id": f"{fake.base_url}/secrets/{name}/{version}",
                        "attributes": v["attributes"], "tags": v["tags"]}

            # Resource Manager

            def _arm(self, method: str, path: str, query: dict) -> None:
                if not self._bearer(MANAGEMENT):
                    return self._error(401, "InvalidAuthenticationToken", "The access token is invalid.")
                with fake._lock:
                    if fake.throttle_left > 0:
                        fake.throttle_left -= 1
                        fake.throttled += 1
                        return self._error(429, "TooManyRequests", "The request is being throttled.",
                                           {"Retry-After": fake.retry_after})
                    if fake.server_errors_left > 0:
                        fake.server_errors_left -= 1
                        return self._error(503, "ServiceUnavailable", "The service is unavailable.")
                parts = path.split("/")
                # /subscriptions/{s}/providers/{ns}/locations/{loc}/operations/{id}
                if len(parts) == 9 and parts[3] == "providers" and parts[7] == "operations":
                    return self._op(parts[8])
                # /subscriptions/{s}/resourceGroups/{rg}/providers/{ns}/{type}/{name}
                if len(parts) != 9 or parts[3] != "resourceGroups" or parts[5] != "providers":
                    return self._error(400, "InvalidResourceId", path)
                sub, rg, kind, name = parts[2], parts[4], f"{parts[6]}/{parts[7]}", parts[8]
                expected = {"Microsoft.Compute/virtualMachines": COMPUTE_API,
                            "Microsoft.Network/networkInterfaces": NETWORK_API}.get(kind)
                if expected is None:
                    return self._error(400, "InvalidResourceType", kind)
                if query.get("api-version") != expected:
                    return self._error(400, "NoRegisteredProviderFound", f"api-version {query.get('api-version')}")
                with fake._lock:
                    if kind.endswith("virtualMachines"):
                        return self._vm(method, sub, rg, name)
                    return self._nic(method, sub, rg, name)

            def _op(self, op_id: str) -> None:
                with fake._lock:
                    op = fake.ops.get(op_id)
                    if op is None:
                        return self._error(404, "NotFound", op_id)
                    if not op["finished"] and (op["polls"] > 0 or fake.hold_operations and op["compute"]):
                        op["polls"] = max(0, op["polls"] - 1)
                        return self._send(200, {"name": op_id, "status": "InProgress"},
                                          {"Retry-After": fake.op_retry_after})
                    fake._finish(op_id)
                    if op["error"]:
                        code, message = op["error"]
                        return self._send(200, {"name": op_id, "status": "Failed",
                                                "error": {"code": code, "message": message}})
                    return self._send(200, {"name": op_id, "status": "Succeeded"})

            def _id(self, sub: str, rg: str, kind: str, name: str) -> str:
                return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/{kind}/{name}"

            def _not_found(self, kind: str, name: str, rg: str) -> None:
                self._error(404, "ResourceNotFound", f"The Resource '{kind}/{name}' under resource group '{rg}' "
                                                     "was not found.")

            def _vm(self, method: str, sub: str, rg: str, name: str) -> None:
                kind = "Microsoft.Compute/virtualMachines"
                vm = fake.vms.get(name)
                if name in fake.deleting:  # Azure goes on deleting the VM, its operation polled or not
                    op = fake.ops[fake.deleting[name]]
                    op["polls"] = max(0, op["polls"] - 1)
                    if op["polls"] == 0:
                        fake._finish(fake.deleting[name])
                        vm = fake.vms.get(name)
                if method == "GET":
                    return self._send(200, vm) if vm else self._not_found(kind, name, rg)
                if method == "DELETE":
                    if vm is None:
                        return self._send(204)
                    vm["properties"]["provisioningState"] = "Deleting"
                    op = fake._operation("Microsoft.Compute", sub, vm["location"],
                                         done=lambda: fake._delete_vm(name))
                    fake.deleting[name] = op.split("/operations/")[1].split("?")[0]
                    return self._send(202, None, {"Azure-AsyncOperation": op, "Location": op,
                                                  "Retry-After": fake.op_retry_after})
                body = self._body()
                props = body.get("properties") or {}
                size = (props.get("hardwareProfile") or {}).get("vmSize")
                if not body.get("location") or not size:
                    return self._error(400, "InvalidParameter", "location and hardwareProfile.vmSize are required")
                for ref in (props.get("networkProfile") or {}).get("networkInterfaces") or []:
                    nic = fake.nics.get(ref["id"].rsplit("/", 1)[-1])
                    if nic is None:
                        return self._error(400, "NotFound", f"Resource {ref['id']} not found.")
                    owner = nic["properties"].get("virtualMachine")
                    if owner and owner["id"].rsplit("/", 1)[-1] != name:
                        return self._error(400, "NicInUse", f"Network interface {ref['id']} is used by {owner}")
                if vm is not None and vm["properties"]["provisioningState"] == "Deleting":
                    return self._error(409, "OperationNotAllowed", "The VM is being deleted.")
                failure = fake.capacity.get(name) or fake.capacity.get(size)
                if failure and failure[2] == "put":
                    return self._error(409, failure[0], failure[1])
                fake.bodies[name] = body
                doc = {"id": self._id(sub, rg, kind, name), "name": name, "type": kind, "location": body["location"],
                       "tags": body.get("tags") or {}, "identity": body.get("identity"),
                       "properties": {**json.loads(json.dumps(props)), "vmId": str(uuid.uuid4()),
                                      "provisioningState": "Creating"}}
                fake.vms[name] = doc
                for ref in props["networkProfile"]["networkInterfaces"]:
                    fake.nics[ref["id"].rsplit("/", 1)[-1]]["properties"]["virtualMachine"] = {"id": doc["id"]}
                os_disk = props["storageProfile"]["osDisk"]
                fake.disks[f"{name}_OsDisk_1_{uuid.uuid4().hex[:8]}"] = {
                    "vm": name, "deleteOption": os_disk.get("deleteOption", "Detach")}
                error = (failure[0], failure[1]) if failure else None

                def done():
                    if name in fake.vms:
                        fake.vms[name]["properties"]["provisioningState"] = "Failed" if error else "Succeeded"

                op = fake._operation("Microsoft.Compute", sub, body["location"], error, done)
                self._send(201 if vm is None else 200, doc, {"Azure-AsyncOperation": op,
                                                             "Retry-After": fake.op_retry_after})

            def _nic(self, method: str, sub: str, rg: str, name: str) -> None:
                kind = "Microsoft.Network/networkInterfaces"
                nic = fake.nics.get(name)
                if method == "GET":
                    return self._send(200, nic) if nic else self._not_found(kind, name, rg)
                if method == "DELETE":
                    if nic is None:
                        return self._send(204)
                    owner = nic["properties"].get("virtualMachine")
                    if owner and owner["id"].rsplit("/", 1)[-1] in fake.vms:
                        return self._error(400, "NicInUse", f"Network Interface {nic['id']} is used by existing "
                                                            f"resource {owner['id']}.")
                    del fake.nics[name]
                    op = fake._operation("Microsoft.Network", sub, nic["location"])
                    fake._finish(op.split("/operations/")[1].split("?")[0])
                    return self._send(202, None, {"Azure-AsyncOperation": op, "Location": op,
                                                  "Retry-After": fake.op_retry_after})
                body = self._body()
                props = body.get("properties") or {}
                configs = props.get("ipConfigurations") or []
                if not body.get("location") or not configs or not (configs[0].get("properties") or {}).get("subnet"):
                    return self._error(400, "InvalidRequestFormat", "an IP configuration with a subnet is required")
                if nic is None:
                    fake._ips += 1
                    ip = f"10.20.0.{fake._ips + 1}"
                else:
                    ip = nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"]
                nic_id = self._id(sub, rg, kind, name)
                doc = {"id": nic_id, "name": name, "type": kind, "location": body["location"],
                       "tags": body.get("tags") or {}, "properties": {
                           **json.loads(json.dumps(props)), "provisioningState": "Succeeded",
                           "ipConfigurations": [{"name": c["name"], "id": f"{nic_id}/ipConfigurations/{c['name']}",
                                                 "properties": {**c["properties"], "privateIPAddress": ip,
                                                                "provisioningState": "Succeeded"}}
                                                for c in configs]}}
                if nic is not None and nic["properties"].get("virtualMachine"):
                    doc["properties"]["virtualMachine"] = nic["properties"]["virtualMachine"]
                fake.nics[name] = doc
                op = fake._operation("Microsoft.Network", sub, body["location"])
                self._send(201 if nic is None else 200, doc, {"Azure-AsyncOperation": op,
                                                              "Retry-After": fake.op_retry_after})

        return Handler
