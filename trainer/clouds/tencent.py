"""Tencent Cloud: COS checkpoints through the S3 store, the TDMQ CMQ job queue, the spot reclamation watcher and
the node platform (the instance type; no secrets or registry logins through the node's identity yet). Slurm's node
provider, node name and munge key build on it (trainer.clouds.tencent_nodes).

The machine's settings are /etc/gpufleet/node.json on a GPU node, else /etc/gpufleet/controller.json on the Slurm
controller (which has no node.json); both name the cloud, the region and, under ``tencent``, the machine's CAM role.
Credentials, first found: a key in the environment (``TENCENTCLOUD_SECRET_ID``/``_SECRET_KEY``/
``_SESSION_TOKEN``, the SDK's and CLI's names), else a job's own key from its node's credentials endpoint (where
the TaskProlog set ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` and its token: trainer.node.jobcreds), else, on a
Tencent machine of the stack (its settings say so) or where ``TENCENTCLOUD_METADATA_ENDPOINT`` points at a metadata
service, the temporary key of the machine's CAM role from the metadata service (which answers only root on a
node), fetched again before it expires. Nowhere else is a metadata address contacted.
The region is ``TENCENTCLOUD_REGION`` (the CLI's) or the settings'.

COS (``cos://<bucket>-<appid>/prefix``): the S3 store over COS's S3-compatible endpoint
``https://cos.<region>.myqcloud.com`` (virtual-hosted addressing, SigV4 with the temporary key and its
token); boto3's own ``AWS_ENDPOINT_URL`` points it at an S3 emulator instead, as for s3://.

TDMQ CMQ (``http://<region code>.mqadapter.cmq.tencentyun.com/<queue>``, the private endpoint, or the
public ``https://cmq-<code>.public.tencenttdmq.com/<queue>``), differences from SQS handled here:
- No per-message visibility change: a received message stays hidden for the queue's visibilityTimeout, so
  ``extend`` has nothing to do (the bridge holds a sweep's message far less than that).
- ``release`` sends a copy and deletes the received message: visible at once, with a fresh retention and
  receive count.
- ``dead_letter`` sends the message to ``<queue>-dead`` and deletes it here. A receiver that dies without a word
  leaves the message to CMQ: visible again after the visibility timeout, and CMQ's own dead-letter policy
  (maxReceiveCount) counts those receives.

Spot reclamation: ``meta-data/spot/termination-time`` answers the reclaim time (UTC+8, e.g.
``2018-08-18 12:05:33``) once the instance is marked, 404 before; the documentation gives no lead time.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from urllib.parse import urlparse

from trainer.clouds.s3store import S3Store
from trainer.clouds.tencent_credentials import JobRoleIssuer, bucket_of
from trainer.clouds.tencent_api import (METADATA_ENDPOINT, Api, ApiError, Cmq, Metadata, MetadataUnavailable,
                                        RoleCredentials, StaticCredentials, endpoint_credentials, env_credentials)
from trainer.errors import Fault, UsageError
from trainer.jobs.queue import JobQueue, Message
from trainer.loop.notices import NoticeWatcher
from trainer.node.platform import Platform

log = logging.getLogger("gpufleet.tencent")

NODE_JSON = "/etc/gpufleet/node.json"
CONTROLLER_JSON = "/etc/gpufleet/controller.json"   # the Slurm controller's (trainer.node.node_schema)
REGION = "TENCENTCLOUD_REGION"
SPOT = "meta-data/spot/termination-time"
INSTANCE_TYPE = "meta-data/instance/instance-type"
INSTANCE_ID = "meta-data/instance-id"
NO_MESSAGE = 7000          # CMQ: the queue has no message to hand out
DEAD_SUFFIX = "-dead"


def node_settings() -> dict:
    """This machine's settings: node.json on a GPU node, else controller.json on the controller, else {}."""
    for path in (NODE_JSON, CONTROLLER_JSON):
        try:
            settings = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(settings, dict):
            return settings
    return {}


def credentials(settings: dict | None = None, environ=os.environ):
    """The credential provider (``.get()`` -> Credentials) of this process; see the module docstring."""
    found = env_credentials(environ)
    if found:
        return StaticCredentials(found)
    job = endpoint_credentials(environ)
    if job:  # a job's process on a node: its own key (trainer.node.jobcreds), never the node's
        return job
    settings = node_settings() if settings is None else settings
    if settings.get("cloud") == "tencent" or environ.get(METADATA_ENDPOINT):
        return RoleCredentials(Metadata(), (settings.get("tencent") or {}).get("role_name"))
    raise UsageError("no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY, "
                     "or run on a node or the controller of the stack (its CAM role)")


# API errors that are the user's setup (a key or a role without the right), not a fault of the service.
SETUP_CODES = ("AuthFailure", "UnauthorizedOperation")


def explain(exc: BaseException) -> UsageError | Fault | None:
    """A Tencent Cloud API error or an unreachable metadata service in one line (trainer.clouds.explain)."""
    if isinstance(exc, ApiError):
        code = str(exc.code)
        if code.split(".")[0] in SETUP_CODES:
            return UsageError(f"Tencent Cloud refused the request ({exc}); check the key or the CAM role's policy")
        return Fault(f"Tencent Cloud API error: {exc}")
    if isinstance(exc, MetadataUnavailable):
        return Fault(f"the Tencent metadata service does not answer ({exc}); on a laptop, set "
                     "TENCENTCLOUD_SECRET_ID/TENCENTCLOUD_SECRET_KEY")
    return None


def region_of(settings: dict | None = None, environ=os.environ) -> str:
    settings = node_settings() if settings is None else settings
    region = environ.get(REGION) or settings.get("region")
    if not region:
        raise UsageError(f"no Tencent Cloud region: set {REGION} (e.g. ap-shanghai) or run on a node or the "
                         "controller of the stack")
    return region


# --- Checkpoint store: COS through its S3-compatible endpoint ---------------------------------------

def cos_endpoint(region: str) -> str:
    return f"https://cos.{region}.myqcloud.com"


def _botocore_credentials(provider):
    """The provider's key as botocore credentials: refreshable when it expires (a CAM role's)."""
    from botocore.credentials import Credentials as Fixed, RefreshableCredentials  # lazy: boto3 only for the COS store

    def metadata() -> dict:
        c = provider.get()
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.expires_at))
        return {"access_key": c.secret_id, "secret_key": c.secret_key, "token": c.token or None, "expiry_time": expiry}

    first = provider.get()
    if first.expires_at is None:
        return Fixed(first.secret_id, first.secret_key, first.token or None)
    return RefreshableCredentials.create_from_metadata(metadata(), metadata, "tencent-cam-role")


def cos_client(region: str, provider):
    """A boto3 S3 client for COS (or the emulator boto3's AWS_ENDPOINT_URL names) with the Tencent key."""
    import boto3  # lazy: boto3 only for the COS store
    import botocore.session
    from botocore.config import Config

    from botocore.credentials import CredentialProvider

    class TencentKey(CredentialProvider):
        METHOD = CANONICAL_NAME = "tencent"

        def load(self):
            return _botocore_credentials(provider)

    emulated = bool(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    session = botocore.session.get_session()
    session.get_component("credential_provider").insert_before("env", TencentKey())
    config = Config(retries={"mode": "standard", "total_max_attempts": 10}, max_pool_connections=32,
                    signature_version="s3v4", s3={"addressing_style": "path" if emulated else "virtual"})
    return boto3.Session(botocore_session=session).client(
        "s3", region_name=region, endpoint_url=None if emulated else cos_endpoint(region), config=config)


def open_store(uri: str):
    """cos://<bucket>-<appid>/prefix."""
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise UsageError(f"checkpoint URI {uri!r}: missing bucket; expected cos://<bucket>-<appid>/prefix")
    settings = node_settings()
    store = S3Store(parsed.netloc, parsed.path, client=cos_client(region_of(settings), credentials(settings)))
    store.uri = f"cos://{parsed.netloc}/{store.prefix}"
    store.conditional = False  # COS documents no If-Match on PUT Object: job records are last-writer-wins here
    return store


# --- Job queue: TDMQ CMQ ----------------------------------------------------------------------------

def parse_queue_url(url: str) -> tuple[str, str]:
    """(endpoint, queue) from ``http(s)://<host>/<queue>``."""
    parsed = urlparse(url)
    queue = parsed.path.strip("/")
    if parsed.scheme not in ("http", "https") or not parsed.netloc or not queue or "/" in queue:
        raise UsageError(f"--queue-url: {url!r} is not a TDMQ CMQ queue URL "
                         "(http://<region code>.mqadapter.cmq.tencentyun.com/<queue>)")
    return f"{parsed.scheme}://{parsed.netloc}", queue


class CmqJobQueue(JobQueue):
    def __init__(self, url: str, region: str | None = None, credentials_provider=None):
        endpoint, self.queue = parse_queue_url(url)
        self.url = url
        self.dead_letter_queue = self.queue + DEAD_SUFFIX
        self.endpoint = endpoint
        self.cmq = Cmq(endpoint, credentials_provider or credentials())

    def receive(self, wait_s: int) -> Message | None:
        try:
            m = self.cmq.call("ReceiveMessage", {"queueName": self.queue, "pollingWaitSeconds": wait_s},
                              wait_s=wait_s)
        except ApiError as exc:
            if exc.code == NO_MESSAGE:
                return None
            raise
        return Message(m["msgId"], m["msgBody"], m["receiptHandle"], max(1, int(m.get("dequeueCount") or 1)))

    def extend(self, msg: Message, visibility_s: int) -> None:
        """CMQ keeps a received message hidden for the queue's visibility timeout; only a release (0) changes
        anything."""
        if visibility_s <= 0:
            self.release(msg)

    def _resend(self, msg: Message, queue: str | None = None) -> None:
        """Send the job again (to ``queue``, default this one), then delete the received copy."""
        self.cmq.call("SendMessage", {"queueName": queue or self.queue, "msgBody": msg.body})
        self.delete(msg)

    def release(self, msg: Message) -> None:
        """Visible again at once: a new copy."""
        self._resend(msg)

    def dead_letters(self) -> "CmqJobQueue":
        return CmqJobQueue(f"{self.endpoint}/{self.dead_letter_queue}", credentials_provider=self.cmq.credentials)

    def dead_letter(self, msg: Message, reason: str) -> None:
        log.error("message %s: moved to %s (%s)", msg.id, self.dead_letter_queue, reason)
        self._resend(msg, self.dead_letter_queue)

    def delete(self, msg: Message) -> None:
        self.cmq.call("DeleteMessage", {"queueName": self.queue, "receiptHandle": msg.receipt})

    def send(self, body: str) -> str:
        return self.cmq.call("SendMessage", {"queueName": self.queue, "msgBody": body})["msgId"]


def open_queue(url: str, region: str | None = None) -> CmqJobQueue:
    return CmqJobQueue(url, region)


# --- Spot reclamation watcher -----------------------------------------------------------------------

def reclamation(termination_time: str | None) -> str | None:
    if termination_time and termination_time.strip():
        return f"spot reclamation at {termination_time.strip()} (UTC+8)"
    return None


class SpotWatcher(NoticeWatcher):
    """The spot termination time."""

    def __init__(self, notice, metadata: Metadata | None = None, interval_s: float = 2.0,
                 max_backoff_s: float = 300.0):
        super().__init__(notice, interval_s, max_backoff_s, name="tencent-spot-watcher")
        self.metadata = metadata or Metadata()

    def poll(self) -> str | None:
        return reclamation(self.metadata.get(SPOT))


def start_watcher(notice, settings: dict, interval_s: float = 2.0) -> SpotWatcher:
    return SpotWatcher(notice, interval_s=interval_s).start()


# --- A job's own key -----------------------------------------------------------------------------

def job_issuer(settings: dict, api: Api | None = None):
    """The issuer of a node whose node.json has ``tencent.job_role_arn`` and ``tencent.bucket`` (infra.tencent): STS
    with the node's own CAM role (trainer.clouds.tencent_credentials)."""
    own = settings.get("tencent") or {}
    api = api or Api(credentials(settings), settings["region"])
    return JobRoleIssuer(own["job_role_arn"], bucket_of(own["bucket"]), settings["region"], own["app_id"], api)


def instance_facts(metadata: Metadata | None = None) -> dict[str, str]:
    """What a job may know of its instance (id and type; nothing secret), which root's credentials endpoint
    publishes for jobs (trainer.node.jobcreds.INSTANCE), since the metadata service answers only root."""
    metadata = metadata or Metadata()
    try:
        return {k: v for k, v in (("instance_id", metadata.get(INSTANCE_ID)),
                                  ("instance_type", metadata.get(INSTANCE_TYPE))) if v}
    except MetadataUnavailable:
        return {}


# --- Node platform ----------------------------------------------------------------------------------

class NodePlatform(Platform):
    """This CVM: its instance type, from what root published for jobs (trainer.node.jobcreds.INSTANCE) or else the
    metadata service (secrets and registry logins are the base class's: none)."""

    name = "tencent"

    def __init__(self, node: dict, metadata: Metadata | None = None):
        self.node, self.metadata = node, metadata or Metadata()

    def instance_type(self) -> str | None:
        from trainer.node import jobcreds  # lazy: the node's side only

        try:
            known = json.loads(Path(jobcreds.INSTANCE).read_text())
        except (OSError, ValueError):
            known = {}
        if known.get("instance_type"):
            return known["instance_type"]
        try:
            return self.metadata.get(INSTANCE_TYPE)
        except MetadataUnavailable:
            return None
