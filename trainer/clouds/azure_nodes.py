"""Azure: Slurm's power saving through Azure Resource Manager (ARM), and the node-side functions (a node's Slurm
name from the instance metadata service, the stack's munge key from Key Vault).

Everything goes over the services' REST APIs with bearer tokens of the machine's managed identity
(azure-identity's ManagedIdentityCredential; ``client_id`` selects the user-assigned one), so no azure-mgmt
package is needed. Facts relied on, from Azure's REST documentation:
- ARM long-running operations (learn.microsoft.com/azure/azure-resource-manager/management/async-operations):
  a PUT or DELETE answers 201/202 with ``Azure-AsyncOperation`` (poll it: ``status`` InProgress until Succeeded,
  Failed or Canceled, with ``error.code``/``error.message``) or else ``Location``; ``Retry-After`` is seconds.
  Throttled requests answer 429 with ``Retry-After``.
- Virtual Machines - Create Or Update, api-version 2024-07-01: ``virtualMachineScaleSet.id`` puts the VM into a
  Flexible scale set; ``priority`` Spot with ``evictionPolicy`` and ``billingProfile.maxPrice`` -1 (pay up to the
  on-demand price, never evicted for price); ``deleteOption`` Delete on the OS disk and the NIC makes deleting
  the VM delete them; ``securityProfile.encryptionAtHost``; the Linux SSH key path must be
  /home/<adminUsername>/.ssh/authorized_keys.
- Network Interfaces - Create Or Update, api-version 2024-05-01: ``enableAcceleratedNetworking``, an IP
  configuration in the subnet without a public IP; the answer carries ``privateIPAddress``.
- Capacity and quota errors (virtual-machines/error-codes-spot, troubleshooting allocation-failure and
  error-resource-quota): SkuNotAvailable, AllocationFailed, ZonalAllocationFailed, Overconstrained(Zonal)
  AllocationRequest, OperationNotAllowed ("exceeding quota limits"), ResourceQuotaExceeded.
- Instance metadata (virtual-machines/instance-metadata-service): ``GET /metadata/instance?api-version=
  2021-02-01`` with ``Metadata: true``, never through a proxy; ``compute.tagsList`` is [{name, value}].
- Key Vault secrets, api-version 7.4: ``GET {vault}/secrets/{name}[/{version}]`` -> {value, id, attributes
  {created (epoch seconds), ...}, tags}; ``PUT {vault}/secrets/{name}`` {value, tags} adds a version;
  ``GET {vault}/secrets/{name}/versions`` lists versions (no values) page by page (``nextLink``).

The ARM endpoint is the one of the cloud azure-core's own setting names (``AZURE_SDK_CLOUD_CONF``: the public
cloud unless it says AZURE_CHINA_CLOUD or AZURE_US_GOVERNMENT); tests pass ``arm=`` (a loopback fake). Tokens
are always asked for the cloud's real ARM audience.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from trainer.clouds.azure import DEFAULT_BASE
from trainer.errors import Fault, UsageError
from trainer.slurm import client as slurm_client
from trainer.slurm.nodes import NodeProvider as BaseProvider

log = logging.getLogger("gpufleet.azure.nodes")

COMPUTE_API = "2024-07-01"
NETWORK_API = "2024-05-01"
IMDS_API = "2021-02-01"
VAULT_API = "7.4"

ARM_ENDPOINTS = {  # azure-core's AzureClouds -> the cloud's Resource Manager
    "AZURE_PUBLIC_CLOUD": "https://management.azure.com",
    "AZURE_CHINA_CLOUD": "https://management.chinacloudapi.cn",
    "AZURE_US_GOVERNMENT": "https://management.usgovcloudapi.net",
}
VAULT_AUDIENCES = {".vault.azure.cn": "https://vault.azure.cn", ".vault.usgovcloudapi.net":
                   "https://vault.usgovcloudapi.net", ".vault.azure.net": "https://vault.azure.net"}

NODE_TAG = "gpufleet-slurm-node"
STACK_TAG = "gpufleet-stack"
MUNGE_TAG = "gpufleet-munge"       # on the munge secret's versions: unset (the stack's placeholder), generated
UNSET = "unset"                    # (a controller's candidate) or set (the agreed key, written again)
MUNGE_BYTES = 1024
# The DOWN reasons start as the heal daemon expects of a node that got no machine (trainer.slurm.nodes).
NOT_REGISTERED = "resume failed: did not register within ResumeTimeout"

NO_CAPACITY = "no capacity"  # what _resume_one says of a node the cloud had no machine for
# Errors that mean "no machine for you now" (capacity, quota, spot), as opposed to a fault of the request.
CAPACITY_CODES = frozenset({
    "SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest", "ResourceQuotaExceeded", "QuotaExceeded",
    "SpotPriceGreaterThanProvidedMaxPrice", "AzureSpotIsNotSupportedForThisVMSize",
})

WORKERS = 16               # VMs created at once (creation takes minutes, most of it waiting on Azure)
POLL_S = 5.0               # between polls of an operation when Azure names no Retry-After
OPERATION_TIMEOUT_S = 1800
THROTTLE_ATTEMPTS = 8      # 429: each waits Retry-After (at most MAX_WAIT_S)
SERVER_ATTEMPTS = 5        # 5xx and connection errors: backoff BACKOFF_S, doubling
BACKOFF_S = 2.0
MAX_WAIT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
TOKEN_MARGIN_S = 300
SETTLE_S = 2.0             # > the 1 s resolution of Key Vault's `created`: see munge_key


def one_line(text: object, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


# --- HTTP with bearer tokens, retries and long-running operations ---------------------------------------------

class ApiError(Exception):
    """An Azure REST error: the HTTP status (0: no answer) and Azure's error code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, one_line(message)


@dataclass
class Response:
    status: int
    headers: dict = field(default_factory=dict)
    doc: dict = field(default_factory=dict)


def managed_identity(client_id: str | None):
    """azure-identity's credential of this machine's managed identity (the user-assigned one of ``client_id``)."""
    from azure.identity import ManagedIdentityCredential  # lazy: azure extra

    return ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()


class Tokens:
    """Bearer tokens of a credential (anything with azure-core's ``get_token(scope)``), cached per scope."""

    def __init__(self, credential):
        self.credential = credential
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, scope: str) -> str:
        with self._lock:
            token, expires = self._cache.get(scope, ("", 0.0))
            if expires - time.time() > TOKEN_MARGIN_S:
                return token
            try:
                got = self.credential.get_token(scope)
            except Exception as exc:  # azure-identity: CredentialUnavailableError, ClientAuthenticationError
                raise UsageError(f"no token of the managed identity for {scope} ({one_line(exc, 200)}); check "
                                 "the machine's user-assigned identity and its client id") from None
            self._cache[scope] = (got.token, float(got.expires_on))
            return got.token


def _origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _retry_after(headers: dict, default: float) -> float:
    value = headers.get("retry-after")
    if value is None:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        try:  # an HTTP date
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return default


def _error(status: int, doc: dict, fallback: str) -> ApiError:
    """Azure's error body ({"error": {"code", "message", "details"}}) as an ApiError. A generic code whose
    details name a capacity error reports that one."""
    err = doc.get("error") if isinstance(doc.get("error"), dict) else {}
    code, message = err.get("code") or fallback, err.get("message") or ""
    for detail in err.get("details") or []:
        if isinstance(detail, dict) and detail.get("code") in CAPACITY_CODES and code not in CAPACITY_CODES:
            code, message = detail["code"], detail.get("message") or message
    return ApiError(status, code, message or fallback)


class Rest:
    """JSON over HTTPS to one service (its origin: the token goes nowhere else) with a bearer token: 429 waits
    Retry-After, 5xx and lost connections back off, both a bounded number of times; long-running operations
    are followed to their end."""

    def __init__(self, base: str, tokens: Tokens, scope: str, *, sleep=time.sleep, poll_s: float = POLL_S,
                 operation_timeout_s: float = OPERATION_TIMEOUT_S):
        self.base, self.tokens, self.scope = base.rstrip("/"), tokens, scope
        self.sleep, self.poll_s, self.operation_timeout_s = sleep, poll_s, operation_timeout_s

    def call(self, method: str, url: str, body: dict | None = None) -> Response:
        if not url.startswith(("http://", "https://")):
            url = self.base + url
        if _origin(url) != _origin(self.base):  # an operation URL elsewhere would get our token
            raise ApiError(0, "UnexpectedHost", f"{method} {url}: not {self.base}; refused")
        data = json.dumps(body).encode() if body is not None else None
        throttled = failed = 0
        while True:
            req = urllib.request.Request(url, data=data, method=method, headers={
                "Authorization": f"Bearer {self.tokens.get(self.scope)}", "Accept": "application/json",
                **({"Content-Type": "application/json"} if data is not None else {})})
            try:
                with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                    return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                                    _json(resp.read()))
            except urllib.error.HTTPError as exc:
                headers = {k.lower(): v for k, v in exc.headers.items()}
                doc = _json(exc.read())
                if exc.code == 429 and throttled < THROTTLE_ATTEMPTS - 1:
                    throttled += 1
                    wait = min(_retry_after(headers, BACKOFF_S * 2 ** throttled), MAX_WAIT_S)
                    log.info("%s %s: throttled (429), again in %.0f s", method, _short(url), wait)
                    self.sleep(wait)
                    continue
                if exc.code >= 500 and failed < SERVER_ATTEMPTS - 1:
                    failed += 1
                    self.sleep(min(BACKOFF_S * 2 ** (failed - 1), MAX_WAIT_S))
                    continue
                raise _error(exc.code, doc, f"HTTP {exc.code}") from None
            except (urllib.error.URLError, OSError) as exc:
                if failed < SERVER_ATTEMPTS - 1:
                    failed += 1
                    self.sleep(min(BACKOFF_S * 2 ** (failed - 1), MAX_WAIT_S))
                    continue
                raise ApiError(0, "NoAnswer", f"{method} {_short(url)}: {one_line(exc, 160)}") from None

    def wait(self, resp: Response, url: str) -> dict:
        """Follow a PUT's or DELETE's long-running operation to its end: Azure-AsyncOperation, else Location,
        else the resource's provisioningState. Failed or Canceled raise its error."""
        deadline = time.monotonic() + self.operation_timeout_s
        op, location = resp.headers.get("azure-asyncoperation"), resp.headers.get("location")
        if op:
            while True:
                self._pause(resp.headers, deadline, url)
                resp = self.call("GET", op)
                status = resp.doc.get("status")
                if status == "Succeeded":
                    return resp.doc
                if status in ("Failed", "Canceled"):
                    raise _error(resp.status, resp.doc, f"Operation{status}")
        if location and resp.status == 202:
            while resp.status == 202:
                self._pause(resp.headers, deadline, url)
                resp = self.call("GET", location)
            return resp.doc
        while (resp.doc.get("properties") or {}).get("provisioningState") not in (None, "Succeeded", "Failed",
                                                                                   "Canceled"):
            self._pause(resp.headers, deadline, url)
            resp = self.call("GET", url)
        if (resp.doc.get("properties") or {}).get("provisioningState") in ("Failed", "Canceled"):
            raise ApiError(resp.status, "ProvisioningFailed", f"{_short(url)}: provisioningState "
                           f"{resp.doc['properties']['provisioningState']}")
        return resp.doc

    def _pause(self, headers: dict, deadline: float, url: str) -> None:
        if time.monotonic() >= deadline:
            raise ApiError(0, "OperationTimedOut", f"{_short(url)}: not done within {self.operation_timeout_s:g} s")
        self.sleep(min(_retry_after(headers, self.poll_s), MAX_WAIT_S))


def _json(raw: bytes) -> dict:
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _short(url: str) -> str:
    return urllib.parse.urlsplit(url).path.rsplit("/providers/", 1)[-1]


# --- The power-saving provider -----------------------------------------------------------------------------------

def arm_endpoint() -> str:
    """The Resource Manager of the cloud azure-core's setting names (AZURE_SDK_CLOUD_CONF)."""
    from azure.core.settings import settings  # lazy: azure extra

    return ARM_ENDPOINTS[settings.azure_cloud().name]


def image_reference(image: str) -> dict:
    """A partition's ``image``: an image id (Azure Compute Gallery image or version, managed image), a shared or
    community gallery image id, or a marketplace URN publisher:offer:sku:version."""
    if image.lower().startswith("/subscriptions/"):
        return {"id": image}
    if image.startswith("/SharedGalleries/"):
        return {"sharedGalleryImageId": image}
    if image.startswith("/CommunityGalleries/"):
        return {"communityGalleryImageId": image}
    parts = image.split(":")
    if len(parts) == 4 and all(parts):
        return dict(zip(("publisher", "offer", "sku", "version"), parts))
    raise UsageError(f"nodes: image {image!r} is neither an image id (/subscriptions/...) nor a URN "
                     "publisher:offer:sku:version")


PARTITION_KEYS = ("subscription_id", "resource_group", "location", "subnet_id", "image", "identity_id",
                  "admin_username", "ssh_public_key", "custom_data", "os_disk_gb")


def vm_name(stack: str, node: str) -> str:
    return f"gpufleet-{stack}-{node}"


def is_spot(partition: dict, index: int) -> bool:
    """Nodes 1..on_demand_base of a partition run on demand; the rest as its ``spot`` says."""
    return bool(partition.get("spot")) and index > int(partition.get("on_demand_base") or 0)


def nic_body(partition: dict, tags: dict) -> dict:
    return {"location": partition["location"], "tags": tags, "properties": {
        "enableAcceleratedNetworking": True,
        "ipConfigurations": [{"name": "ipconfig1", "properties": {
            "primary": True, "privateIPAllocationMethod": "Dynamic", "subnet": {"id": partition["subnet_id"]}}}],
    }}


def vm_body(node: str, index: int, partition: dict, tags: dict, nic_id: str) -> dict:
    """The VM of Slurm node ``node`` (its index in the partition: on demand or spot)."""
    size = partition.get("vm_size") or (partition.get("instance_types") or [None])[0]
    if not size:
        raise UsageError(f"nodes: partition of {node} names no vm_size")
    managed_disk = {"storageAccountType": "Premium_LRS"}
    if partition.get("disk_encryption_set_id"):
        managed_disk["diskEncryptionSet"] = {"id": partition["disk_encryption_set_id"]}
    admin = partition["admin_username"]
    properties = {
        "hardwareProfile": {"vmSize": size},
        "storageProfile": {
            "imageReference": image_reference(partition["image"]),
            "osDisk": {"createOption": "FromImage", "caching": "ReadWrite", "diskSizeGB": int(partition["os_disk_gb"]),
                       "managedDisk": managed_disk, "deleteOption": "Delete"},
        },
        "osProfile": {
            "computerName": node, "adminUsername": admin, "customData": partition["custom_data"],
            "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
                {"path": f"/home/{admin}/.ssh/authorized_keys", "keyData": partition["ssh_public_key"]}]}},
        },
        "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": True,
                                                                               "deleteOption": "Delete"}}]},
        "securityProfile": {"encryptionAtHost": True},
        "priority": "Regular",
    }
    if partition.get("availability_set_id"):
        # a multi-node gang on InfiniBand: an availability set (Flexible scale sets have no InfiniBand), which
        # takes no spot VM (the stack's config refuses gang + spot on azure)
        if is_spot(partition, index):
            raise UsageError(f"nodes: partition of {node} is in an availability set, which takes no spot VM")
        properties["availabilitySet"] = {"id": partition["availability_set_id"]}
    else:
        if is_spot(partition, index):
            properties.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": -1})
        if partition.get("scale_set_id"):
            properties["virtualMachineScaleSet"] = {"id": partition["scale_set_id"]}
    # the node's identity and each team's, whose tokens its credentials daemon gives the team's jobs
    identities = {i: {} for i in (partition["identity_id"], *partition.get("team_identity_ids", ()))}
    body = {"location": partition["location"], "tags": tags, "properties": properties,
            "identity": {"type": "UserAssigned", "userAssignedIdentities": identities}}
    if partition.get("plan"):  # a marketplace image with a plan (publisher, product, name)
        body["plan"] = partition["plan"]
    return body


class NodeProvider(BaseProvider):
    """Slurm CLOUD nodes as Azure VMs in a partition's Flexible scale set (or, for a multi-node gang on InfiniBand,
    its availability set), one VM (and its NIC) per node name.

    config: /etc/gpufleet/nodes.json (trainer.slurm.nodes), provider "azure", with each partition's Azure keys
    (infra.azure.stack writes them: the nodes' resource group, the scale set or availability set, the subnet,
    image, identity, ...) and optionally ``client_id``: the controller's user-assigned identity (else
    AZURE_CLIENT_ID, else the system-assigned one). The identity needs, on the nodes' resource group: VM, disk and
    NIC write/read/delete, the scale set or availability set; on the node subnet: join; the node identity: assign;
    the image: read (infra.azure.identity's custom roles).
    """

    def __init__(self, config: dict, slurm=slurm_client, arm: str | None = None, *, credential=None,
                 sleep=time.sleep, poll_s: float = POLL_S, operation_timeout_s: float = OPERATION_TIMEOUT_S,
                 workers: int = WORKERS):
        if not config.get("stack"):
            raise UsageError("nodes: the nodes config names no stack")
        self.config, self.slurm, self.stack = config, slurm, config["stack"]
        self.partitions = config.get("partitions") or {}
        self.tags = {**(config.get("tags") or {})}
        self.tags.setdefault(STACK_TAG, self.stack)
        self.workers = max(1, workers)
        cloud = arm_endpoint()
        tokens = Tokens(credential or managed_identity(config.get("client_id") or os.environ.get("AZURE_CLIENT_ID")))
        self.arm = Rest(arm or cloud, tokens, f"{cloud}/.default", sleep=sleep, poll_s=poll_s,
                        operation_timeout_s=operation_timeout_s)

    # names and URLs

    def partition(self, node: str) -> tuple[str, int, dict]:
        name, _, index = node.rpartition("-")
        part = self.partitions.get(name)
        if part is None or not index.isdigit() or int(index) < 1:
            raise UsageError(f"nodes: {node} is not <partition>-<n> of a partition in the nodes config "
                             f"({', '.join(sorted(self.partitions)) or 'none'})")
        missing = [k for k in PARTITION_KEYS if part.get(k) in (None, "")]
        if missing:
            raise UsageError(f"nodes: partition {name} lacks {', '.join(missing)} in the nodes config")
        return name, int(index), part

    @staticmethod
    def _id(part: dict, kind: str, name: str) -> str:
        return (f"/subscriptions/{part['subscription_id']}/resourceGroups/{part['resource_group']}/providers/"
                f"{kind}/{name}")

    def _vm(self, part: dict, node: str) -> str:
        return self._id(part, "Microsoft.Compute/virtualMachines", vm_name(self.stack, node)) + \
            f"?api-version={COMPUTE_API}"

    def _nic(self, part: dict, node: str) -> str:
        return self._id(part, "Microsoft.Network/networkInterfaces", vm_name(self.stack, node) + "-nic") + \
            f"?api-version={NETWORK_API}"

    # resume

    def resume(self, names: list[str]) -> None:
        if not names:
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(names)), thread_name_prefix="resume") as pool:
            failures = dict(zip(names, pool.map(self._resume_one, names)))
        self._gang_all_or_nothing(names, failures)
        # No capacity is the cloud's answer, not a fault: those nodes are DOWN with the reason and Slurm requeues
        # their jobs (exit 0, as on the other clouds). Anything else fails the program, in one line.
        faults = {n: why for n, why in failures.items() if why not in (None, NO_CAPACITY, "gang")}
        if faults:
            raise Fault(f"nodes resume: {len(faults)} of {len(names)} node(s) got no machine and are DOWN: "
                        + "; ".join(f"{n} ({why})" for n, why in list(faults.items())[:8]))

    def _resume_one(self, node: str) -> str | None:
        """Create the node's NIC and VM, wait for them, tell Slurm its address; None, or why it failed (the node
        is then DOWN with the reason and what was made for it deleted)."""
        part = None
        try:
            _, index, part = self.partition(node)
            tags = {**self.tags, NODE_TAG: node}
            nic_url, vm_url = self._nic(part, node), self._vm(part, node)
            self._gone(vm_url)
            self.arm.wait(self.arm.call("PUT", nic_url, nic_body(part, tags)), nic_url)
            nic_id = nic_url.split("?")[0]
            body = vm_body(node, index, part, tags, nic_id)
            log.info("node %s: creating VM %s (%s, %s)", node, vm_name(self.stack, node),
                     body["properties"]["hardwareProfile"]["vmSize"], body["properties"]["priority"])
            self.arm.wait(self.arm.call("PUT", vm_url, body), vm_url)
            nic = self.arm.call("GET", nic_url).doc
            ip = nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"]
            self.slurm.update_node(node, nodeaddr=ip, nodehostname=node)
            log.info("node %s: VM running at %s", node, ip)
            return None
        except ApiError as exc:
            code, message = exc.code, exc.message
            if code in CAPACITY_CODES or (code == "OperationNotAllowed" and "quota" in message.lower()):
                log.warning("node %s: no capacity: %s: %s", node, code, message)
                self._fail(node, part, f"resume failed: {code}: {message}")
                return NO_CAPACITY
            log.error("node %s: %s: %s", node, code, message)
        except Exception as exc:  # a bad config, no credential, Slurm refusing the address, anything
            code, message = type(exc).__name__, one_line(exc)
            log.error("node %s: %s: %s", node, code, message)
        self._fail(node, part, f"resume failed: {code}: {message}")
        return code

    def _gone(self, vm_url: str) -> None:
        """Wait while the node's previous VM is still being deleted (a suspend moments ago): a PUT would be
        refused, and its NIC goes with it."""
        deadline = time.monotonic() + self.arm.operation_timeout_s
        while True:
            vm = self._get(vm_url)
            if vm is None or (vm.get("properties") or {}).get("provisioningState") != "Deleting":
                return
            if time.monotonic() >= deadline:
                raise ApiError(0, "OperationTimedOut", f"{_short(vm_url)}: still being deleted")
            self.arm.sleep(self.arm.poll_s)

    def _fail(self, node: str, part: dict | None, reason: str) -> None:
        self._down(node, reason)
        if part is not None:
            self._delete(node, part, wait=True)

    def _down(self, node: str, reason: str) -> None:
        try:
            self.slurm.update_node(node, state="DOWN", reason=reason[:200])
        except Exception as exc:
            log.error("node %s: could not set it DOWN (%s)", node, one_line(exc))

    def _delete(self, node: str, part: dict, wait: bool) -> None:
        """Delete the node's VM (its OS disk and NIC go with it: deleteOption) and then its NIC, in case the VM
        never held it. ``wait``: until the VM is gone, so that the NIC is free to delete."""
        for url in (self._vm(part, node), self._nic(part, node)):
            try:
                resp = self.arm.call("DELETE", url)
                if wait and resp.status == 202:
                    self.arm.wait(resp, url)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("node %s: could not delete %s (%s: %s)", node, _short(url), exc.code, exc.message)

    def _gang_all_or_nothing(self, names: list[str], failures: dict[str, str | None]) -> None:
        """In a gang partition a resume batch is all or nothing: when one node got no machine, the others of
        its partition in the batch are deleted and DOWN as well."""
        by_partition: dict[str, list[str]] = {}
        for node in names:
            by_partition.setdefault(node.rpartition("-")[0], []).append(node)
        for pname, nodes in by_partition.items():
            part = self.partitions.get(pname) or {}
            lost = [n for n in nodes if failures.get(n)]
            if not part.get("gang") or not lost:
                continue
            for node in nodes:
                if not failures.get(node):
                    failures[node] = "gang"
                    self._fail(node, part, f"resume failed: gang: {lost[0]} got no machine ({failures[lost[0]]})")

    # suspend

    def suspend(self, names: list[str]) -> None:
        if not names:
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(names)), thread_name_prefix="suspend") as pool:
            errors = [e for e in pool.map(self._suspend_one, names) if e]
        if errors:
            raise Fault(f"nodes suspend: {len(errors)} of {len(names)} node(s) not deleted: " + "; ".join(errors[:8]))

    def _suspend_one(self, node: str) -> str | None:
        """Ask Azure to delete the node's VM if it is this stack's (not waiting for it to go), or a NIC left
        without its VM. None, or what went wrong."""
        try:
            _, _, part = self.partition(node)
            vm_url, nic_url = self._vm(part, node), self._nic(part, node)
            vm = self._get(vm_url)
            if vm is not None:
                if not self._ours(vm, node):
                    log.warning("node %s: VM %s is not this stack's (tags %s); left alone", node,
                                vm.get("name"), vm.get("tags"))
                    return None
                self.arm.call("DELETE", vm_url)
                log.info("node %s: VM %s deleting", node, vm.get("name"))
                return None
            nic = self._get(nic_url)
            if nic is not None and self._ours(nic, node) and not (nic.get("properties") or {}).get("virtualMachine"):
                self.arm.call("DELETE", nic_url)
                log.info("node %s: its NIC without a VM deleting", node)
            return None
        except ApiError as exc:
            log.error("node %s: not deleted: %s: %s", node, exc.code, exc.message)
            return f"{node} ({exc.code})"
        except Exception as exc:
            log.error("node %s: not deleted: %s", node, one_line(exc))
            return f"{node} ({type(exc).__name__})"

    def _get(self, url: str) -> dict | None:
        try:
            return self.arm.call("GET", url).doc
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _ours(self, resource: dict, node: str) -> bool:
        tags = resource.get("tags") or {}
        return tags.get(STACK_TAG) == self.tags[STACK_TAG] and tags.get(NODE_TAG, node) == node

    def resume_failed(self, names: list[str]) -> None:
        """Nodes that did not register within ResumeTimeout: their VMs are deleted and they stay DOWN."""
        try:
            self.suspend(names)
        finally:
            for node in names:
                self._down(node, NOT_REGISTERED)


# --- On a node: its Slurm name ---------------------------------------------------------------------------------

def name_from_instance(doc: dict, stack: str | None) -> str | None:
    """This VM's Slurm name from its instance metadata: the ``gpufleet-slurm-node`` tag the provider set when it
    created the VM (ARM tags cannot be changed from inside the VM). Fallback: the computer name, but only when
    the VM's own name is gpufleet-<stack>-<that name>, i.e. the provider made both (any VM has a computer name;
    a wrong one would make slurmd register as another node)."""
    compute = doc.get("compute") or {}
    for tag in compute.get("tagsList") or []:
        if tag.get("name") == NODE_TAG and tag.get("value"):
            return tag["value"]
    computer = (compute.get("osProfile") or {}).get("computerName")
    if stack and computer and compute.get("name") == vm_name(stack, computer):
        return computer
    return None


def node_name(settings: dict, timeout_s: float = 300, *, base_url: str | None = None, poll_s: float = 2.0) -> str:
    """This machine's Slurm node name, from the instance metadata service at ``base_url`` (default: the one
    trainer.clouds.azure uses); waits until the tag is there, a Fault after ``timeout_s``."""
    base = (base_url or DEFAULT_BASE).rstrip("/")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the metadata service: never proxied
    deadline = time.monotonic() + timeout_s
    while True:
        req = urllib.request.Request(f"{base}/metadata/instance?api-version={IMDS_API}", headers={"Metadata": "true"})
        try:
            with opener.open(req, timeout=5) as resp:
                name = name_from_instance(_json(resp.read()), settings.get("stack"))
            if name:
                return name
            why = f"this VM has no {NODE_TAG} tag"
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code} from the instance metadata service at {base}"
        except (urllib.error.URLError, OSError) as exc:
            why = f"no instance metadata service at {base} ({one_line(exc, 120)})"
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fault(f"node name: {why} after {timeout_s:g} s; the node provider tags each VM it creates")
        time.sleep(min(poll_s, left))


# --- The munge key: a Key Vault secret ----------------------------------------------------------------------------

def parse_secret_url(url: str) -> tuple[str, str, str]:
    """(vault base URL, secret name, token audience) of https://<vault>.vault.azure.net/secrets/<name>. Plain
    http only on loopback (tests)."""
    parts = urllib.parse.urlsplit(url or "")
    host = (parts.hostname or "").lower()
    segments = [s for s in parts.path.split("/") if s]
    loopback = host in ("127.0.0.1", "localhost", "::1")
    audience = next((aud for suffix, aud in VAULT_AUDIENCES.items() if host.endswith(suffix)), None)
    if (len(segments) != 2 or segments[0] != "secrets" or parts.query or not (
            (parts.scheme == "https" and audience) or (parts.scheme in ("http", "https") and loopback))):
        raise UsageError(f"munge key: slurm.munge {url!r} is not a Key Vault secret URL "
                         "(https://<vault>.vault.azure.net/secrets/<name>, without a version)")
    return f"{parts.scheme}://{parts.netloc}", segments[1], audience or VAULT_AUDIENCES[".vault.azure.net"]


class Secret:
    """One Key Vault secret over the REST API."""

    def __init__(self, url: str, credential, *, sleep=time.sleep):
        base, self.name, audience = parse_secret_url(url)
        self.url = f"{base}/secrets/{self.name}"
        self.rest = Rest(base, Tokens(credential), f"{audience}/.default", sleep=sleep)

    def _call(self, method: str, url: str, body: dict | None = None) -> dict:
        sep = "&" if "?" in url else "?"
        try:
            return self.rest.call(method, url if "api-version=" in url else f"{url}{sep}api-version={VAULT_API}",
                                  body).doc
        except ApiError as exc:
            if exc.status == 404:
                raise Fault(f"munge key: no secret {self.url} ({exc.code}); the stack creates it") from None
            if exc.status in (401, 403):
                raise Fault(f"munge key: {self.url}: HTTP {exc.status} {exc.code}; the identity needs Key Vault "
                            "Secrets User (nodes) or Secrets Officer (the controller) on it") from None
            raise Fault(f"munge key: {self.url}: {exc.code}: {exc.message}") from None

    def latest(self) -> dict:
        return self._call("GET", self.url)

    def version(self, version: str) -> dict:
        return self._call("GET", f"{self.url}/{version}")

    def put(self, value: str, state: str) -> dict:
        return self._call("PUT", self.url, {"value": value, "tags": {MUNGE_TAG: state}})

    def versions(self) -> list[dict]:
        """Every version's id, attributes and tags (no values), following nextLink."""
        found, url = [], f"{self.url}/versions"
        while url:
            doc = self._call("GET", url)
            found.extend(doc.get("value") or [])
            url = doc.get("nextLink")
        return found


def _state(item: dict) -> str | None:
    return (item.get("tags") or {}).get(MUNGE_TAG)


def _version_id(item: dict) -> str:
    return item["id"].rstrip("/").rsplit("/", 1)[-1]


def _order(item: dict) -> tuple[int, str]:
    return int((item.get("attributes") or {}).get("created") or 0), _version_id(item)


def _decode(value: str, url: str) -> bytes:
    try:
        key = base64.b64decode(value, validate=True)
    except ValueError:
        raise Fault(f"munge key: {url} does not hold base64") from None
    if len(key) < 32:
        raise Fault(f"munge key: {url} holds {len(key)} bytes; munge needs at least 32")
    return key


def munge_key(settings: dict, create: bool = False, *, credential=None, settle_s: float = SETTLE_S) -> bytes:
    """The stack's munge key (the 1024 bytes) from the Key Vault secret ``settings["slurm"]["munge"]``, read
    with this machine's managed identity (``settings["azure"]["client_id"]``).

    The stack creates the secret holding "unset" (tag gpufleet-munge=unset). A node (create=False) reads the
    latest version; "unset" is a Fault. The controller (create=True) generates the key when the secret holds
    none. Key Vault has no conditional write (no ETag), so two controllers racing are settled by its version
    history: each writes its candidate as a new version (tag generated), waits ``settle_s`` (longer than the
    1 s resolution of the versions' ``created``), lists the versions and takes the oldest candidate not older
    than the newest placeholder (by created, then version id: every racer sees the same order), and writes
    that value again as the latest version (tag set). Every racer agrees on the winner and the latest version
    ends holding it; a controller that finds an unconfirmed candidate as the latest runs the same settlement.
    To rotate the key, set the secret to "unset" (tag gpufleet-munge=unset) and restart the controller. The
    key is never logged.
    """
    url = (settings.get("slurm") or {}).get("munge")
    if not url:
        raise UsageError("munge key: the settings name no secret (slurm.munge)")
    client_id = (settings.get("azure") or {}).get("client_id") or os.environ.get("AZURE_CLIENT_ID")
    secret = Secret(url, credential or managed_identity(client_id))
    latest = secret.latest()
    if latest.get("value") == UNSET:
        if not create:
            raise Fault(f"munge key: {secret.url} holds no key yet ({UNSET!r}); the controller creates it at its "
                        "first boot")
        secret.put(base64.b64encode(os.urandom(MUNGE_BYTES)).decode(), "generated")
        log.info("munge key: a new key stored in %s as a candidate", secret.url)
    elif not create or _state(latest) != "generated":
        return _decode(latest.get("value") or "", secret.url)
    time.sleep(settle_s)
    winner = _settle(secret)
    value = secret.version(_version_id(winner))["value"]
    current = secret.latest()
    if not (_state(current) == "set" and current.get("value") == value):
        secret.put(value, "set")
        current = secret.latest()
    if _state(current) == "set":  # what the store holds (a racer still writing its candidate will agree)
        value = current.get("value") or ""
    log.info("munge key: %s holds the key (version %s)", secret.url, _version_id(winner))
    return _decode(value, secret.url)


def _settle(secret: Secret) -> dict:
    """The winning candidate: the oldest version tagged generated, not older than the newest placeholder."""
    items = sorted(secret.versions(), key=_order)
    placeholders = [_order(i)[0] for i in items if _state(i) == UNSET]
    since = placeholders[-1] if placeholders else -1
    candidates = [i for i in items if _state(i) == "generated" and _order(i)[0] >= since]
    if not candidates:
        raise Fault(f"munge key: {secret.url} changed while the key was being created; run it again")
    return candidates[0]
