"""Azure: Blob checkpoint store, Storage-queue job queue, Scheduled Events stop notices, node platform (Key
Vault secrets and registry logins through the node's managed identity), and a job's own identity on a node (its
team's: TeamIdentityIssuer, which trainer.node.jobcreds serves).

Credentials and endpoints come from the standard variables only:
- ``AZURE_STORAGE_CONNECTION_STRING`` (the SDKs' and CLI's own): when it names the same account as the
  URL (or the URL names none, as az:// does), its endpoints and key win. This points the adapters at
  Azurite, as ``AWS_ENDPOINT_URL`` points boto3 at moto.
- Otherwise ``DefaultAzureCredential``: on a node or the controller the machine's user-assigned managed identity,
  selected by ``AZURE_CLIENT_ID`` or else the client id in node.json (a node) or controller.json (the controller,
  which has no node.json); in a job's process its team's identity, from the node's endpoint that
  ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER`` name (azure-identity's App Service credential). The accounts refuse
  shared keys.
- ``AZURE_STORAGE_ACCOUNT`` (the CLI's own) names the account for az:// URIs.

Blob store (``az://container/prefix`` or ``https://<account>.blob.core.windows.net/<container>/<prefix>``):
a blob upload commits at once (single put or block-list commit), so readers never see half a blob.
Large files go up and down in parallel blocks; azure-core retries transient errors with backoff.

Job queue (``https://<account>.queue.core.windows.net/<queue>``), differences from SQS handled here:
- No long polling: ``receive`` polls until ``wait_s`` has passed.
- Every update of a message (extend, release) returns a new pop receipt and voids the old one; the
  queue keeps the current receipt per message id, so callers can go on using the Message they got.
- No dead-letter queue: a message delivered more than ``max_deliveries`` times is moved to
  ``<queue>-poison`` (as Azure Functions does) instead of being handed out again.
- No cap on time in flight (each update may hide a message for up to 7 days), and messages are sent
  without expiry (the default time-to-live would drop a job that waits 7 days).
Message bodies are base64-encoded text, the encoding Azure Functions and the portal use.

Scheduled Events: ``GET {base}/metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true``
(base http://169.254.169.254, a parameter). The watcher never approves an event (approval would start the
eviction at once): events happen at their NotBefore time, by which the node's jobs were requeued. Off Azure
nothing answers: the watcher backs off up to ``max_backoff_s`` and logs once.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from trainer.errors import Fault, UsageError
from trainer.jobs.queue import JobQueue, Message
from trainer.loop import notices
from trainer.loop.storage import Conflict, MiB, Store
from trainer.node import node_schema
from trainer.node.platform import Platform
from trainer.node.registry import ACR_USER, LoginCache, RegistryLogin, image_host, is_acr, jwt_expiry

# --- Credentials and endpoints --------------------------------------------------------------------

log = logging.getLogger("gpufleet.azure")

# The SDKs log every HTTP request at INFO; the trainer logs at INFO.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
# DefaultAzureCredential logs every credential it tried (dozens of lines); the boundary tells it in one line.
logging.getLogger("azure.identity").setLevel(logging.ERROR)

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT = "AZURE_STORAGE_ACCOUNT"


def connection_settings(conn: str) -> dict[str, str]:
    """`Key=Value;...` -> {Key: Value} (values may contain '=')."""
    pairs = (part.split("=", 1) for part in conn.split(";") if "=" in part)
    return {k.strip(): v.strip() for k, v in pairs}


def connection_string(account: str | None) -> str | None:
    """The connection string from the environment when it serves `account` (None: any account)."""
    conn = os.environ.get(CONNECTION_STRING)
    if not conn:
        return None
    if account is None or connection_settings(conn).get("AccountName") == account:
        return conn
    return None


def default_account() -> str | None:
    conn = os.environ.get(CONNECTION_STRING)
    if conn:
        return connection_settings(conn).get("AccountName")
    return os.environ.get(ACCOUNT) or None


def machine_settings() -> dict:
    """This machine's settings: node.json on a GPU node, controller.json on the Slurm controller (which has no
    node.json), {} elsewhere."""
    node = node_schema.load(node_schema.PATH, required=False)
    if node or not Path(node_schema.CONTROLLER_PATH).exists():
        return node
    return node_schema.load_controller(node_schema.CONTROLLER_PATH)


def credential():
    """DefaultAzureCredential; its managed identity (the metadata address) only on an Azure machine of a stack (a
    node or the controller), or where the hosting service names an identity endpoint: a laptop, CI or a test never
    sends a packet there. The user-assigned identity is the one AZURE_CLIENT_ID names, else the one of the
    machine's settings (azure.client_id); a job's process on a node names none (the node's endpoint answers with
    its team's identity)."""
    from azure.identity import DefaultAzureCredential  # lazy: azure extra

    settings = machine_settings()
    on_azure = settings.get("cloud") == "azure" or any(
        os.environ.get(v) for v in ("IDENTITY_ENDPOINT", "MSI_ENDPOINT"))
    client_id = os.environ.get("AZURE_CLIENT_ID") or (settings.get("azure") or {}).get("client_id") or None
    if job_endpoint():
        client_id = None
    return DefaultAzureCredential(exclude_interactive_browser_credential=True,
                                  exclude_managed_identity_credential=not on_azure,
                                  **({"managed_identity_client_id": client_id} if on_azure and client_id else {}))


HOW_TO_CREDENTIAL = (f"set {CONNECTION_STRING} (an account key or SAS connection string), or sign in with "
                     "`az login`, or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET for a service principal; "
                     "on a cluster node the managed identity provides it")


def explain(exc: BaseException) -> UsageError | Fault | None:
    """azure-identity's and azure-core's credential and connection errors in one line."""
    from azure.core import exceptions as ac  # lazy: azure extra

    if isinstance(exc, ac.ClientAuthenticationError):  # azure-identity's CredentialUnavailableError is one
        status = f" (HTTP {exc.status_code})" if getattr(exc, "status_code", None) else ""
        return UsageError(f"no usable Azure credential{status}; {HOW_TO_CREDENTIAL}")
    if isinstance(exc, ac.ServiceRequestError):  # the request never reached the service
        return Fault(f"cannot connect to the Azure Storage endpoint ({str(exc).splitlines()[0][:160]}); "
                     f"check the network, or {CONNECTION_STRING} if it points at an emulator")
    return None


# --- Checkpoint store: Blob Storage ---------------------------------------------------------------

BLOB_HOST = ".blob.core.windows.net"
CONCURRENCY = 8


def parse_uri(uri: str) -> tuple[str | None, str, str]:
    """(account or None for az://, container, prefix ending in '/' or '')."""
    parsed = urlparse(uri)
    if parsed.scheme == "az":
        account, container, path = None, parsed.netloc, parsed.path
    elif parsed.scheme == "https" and (parsed.hostname or "").endswith(BLOB_HOST):
        account = parsed.hostname[: -len(BLOB_HOST)]
        container, _, path = parsed.path.lstrip("/").partition("/")
    else:
        raise UsageError(f"checkpoint URI {uri!r}: expected az://container/prefix or "
                         f"https://<account>{BLOB_HOST}/<container>/<prefix>")
    if not container:
        raise UsageError(f"checkpoint URI {uri!r}: missing container")
    prefix = path.strip("/")
    return account, container, prefix + "/" if prefix else ""


class AzureBlobStore(Store):
    def __init__(self, container_client, prefix: str, uri: str) -> None:
        self.container = container_client
        self.prefix = prefix
        self.uri = uri

    def _name(self, key: str) -> str:
        return self.prefix + key

    def write_bytes(self, key: str, data: bytes) -> None:
        self.container.upload_blob(self._name(key), data, overwrite=True, max_concurrency=CONCURRENCY)

    def read_bytes(self, key: str) -> bytes:
        return self._download(key).readall()

    def upload_file(self, key: str, path: str | os.PathLike) -> None:
        with open(path, "rb") as src:
            self.container.upload_blob(self._name(key), src, overwrite=True, max_concurrency=CONCURRENCY)

    def download_file(self, key: str, path: str | os.PathLike) -> None:
        stream = self._download(key)  # raises before the target file is touched
        with open(path, "wb") as out:
            stream.readinto(out)

    def _download(self, key: str):
        from azure.core.exceptions import ResourceNotFoundError  # lazy: azure extra

        try:
            return self.container.download_blob(self._name(key), max_concurrency=CONCURRENCY)
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(f"{self.uri}{key}") from exc

    def list(self, prefix: str = "") -> list[str]:
        names = self.container.list_blob_names(name_starts_with=self._name(prefix))
        return sorted(name[len(self.prefix):] for name in names)

    def children(self, prefix: str) -> list[str]:
        from azure.storage.blob import BlobPrefix  # lazy: azure extra

        start = self._name(prefix)
        return sorted(item.name[len(start):].rstrip("/") for item in
                      self.container.walk_blobs(name_starts_with=start, delimiter="/") if isinstance(item, BlobPrefix))

    def delete(self, key: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError  # lazy: azure extra

        try:
            self.container.delete_blob(self._name(key))
        except ResourceNotFoundError:
            pass

    def exists(self, key: str) -> bool:
        return self.container.get_blob_client(self._name(key)).exists()

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        stream = self._download(key)
        return stream.readall(), stream.properties.etag

    def write_if(self, key: str, data: bytes, version: str | None) -> str:
        """The blob's ETag as the match condition (If-Match), or If-None-Match: * for a create."""
        from azure.core import MatchConditions  # lazy: azure extra
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        blob = self.container.get_blob_client(self._name(key))
        condition = ({"overwrite": False} if version is None else
                     {"overwrite": True, "etag": version, "match_condition": MatchConditions.IfNotModified})
        try:
            return blob.upload_blob(data, **condition)["etag"]
        except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError) as exc:
            raise Conflict(f"{self.uri}{key}: {type(exc).__name__}") from None


def open_store(uri: str) -> AzureBlobStore:
    from azure.storage.blob import BlobServiceClient  # lazy: azure extra

    account, container, prefix = parse_uri(uri)
    options = {"max_block_size": 8 * MiB, "max_single_put_size": 16 * MiB, "max_chunk_get_size": 8 * MiB}
    conn = connection_string(account)
    if conn:
        service = BlobServiceClient.from_connection_string(conn, **options)
    else:
        account = account or default_account()
        if not account:
            raise UsageError(f"checkpoint URI {uri!r}: az:// needs the storage account in AZURE_STORAGE_ACCOUNT "
                             "(or AZURE_STORAGE_CONNECTION_STRING)")
        service = BlobServiceClient(f"https://{account}{BLOB_HOST}", credential=credential(), **options)
    return AzureBlobStore(service.get_container_client(container), prefix, uri.rstrip("/") + "/")


# --- Job queue: Storage queues --------------------------------------------------------------------

QUEUE_HOST = ".queue.core.windows.net"
MAX_DELIVERIES = 5       # Azure Functions' default maxDequeueCount
VISIBILITY_S = 600       # hidden this long on receive; the bridge extends it while it holds a sweep's message
POLL_S = 2.0


def parse_url(url: str) -> tuple[str, str]:
    """(account, queue) from https://<account>.queue.core.windows.net/<queue>."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    queue = parsed.path.strip("/")
    if parsed.scheme != "https" or not host.endswith(QUEUE_HOST) or not queue or "/" in queue:
        raise UsageError(f"--queue-url: {url!r} is not an Azure Storage queue URL "
                         f"(https://<account>{QUEUE_HOST}/<queue>)")
    return host[: -len(QUEUE_HOST)], queue


def _client(account: str, queue: str):
    from azure.storage.queue import QueueClient, TextBase64DecodePolicy, TextBase64EncodePolicy  # lazy: azure extra

    policies = {"message_encode_policy": TextBase64EncodePolicy(),
                "message_decode_policy": TextBase64DecodePolicy()}
    conn = connection_string(account)
    if conn:
        return QueueClient.from_connection_string(conn, queue, **policies)
    return QueueClient(f"https://{account}{QUEUE_HOST}", queue, credential=credential(), **policies)


class AzureJobQueue(JobQueue):
    def __init__(self, url: str, *, visibility_s: int = VISIBILITY_S, max_deliveries: int = MAX_DELIVERIES,
                 poll_s: float = POLL_S):
        account, name = parse_url(url)
        self.url = url
        self.client = _client(account, name)
        self.poison_url = f"https://{account}{QUEUE_HOST}/{name}-poison"
        # a poison queue has none of its own: what is received there again and again stays there
        self.poison = None if name.endswith("-poison") else _client(account, f"{name}-poison")
        self.visibility_s = visibility_s
        self.max_deliveries = max_deliveries
        self.poll_s = poll_s
        self._receipts: dict[str, str] = {}  # message id -> current pop receipt
        self._lock = threading.Lock()

    def receive(self, wait_s: int) -> Message | None:
        deadline = time.monotonic() + wait_s
        while True:
            m = self.client.receive_message(visibility_timeout=self.visibility_s)
            if m is not None and self.poison is not None and m.dequeue_count > self.max_deliveries:
                self._to_poison(m)
                continue
            if m is not None:
                with self._lock:
                    self._receipts[m.id] = m.pop_receipt
                return Message(m.id, m.content, m.pop_receipt, m.dequeue_count)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(self.poll_s, left))

    def _to_poison(self, m) -> None:
        log.warning("message %s delivered %d times (max %d): moved to the poison queue",
                    m.id, m.dequeue_count, self.max_deliveries)
        self.poison.send_message(m.content)
        self.client.delete_message(m.id, m.pop_receipt)

    def extend(self, msg: Message, visibility_s: int) -> None:
        with self._lock:
            receipt = self._receipts.get(msg.id, msg.receipt)
            updated = self.client.update_message(msg.id, pop_receipt=receipt, visibility_timeout=int(visibility_s))
            self._receipts[msg.id] = updated.pop_receipt

    def release(self, msg: Message) -> None:
        self.extend(msg, 0)
        with self._lock:
            self._receipts.pop(msg.id, None)  # visible again: the next receive gets a new receipt

    def delete(self, msg: Message) -> None:
        from azure.core.exceptions import ResourceNotFoundError  # lazy: azure extra

        with self._lock:
            receipt = self._receipts.pop(msg.id, msg.receipt)
            try:
                self.client.delete_message(msg.id, receipt)
            except ResourceNotFoundError:
                pass  # already deleted

    def dead_letters(self) -> "AzureJobQueue | None":
        return None if self.poison is None else AzureJobQueue(self.poison_url, poll_s=self.poll_s)

    def dead_letter(self, msg: Message, reason: str) -> None:
        log.error("message %s: moved to the poison queue (%s)", msg.id, reason)
        self.poison.send_message(msg.body, time_to_live=-1)
        self.delete(msg)

    def send(self, body: str) -> str:
        return self.client.send_message(body, time_to_live=-1).id


# --- Stop notices: Scheduled Events ---------------------------------------------------------------

DEFAULT_BASE = "http://169.254.169.254"
SECRET_PATH = "/v1/secret"  # trainer.node.jobcreds.SECRET_PATH: a job's team's secret, read for it by the node
EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
VM_NAME = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
# Preempt: spot eviction (>= 30 s notice). Terminate: scale-in or delete (terminateNotificationProfile).
# Reboot/Redeploy: planned maintenance that kills the process. Freeze (a pause of seconds) is ignored.
STOP_EVENTS = frozenset({"Preempt", "Terminate", "Reboot", "Redeploy"})


class MetadataUnavailable(notices.MetadataUnavailable):
    """No Azure instance metadata service answers here."""


def stop_events(document: dict, vm_name: str | None) -> list[dict]:
    """The events of a Scheduled Events document that stop this VM (every stopping one if the name is unknown)."""
    return [e for e in document.get("Events", [])
            if e.get("EventType") in STOP_EVENTS and (vm_name is None or vm_name in e.get("Resources", []))]


class ScheduledEvents:
    """The metadata endpoints, over a proxy-free opener (the metadata service must never be proxied)."""

    def __init__(self, base_url: str = DEFAULT_BASE, timeout_s: float = 5.0):
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._vm_name: str | None = None

    def _request(self, path: str) -> bytes:
        req = urllib.request.Request(f"{self.base}{path}", headers={"Metadata": "true"})
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            raise MetadataUnavailable(f"{path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise MetadataUnavailable(f"no Azure metadata service at {self.base}: {exc}") from None

    def vm_name(self) -> str:
        if self._vm_name is None:
            self._vm_name = self._request(VM_NAME).decode().strip()
        return self._vm_name

    def stopping(self) -> list[dict]:
        """This VM's stopping events now listed."""
        return stop_events(json.loads(self._request(EVENTS)), self.vm_name() or None)


class ScheduledEventsWatcher(notices.NoticeWatcher):
    """The first Scheduled Event that stops this VM."""

    def __init__(self, notice, base_url: str = DEFAULT_BASE, interval_s: float = 2.0, max_backoff_s: float = 300.0):
        super().__init__(notice, interval_s, max_backoff_s, name="azure-scheduled-events")
        self.events = ScheduledEvents(base_url)

    def poll(self) -> str | None:
        events = self.events.stopping()
        if not events:
            return None
        return f"azure {events[0]['EventType']} not before {events[0].get('NotBefore') or 'now'}"


def start_watcher(notice, settings: dict, base_url: str = DEFAULT_BASE, interval_s: float = 2.0) -> ScheduledEventsWatcher:
    """Start the watcher (``settings``, node.json, is part of the ``trainer.loop.notices`` contract; unused here)."""
    return ScheduledEventsWatcher(notice, base_url=base_url, interval_s=interval_s).start()


def open_queue(url: str, region: str | None = None) -> AzureJobQueue:
    return AzureJobQueue(url)


# --- Node platform: Key Vault secrets and registry logins through the managed identity ---------------

IDENTITY_TOKEN = "/metadata/identity/oauth2/token?api-version=2018-02-01"
MANAGEMENT = "https://management.azure.com/"  # the resource an ACR token exchange takes a token for
KEY_VAULT = "https://vault.azure.net"
KEY_VAULT_API = "7.4"
REGISTRY_URL = "https://{host}"                 # the registry's token service (its login server)
VAULT_URL = "https://{vault}.vault.azure.net"   # a Key Vault's data plane
TOKEN_MARGIN_S = 300  # a cached identity token is fetched again this long before it expires


class IdentityUnavailable(Exception):
    """The metadata service gave no token of the node's managed identity."""


# A job's process on a node: its team's identity from the node's credentials endpoint (trainer.node.jobcreds), in
# the App Service managed-identity protocol azure-identity reads (set by the TaskProlog).
IDENTITY_ENDPOINT, IDENTITY_HEADER = "IDENTITY_ENDPOINT", "IDENTITY_HEADER"
JOB_RESOURCES = ("https://storage.azure.com/", MANAGEMENT)  # what a job's team identity is asked tokens for


def job_endpoint(environ=os.environ) -> tuple[str, str] | None:
    """(endpoint, header) where the TaskProlog gave this process its job's endpoint, which is on loopback; another
    (a Service Fabric host's) is left to azure-identity."""
    url, header = environ.get(IDENTITY_ENDPOINT), environ.get(IDENTITY_HEADER)
    loopback = (url or "").startswith("http://") and urllib.parse.urlsplit(url).hostname in ("127.0.0.1", "::1")
    return (url, header) if loopback and header else None


class ManagedIdentity:
    """Tokens of the node's user-assigned managed identity (node.json azure.client_id) from the instance
    metadata service, or, in a job's process, of its team's identity from the node's credentials endpoint
    (``job_endpoint``), cached per resource until TOKEN_MARGIN_S before they expire."""

    def __init__(self, client_id: str | None, base_url: str = DEFAULT_BASE, timeout_s: float = 5.0,
                 environ=os.environ):
        self.client_id, self.base, self.timeout_s = client_id, base_url.rstrip("/"), timeout_s
        self.job = job_endpoint(environ)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never proxied
        self._tokens: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def _request(self, resource: str) -> urllib.request.Request:
        if self.job:
            url, header = self.job
            query = urllib.parse.urlencode({"api-version": "2019-08-01", "resource": resource})
            return urllib.request.Request(f"{url}?{query}", headers={"X-IDENTITY-HEADER": header})
        query = urllib.parse.urlencode({"resource": resource, **({"client_id": self.client_id}
                                                                  if self.client_id else {})})
        return urllib.request.Request(f"{self.base}{IDENTITY_TOKEN}&{query}", headers={"Metadata": "true"})

    def token(self, resource: str) -> tuple[str, float]:
        """(access token, expiry in epoch seconds) for ``resource``."""
        with self._lock:
            cached = self._tokens.get(resource)
            if cached and cached[1] - time.time() > TOKEN_MARGIN_S:
                return cached
            req = self._request(resource)
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    doc = json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                raise IdentityUnavailable(f"HTTP {exc.code} {_error_text(exc)}".strip()) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                where = self.job[0] if self.job else self.base
                raise IdentityUnavailable(f"no identity endpoint answers at {where}: {exc}") from None
            token = doc["access_token"], float(doc.get("expires_on") or time.time() + 3600)
            self._tokens[resource] = token
            return token


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The error of an Azure JSON error body (`error_description`, `error.message` or `error`), short."""
    try:
        doc = json.loads(exc.read() or b"{}")
    except ValueError:
        return ""
    err = doc.get("error")
    text = (doc.get("error_description") or (err.get("message") if isinstance(err, dict) else err)
            or doc.get("message") or "")
    return str(text).splitlines()[0][:200] if text else ""


class NodePlatform(Platform):
    """A node VM: Key Vault secrets and registry logins come through its managed identity (tokens from the
    metadata service at ``base_url``); ``registry_url`` and ``vault_url`` are the services' URL templates (tests
    point them at fakes on loopback)."""

    name = "azure"

    def __init__(self, node: dict, base_url: str = DEFAULT_BASE, registry_url: str = REGISTRY_URL,
                 vault_url: str = VAULT_URL):
        self.node, self.base_url = node, base_url
        self.registry_url, self.vault_url = registry_url, vault_url
        self.identity = ManagedIdentity((node.get("azure") or {}).get("client_id"), base_url)
        self._logins = LoginCache()

    def secret(self, source: str, name: str) -> str:
        """A secret of the stack's Key Vault (node.json azure.key_vault), read with the node's identity
        (role Key Vault Secrets User on the vault) over the vault's REST API; in a job's process, asked of the
        node's credentials endpoint, which reads only the job's team's (``<team>-...``)."""
        if source != "keyvault":
            return super().secret(source, name)
        what = f"env: keyvault:{name}"
        if self.identity.job:
            return self._job_secret(name, what)
        vault = (self.node.get("azure") or {}).get("key_vault")
        if not vault:
            raise UsageError(f"{what}: node.json names no Key Vault (azure.key_vault); the stack's user-data "
                             "writes it on cluster nodes")
        try:
            token = self.identity.token(KEY_VAULT)[0]
        except IdentityUnavailable as exc:
            raise UsageError(f"{what}: no token of the node's managed identity ({exc}); check the scale set's "
                             "user-assigned identity and node.json azure.client_id") from None
        url = f"{self.vault_url.format(vault=vault)}/secrets/{urllib.parse.quote(name)}?api-version={KEY_VAULT_API}"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                hint = f"no secret {name!r} in Key Vault {vault}; create it there (az keyvault secret set)"
            elif exc.code in (401, 403):
                hint = (f"the node's identity may not read secrets of Key Vault {vault}; it needs the role "
                        "Key Vault Secrets User on the vault")
            else:
                hint = f"Key Vault {vault} refused the read"
            raise UsageError(f"{what}: HTTP {exc.code}: {hint}") from None
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise UsageError(f"{what}: cannot read it from Key Vault {vault} ({exc}); check the vault's private "
                             "endpoint and DNS from this node") from None

    def _job_secret(self, name: str, what: str) -> str:
        url, header = self.identity.job
        query = urllib.parse.urlencode({"name": name})
        parts = urllib.parse.urlsplit(url)
        req = urllib.request.Request(f"{parts.scheme}://{parts.netloc}{SECRET_PATH}?{query}",
                                     headers={"X-IDENTITY-HEADER": header})
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=20) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            raise UsageError(f"{what}: the node refused it (HTTP {exc.code}: {_error_text(exc) or 'refused'}); a "
                             "job reads only its team's Key Vault secrets, named <team>-...") from None
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise UsageError(f"{what}: the node's credentials endpoint does not answer ({exc})") from None

    def registry_login(self, image: str):
        """An ACR refresh token for an image on `<registry>.azurecr.io`: the identity's token for Azure Resource
        Manager exchanged at the registry's `/oauth2/exchange` (what `az acr login` does), docker user
        00000000-0000-0000-0000-000000000000; cached until shortly before the token expires."""
        host = image_host(image)
        if not is_acr(host):
            return None

        def fetch() -> RegistryLogin:
            try:
                aad, expires = self.identity.token(MANAGEMENT)
            except IdentityUnavailable as exc:
                raise UsageError(f"registry {host}: no token of the node's managed identity ({exc}); check the "
                                 "scale set's user-assigned identity and node.json azure.client_id") from None
            body = urllib.parse.urlencode({"grant_type": "access_token", "service": host,
                                           "access_token": aad}).encode()
            req = urllib.request.Request(f"{self.registry_url.format(host=host)}/oauth2/exchange", data=body,
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    refresh = json.loads(resp.read())["refresh_token"]
            except urllib.error.HTTPError as exc:
                raise UsageError(f"registry {host}: the token exchange was refused (HTTP {exc.code} "
                                 f"{_error_text(exc)}); the node's identity needs AcrPull on the registry") from None
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                raise UsageError(f"registry {host}: token exchange failed ({exc}); check the registry's private "
                                 "endpoint and DNS from this node") from None
            return RegistryLogin(host, ACR_USER, refresh, jwt_expiry(refresh) or expires)

        return self._logins.get(host, fetch)


# --- A job's own identity (trainer.node.jobcreds serves it) -------------------------------------------------

class TeamIdentityIssuer:
    """On a node (root, which alone reaches the metadata service): tokens of a job's team's user-assigned managed
    identity (node.json ``azure.team_client_ids``; the stack holds each to its team's prefix of the container by
    an ABAC condition and gives it AcrPull), for the resources a job needs (JOB_RESOURCES) and no other; and the
    job's team's Key Vault secrets (``<team>-...``, never the munge key), read with the node's own identity, since
    a Key Vault role cannot be held to a name prefix. Azure offers no narrower token than an identity's: a job's
    token reaches its whole team's prefix, not its own job's (docs/jobs.md)."""

    def __init__(self, team_client_ids: dict[str, str], node: dict, base_url: str = DEFAULT_BASE,
                 platform: "NodePlatform | None" = None):
        self.identities = {team: ManagedIdentity(cid, base_url, environ={}) for team, cid in team_client_ids.items()}
        self.client_ids = dict(team_client_ids)
        self.platform = platform or NodePlatform(node, base_url)
        munge = str((node.get("slurm") or {}).get("munge") or "")
        self.munge = urllib.parse.urlsplit(munge).path.split("/")[2] if munge.count("/") >= 4 else None

    def __call__(self, team: str, job_id: str, session: str, resource: str) -> tuple[dict, float]:
        from trainer.node.jobcreds import Denied  # lazy: jobcreds imports the cloud registry, which imports this

        allowed = {r.rstrip("/") for r in JOB_RESOURCES}
        if resource.rstrip("/") not in allowed:
            raise Denied(403, f"a job's identity is given tokens for {', '.join(sorted(allowed))} only, not "
                              f"{resource}")
        if team not in self.identities:
            raise Denied(403, f"team {team} has no identity on this node (node.json azure.team_client_ids)")
        try:
            token, expires = self.identities[team].token(resource)
        except IdentityUnavailable as exc:
            raise Denied(502, f"no token of team {team}'s identity: {exc}") from None
        return ({"access_token": token, "expires_on": str(int(expires)), "resource": resource,
                 "token_type": "Bearer", "client_id": self.client_ids[team]}, expires)

    def secret(self, team: str, name: str) -> str:
        from trainer.node.jobcreds import Denied  # lazy: see __call__

        if not name.startswith(f"{team}-") or name == self.munge:
            raise Denied(403, f"secret {name!r}: a job of team {team} reads only its team's, named {team}-...")
        try:
            return self.platform.secret("keyvault", name)
        except UsageError as exc:
            raise Denied(404, str(exc)) from None


def job_issuer(settings: dict) -> TeamIdentityIssuer:
    """The issuer of a node whose node.json has ``azure.team_client_ids`` (infra.azure.stack)."""
    ids = (settings.get("azure") or {}).get("team_client_ids") or {}
    if not ids:
        raise UsageError("credentials serve: no team identities: run on a node whose node.json has "
                         "azure.team_client_ids")
    return TeamIdentityIssuer(ids, settings)


def instance_facts() -> dict[str, str]:
    """Nothing: a job's process on Azure asks the metadata service for nothing (its metrics carry the group)."""
    return {}
