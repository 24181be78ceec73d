"""Tencent Cloud: COS checkpoints through the S3 store, the TDMQ CMQ job queue, the spot reclamation watcher,
and the node platform (its Auto Scaling group: scale-in protection, lifecycle hooks).

Credentials, first found: a key in the environment (``TENCENTCLOUD_SECRET_ID``/``_SECRET_KEY``/
``_SESSION_TOKEN``, the SDK's and CLI's names), else, on a Tencent node (node.json says so) or where
``TENCENTCLOUD_METADATA_ENDPOINT`` points at a metadata service, the temporary key of the node's CAM role
from the metadata service, fetched again before it expires. Nowhere else is a metadata address contacted.
The region is ``TENCENTCLOUD_REGION`` (the CLI's) or node.json's.

COS (``cos://<bucket>-<appid>/prefix``): the S3 store over COS's S3-compatible endpoint
``https://cos.<region>.myqcloud.com`` (virtual-hosted addressing, SigV4 with the temporary key and its
token); boto3's own ``AWS_ENDPOINT_URL`` points it at an S3 emulator instead, as for s3://.

TDMQ CMQ (``http://<region code>.mqadapter.cmq.tencentyun.com/<queue>``, the private endpoint, or the
public ``https://cmq-<code>.public.tencenttdmq.com/<queue>``), differences from SQS handled here:
- No per-message visibility change: a received message stays hidden for the queue's visibilityTimeout,
  and CMQ keeps any message at most msgRetentionSeconds from its last send. The earlier of the two is the
  message's deadline; the agent hands a running job back (with a checkpoint) before it, and ``extend`` has
  nothing to do inside it.
- Hand-back (``release``) sends a copy and deletes the received message: visible at once, with a fresh
  retention and receive count, so hand-backs never count as failures.
- A real failure (``fail``) hands the job back with its failure count in an envelope the queue reads
  (``{"gpufleet": 1, "failures": n, "body": ...}``); at ``max_failures`` it goes to the dead-letter queue
  ``<queue>-dead`` instead. A node that dies without a word leaves the message to CMQ: visible again after
  the visibility timeout, and CMQ's own dead-letter policy (maxReceiveCount) counts those receives.

Spot reclamation: ``meta-data/spot/termination-time`` answers the reclaim time (UTC+8, e.g.
``2018-08-18 12:05:33``) once the instance is marked, 404 before; the documentation gives no lead time.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from trainer.clouds.tencent_api import (METADATA_ENDPOINT, Api, ApiError, Cmq, Metadata, MetadataUnavailable,
                                        RoleCredentials, StaticCredentials, env_credentials)
from trainer.errors import UsageError
from trainer.jobs.queue import JobQueue, Message
from trainer.loop.notices import poll_with_backoff
from trainer.node.platform import Platform

log = logging.getLogger("gpufleet.tencent")

NODE_JSON = "/etc/gpufleet/node.json"
REGION = "TENCENTCLOUD_REGION"
SPOT = "meta-data/spot/termination-time"
INSTANCE_ID = "meta-data/instance-id"
INSTANCE_TYPE = "meta-data/instance/instance-type"
AS_VERSION = "2018-04-19"
NO_MESSAGE = 7000          # CMQ: the queue has no message to hand out
MAX_FAILURES = 3           # real failures before the dead-letter queue (as the stack's maxReceiveCount)
DEAD_SUFFIX = "-dead"


def node_settings() -> dict:
    try:
        return json.loads(Path(NODE_JSON).read_text())
    except (OSError, ValueError):
        return {}


def credentials(settings: dict | None = None, environ=os.environ):
    """The credential provider (``.get()`` -> Credentials) of this process; see the module docstring."""
    found = env_credentials(environ)
    if found:
        return StaticCredentials(found)
    settings = node_settings() if settings is None else settings
    if settings.get("cloud") == "tencent" or environ.get(METADATA_ENDPOINT):
        return RoleCredentials(Metadata(), (settings.get("tencent") or {}).get("role_name"))
    raise UsageError("no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY, "
                     "or run on a node of the stack (its CAM role)")


def region_of(settings: dict | None = None, environ=os.environ) -> str:
    settings = node_settings() if settings is None else settings
    region = environ.get(REGION) or settings.get("region")
    if not region:
        raise UsageError(f"no Tencent Cloud region: set {REGION} (e.g. ap-shanghai) or run on a node of the stack")
    return region


# --- Checkpoint store: COS through its S3-compatible endpoint ---------------------------------------

def cos_endpoint(region: str) -> str:
    return f"https://cos.{region}.myqcloud.com"


def _botocore_credentials(provider):
    """The provider's key as botocore credentials: refreshable when it expires (a CAM role's)."""
    from botocore.credentials import Credentials as Fixed, RefreshableCredentials

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
    import boto3
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
    from trainer.clouds.aws import S3Store

    parsed = urlparse(uri)
    if not parsed.netloc:
        raise UsageError(f"checkpoint URI {uri!r}: missing bucket; expected cos://<bucket>-<appid>/prefix")
    settings = node_settings()
    store = S3Store(parsed.netloc, parsed.path, client=cos_client(region_of(settings), credentials(settings)))
    store.uri = f"cos://{parsed.netloc}/{store.prefix}"
    store.conditional = False  # COS documents no If-Match on PUT Object: job records are last-writer-wins here
    # COS's S3 API documents no If-None-Match on PUT Object, and its own x-cos-forbid-overwrite has no effect on
    # a bucket that has ever had versioning on (the stack's bucket has): the checkpoint lease (trainer.loop.lease)
    # is taken with a look then a write there, so two runners starting within the same moment are not told apart.
    store.conditional_create = False
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


def wrap(body: str, failures: int) -> str:
    """The message body the queue sends: the job itself, or the envelope that carries its failure count."""
    return body if failures == 0 else json.dumps({"gpufleet": 1, "failures": failures, "body": body})


def unwrap(text: str) -> tuple[str, int]:
    """(job body, failures so far) of a received message body."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text, 0
    if isinstance(doc, dict) and set(doc) == {"gpufleet", "failures", "body"} and isinstance(doc["body"], str):
        return doc["body"], int(doc["failures"])
    return text, 0


class CmqJobQueue(JobQueue):
    def __init__(self, url: str, region: str | None = None, credentials_provider=None,
                 max_failures: int = MAX_FAILURES):
        endpoint, self.queue = parse_queue_url(url)
        self.url = url
        self.dead_letter_queue = self.queue + DEAD_SUFFIX
        self.endpoint = endpoint
        self.cmq = Cmq(endpoint, credentials_provider or credentials())
        self.max_failures = max_failures
        self._attributes: dict | None = None
        self._failures: dict[str, int] = {}   # receipt -> failures carried by the message's envelope
        self._lock = threading.Lock()

    def attributes(self) -> dict:
        if self._attributes is None:
            self._attributes = self.cmq.call("GetQueueAttributes", {"queueName": self.queue})
        return self._attributes

    @property
    def max_in_flight_s(self) -> float:
        return float(self.attributes()["visibilityTimeout"])

    def receive(self, wait_s: int) -> Message | None:
        try:
            m = self.cmq.call("ReceiveMessage", {"queueName": self.queue, "pollingWaitSeconds": wait_s},
                              wait_s=wait_s)
        except ApiError as exc:
            if exc.code == NO_MESSAGE:
                return None
            raise
        body, failures = unwrap(m["msgBody"])
        retention_end = int(m["enqueueTime"]) + int(self.attributes()["msgRetentionSeconds"])
        deadline = min(int(m["nextVisibleTime"]), retention_end)
        with self._lock:
            self._failures[m["receiptHandle"]] = failures
        # The agent's in-flight cap is received_at + max_in_flight_s: make that this message's deadline.
        return Message(m["msgId"], body, m["receiptHandle"], failures + max(1, int(m.get("dequeueCount") or 1)),
                       received_at=deadline - self.max_in_flight_s)

    def extend(self, msg: Message, visibility_s: int) -> None:
        """CMQ keeps a received message hidden until its deadline; only a release (0) changes anything."""
        if visibility_s <= 0:
            self.release(msg)

    def _resend(self, msg: Message, failures: int, queue: str | None = None) -> None:
        """Send the job again (to ``queue``, default this one), then delete the received copy."""
        self.cmq.call("SendMessage", {"queueName": queue or self.queue, "msgBody": wrap(msg.body, failures)})
        self.delete(msg)

    def release(self, msg: Message) -> None:
        """Hand the job back at once: a new copy, the same failure count."""
        with self._lock:
            failures = self._failures.get(msg.receipt, 0)
        self._resend(msg, failures)

    def fail(self, msg: Message) -> None:
        """A real failure: back in the queue at once with one more failure, or dead-lettered at max_failures."""
        with self._lock:
            failures = self._failures.get(msg.receipt, 0) + 1
        if failures >= self.max_failures:
            log.error("message %s failed %d times: moved to %s", msg.id, failures, self.dead_letter_queue)
            self._resend(msg, 0, self.dead_letter_queue)
        else:
            self._resend(msg, failures)

    def dead_letters(self) -> "CmqJobQueue":
        return CmqJobQueue(f"{self.endpoint}/{self.dead_letter_queue}", credentials_provider=self.cmq.credentials)

    def dead_letter(self, msg: Message, reason: str) -> None:
        log.error("message %s: moved to %s (%s)", msg.id, self.dead_letter_queue, reason)
        self._resend(msg, 0, self.dead_letter_queue)

    def delete(self, msg: Message) -> None:
        self.cmq.call("DeleteMessage", {"queueName": self.queue, "receiptHandle": msg.receipt})
        with self._lock:
            self._failures.pop(msg.receipt, None)

    def send(self, body: str) -> str:
        return self.cmq.call("SendMessage", {"queueName": self.queue, "msgBody": body})["msgId"]


def open_queue(url: str, region: str | None = None) -> CmqJobQueue:
    return CmqJobQueue(url, region)


# --- Spot reclamation watcher -----------------------------------------------------------------------

def reclamation(termination_time: str | None) -> str | None:
    if termination_time and termination_time.strip():
        return f"spot reclamation at {termination_time.strip()} (UTC+8)"
    return None


class SpotWatcher(threading.Thread):
    """Polls the spot termination time every ``interval_s`` and sets ``notice`` once it appears."""

    def __init__(self, notice, metadata: Metadata | None = None, interval_s: float = 2.0,
                 max_backoff_s: float = 300.0):
        super().__init__(name="tencent-spot-watcher", daemon=True)
        self.notice, self.metadata = notice, metadata or Metadata()
        self.interval_s, self.max_backoff_s = interval_s, max_backoff_s
        self.stopped = threading.Event()

    def poll(self) -> str | None:
        reason = reclamation(self.metadata.get(SPOT))
        if reason and not self.notice.is_set():
            log.warning("stop notice: %s", reason)
            self.notice.set(reason)
        return reason

    def run(self) -> None:
        poll_with_backoff(self.poll, MetadataUnavailable, self.stopped, self.interval_s, self.max_backoff_s,
                          done=self.notice.is_set)


def start_watcher(notice, settings: dict, interval_s: float = 2.0) -> SpotWatcher:
    watcher = SpotWatcher(notice, interval_s=interval_s)
    watcher.start()
    return watcher


# --- Node platform: the Auto Scaling group ---------------------------------------------------------

class NodePlatform(Platform):
    """This CVM in its scaling group: scale-in protection and lifecycle actions through the AS API 3.0 with
    the node role's key. Gang mode is not run on Tencent (the base class refuses it)."""

    name = "tencent"

    def __init__(self, node: dict, metadata: Metadata | None = None, api: Api | None = None):
        self.node, self.metadata = node, metadata or Metadata()
        self._api = api
        self._group: str | None = None
        self.instance_id = None
        try:
            self.instance_id = self.metadata.get(INSTANCE_ID)
        except MetadataUnavailable:
            log.info("no Tencent metadata: no scale-in protection or lifecycle actions")

    def api(self) -> Api:
        if self._api is None:
            self._api = Api(credentials(self.node), region_of(self.node))
        return self._api

    def _as(self, action: str, params: dict) -> dict:
        return self.api().call("as", AS_VERSION, action, params)

    def group_id(self) -> str | None:
        if self._group is None and self.instance_id:
            found = self._as("DescribeAutoScalingInstances", {"InstanceIds": [self.instance_id]})
            rows = found.get("AutoScalingInstanceSet") or []
            self._group = rows[0]["AutoScalingGroupId"] if rows else None
        return self._group

    def _hook_id(self, name: str | None) -> str | None:
        group = self.group_id()
        if not (group and name):
            return None
        hooks = self._as("DescribeLifecycleHooks", {"Filters": [
            {"Name": "auto-scaling-group-id", "Values": [group]}, {"Name": "lifecycle-hook-name", "Values": [name]}]})
        rows = hooks.get("LifecycleHookSet") or []
        return rows[0]["LifecycleHookId"] if rows else None

    def _complete(self, hook: str | None, result: str) -> str:
        hook_id = self._hook_id(hook)
        if not hook_id:
            return f"no lifecycle hook {hook!r} in this node's group"
        self._as("CompleteLifecycleAction", {"LifecycleHookId": hook_id, "InstanceId": self.instance_id,
                                             "LifecycleActionResult": result})
        return f"lifecycle hook {hook}: {result}"

    def protect(self, on: bool) -> None:
        if not self.instance_id:
            return
        try:
            group = self.group_id()
            if group:
                self._as("SetInstancesProtection", {"AutoScalingGroupId": group, "InstanceIds": [self.instance_id],
                                                    "ProtectedFromScaleIn": on})
        except (ApiError, OSError) as exc:
            log.warning("scale-in protection %s for %s failed: %s", "on" if on else "off", self.instance_id, exc)

    def going_away(self) -> str | None:
        if not self.instance_id:
            return None
        try:
            return reclamation(self.metadata.get(SPOT))
        except MetadataUnavailable:
            return None

    def let_go(self) -> None:
        if not self.instance_id:
            return
        try:
            log.info(self._complete(self.node.get("terminate_hook"), "CONTINUE"))
        except (ApiError, OSError) as exc:  # a spot reclamation the group has not started terminating
            log.warning("terminate hook %s not completed: %s", self.node.get("terminate_hook"), exc)

    def instance_type(self) -> str | None:
        try:
            return self.metadata.get(INSTANCE_TYPE)
        except MetadataUnavailable:
            return None

    def report_launch(self, ok: bool) -> str:
        if not self.instance_id:
            return "not on a Tencent node: no lifecycle hook to complete"
        return self._complete(self.node.get("launch_hook"), "CONTINUE" if ok else "ABANDON")
