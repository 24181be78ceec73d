"""AWS: the S3 checkpoint store (trainer.clouds.s3store), the SQS job queue, the IMDSv2 client and the spot
interruption watcher, the node platform (metric dimensions, SSM secrets, ECR logins); Slurm's node provider builds
on it (trainer.clouds.aws_nodes).

The metadata base URL is botocore's own ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (default 169.254.169.254);
``AWS_EC2_METADATA_DISABLED=true`` turns the client off, as it does botocore's. S3 and SQS follow boto3's
own configuration (``AWS_ENDPOINT_URL`` points them at any compatible endpoint).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from trainer.clouds.s3store import S3Store
from trainer.errors import Fault, UsageError
from trainer.jobs.queue import JobQueue, Message
from trainer.loop.notices import MetadataUnavailable, NoticeWatcher
from trainer.node import jobcreds, metric_names
from trainer.node.platform import Platform
from trainer.node.registry import LoginCache, RegistryLogin, ecr_region, image_host

log = logging.getLogger("gpufleet.imds")

DEFAULT_ENDPOINT = "http://169.254.169.254/"
TOKEN_TTL_S = 21600
SPOT_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"


class ImdsUnavailable(MetadataUnavailable):
    """No instance metadata service answers (not on EC2, disabled, or unreachable)."""


class Imds:
    """IMDSv2: a session token from PUT /latest/api/token, cached and renewed before it expires."""

    def __init__(self, endpoint: str | None = None, timeout_s: float = 1.0, token_ttl_s: int = TOKEN_TTL_S):
        self.endpoint = (endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or DEFAULT_ENDPOINT)
        self.base = self.endpoint.rstrip("/") + "/latest/"
        self.disabled = os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._lock = threading.Lock()

    def _open(self, req: urllib.request.Request) -> bytes:
        if self.disabled:
            raise ImdsUnavailable("instance metadata disabled by AWS_EC2_METADATA_DISABLED")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError) as exc:
            raise ImdsUnavailable(f"no instance metadata service at {self.endpoint}: {exc}") from None

    def token(self) -> str:
        with self._lock:
            # Renew early so that a token never expires between check and use.
            margin = min(60.0, self.token_ttl_s / 2)
            if self._token is None or time.monotonic() > self._token_expires - margin:
                req = urllib.request.Request(
                    self.base + "api/token", method="PUT",
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)})
                try:
                    self._token = self._open(req).decode()
                except urllib.error.HTTPError as exc:
                    raise ImdsUnavailable(f"IMDS token request refused: HTTP {exc.code}") from None
                self._token_expires = time.monotonic() + self.token_ttl_s
            return self._token

    def get(self, path: str) -> str | None:
        """GET /latest/<path>; None when the item does not exist (404)."""
        for attempt in (1, 2):
            req = urllib.request.Request(self.base + path, headers={"X-aws-ec2-metadata-token": self.token()})
            try:
                return self._open(req).decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:
                    with self._lock:
                        self._token = None  # revoked or expired early: fetch a new one once
                    continue
                raise ImdsUnavailable(f"IMDS {path}: HTTP {exc.code}") from None
        raise AssertionError("unreachable")

    def available(self) -> bool:
        try:
            self.token()
            return True
        except ImdsUnavailable:
            return False

    def instance_id(self) -> str | None:
        return self.get("meta-data/instance-id")

    def instance_type(self) -> str | None:
        return self.get("meta-data/instance-type")

    def private_ip(self) -> str | None:
        return self.get("meta-data/local-ipv4")

    def region(self) -> str | None:
        doc = self.get("dynamic/instance-identity/document")
        return json.loads(doc)["region"] if doc else None


def interruption(spot_action: str | None) -> str | None:
    """The stop reason a spot ``instance-action`` (terminate, stop or hibernate in about two minutes) gives, or
    None."""
    if not spot_action:
        return None
    try:
        action = json.loads(spot_action)
        return f"spot {action.get('action', 'interruption')} at {action.get('time', '?')}"
    except ValueError:
        return "spot interruption"


class Watcher(NoticeWatcher):
    """The spot instance-action. A rebalance recommendation is logged, not acted on: it is advice that may never
    turn into an interruption."""

    def __init__(self, notice, imds: Imds | None = None, interval_s: float = 5.0, max_backoff_s: float = 300.0):
        super().__init__(notice, interval_s, max_backoff_s, name="imds-watcher")
        self.imds = imds or Imds()
        self._rebalance_seen = False

    def poll(self) -> str | None:
        reason = interruption(self.imds.get(SPOT_ACTION))
        if reason is None and not self._rebalance_seen and self.imds.get(REBALANCE):
            self._rebalance_seen = True
            log.warning("EC2 rebalance recommendation: interruption risk is elevated; continuing")
        return reason


def start_watcher(notice, settings: dict, interval_s: float = 2.0) -> threading.Thread:
    """The interruption watcher of this node (``settings``: node.json; unused here)."""
    return Watcher(notice, interval_s=interval_s).start()


# --- Errors told in one line at the command boundary ------------------------------------------------

HOW_TO_CREDENTIALS = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (see `aws configure`); "
                      "on a cluster node the instance profile provides them")
# Error codes of a refused request that the user's setup causes (credentials, permissions, a missing bucket).
SETUP_CODES = {
    "InvalidAccessKeyId": "the AWS access key is not valid; " + HOW_TO_CREDENTIALS,
    "SignatureDoesNotMatch": "the AWS secret key does not match the access key; " + HOW_TO_CREDENTIALS,
    "ExpiredToken": "the AWS session token has expired; renew the credentials",
    "InvalidClientTokenId": "the AWS security token is not valid; " + HOW_TO_CREDENTIALS,
    "UnrecognizedClientException": "the AWS security token is not valid; " + HOW_TO_CREDENTIALS,
    "AccessDenied": "access denied; the credentials lack a permission this needs",
    "AccessDeniedException": "access denied; the credentials lack a permission this needs",
    "NoSuchBucket": "the bucket does not exist; create it or name another",
    "AWS.SimpleQueueService.NonExistentQueue": "the queue does not exist; check --queue-url",
    "QueueDoesNotExist": "the queue does not exist; check --queue-url",
}


def explain(exc: BaseException) -> UsageError | Fault | None:
    """botocore's credential, region and connection errors (and refusals of the user's setup) in one line."""
    from botocore import exceptions as bc  # lazy: AWS SDK (~0.2 s) only when used

    if isinstance(exc, (bc.NoCredentialsError, bc.PartialCredentialsError, bc.CredentialRetrievalError)):
        return UsageError(f"no usable AWS credentials ({exc}); {HOW_TO_CREDENTIALS}")
    if isinstance(exc, bc.NoRegionError):
        return UsageError("no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION, or region in ~/.aws/config)")
    if isinstance(exc, (bc.EndpointConnectionError, bc.ConnectTimeoutError, bc.ConnectionClosedError,
                        bc.ProxyConnectionError)):
        url = getattr(exc, "kwargs", {}).get("endpoint_url", "the AWS endpoint")
        return Fault(f"cannot connect to {url}; check the network, or AWS_ENDPOINT_URL if it points at an emulator")
    if isinstance(exc, bc.ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        if code in SETUP_CODES:
            operation = getattr(exc, "operation_name", "request")
            return UsageError(f"AWS {operation}: {code}: {SETUP_CODES[code]}")
    return None


# --- Checkpoint store: S3 ---------------------------------------------------------------------------

def open_store(uri: str) -> S3Store:
    """s3://bucket/prefix."""
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise UsageError(f"checkpoint URI {uri!r}: missing bucket; expected s3://bucket/prefix")
    return S3Store(parsed.netloc, parsed.path)


# --- Job queue: SQS ---------------------------------------------------------------------------------

def sqs_region(url: str) -> str | None:
    """The region in an SQS URL (https://sqs.<region>.amazonaws.com/...), or None for an emulator URL."""
    m = re.match(r"(?:sqs\.)?([a-z]{2}(?:-[a-z]+)+-\d)\.(?:queue\.)?amazonaws\.com(?:\.cn)?\Z",
                 urlparse(url).hostname or "")
    return m.group(1) if m else None


# A received message is hidden this long, not the queue's 15 minutes: the bridge deletes it once sbatch took it
# (seconds), extends a sweep member it holds, and a bridge killed while holding one (even inside a long poll whose
# answer never reached it) leaves it to its next start a minute later.
RECEIVE_VISIBILITY_S = 60


class SqsJobQueue(JobQueue):
    def __init__(self, url: str, region: str | None = None):
        import boto3  # lazy: AWS SDK (~0.2 s) only when used

        self.url = url
        self.client = boto3.client("sqs", region_name=region or sqs_region(url))

    def receive(self, wait_s: int) -> Message | None:
        resp = self.client.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=1, WaitTimeSeconds=wait_s, VisibilityTimeout=RECEIVE_VISIBILITY_S,
            MessageSystemAttributeNames=["ApproximateReceiveCount"])
        for m in resp.get("Messages", []):
            return Message(m["MessageId"], m["Body"], m["ReceiptHandle"],
                           int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)))
        return None

    def extend(self, msg: Message, visibility_s: int) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.url, ReceiptHandle=msg.receipt, VisibilityTimeout=int(visibility_s))

    def delete(self, msg: Message) -> None:
        self.client.delete_message(QueueUrl=self.url, ReceiptHandle=msg.receipt)

    def send(self, body: str) -> str:
        return self.client.send_message(QueueUrl=self.url, MessageBody=body)["MessageId"]

    def dead_letter_url(self) -> str | None:
        """The URL of the RedrivePolicy's deadLetterTargetArn queue, or None if the queue has no policy."""
        attrs = self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=["RedrivePolicy"])
        policy = attrs.get("Attributes", {}).get("RedrivePolicy")
        if not policy:
            return None
        arn = json.loads(policy)["deadLetterTargetArn"]  # arn:aws:sqs:<region>:<account>:<name>
        account, name = arn.split(":")[4:6]
        return self.client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]

    def dead_letters(self) -> "SqsJobQueue | None":
        url = self.dead_letter_url()
        return SqsJobQueue(url, self.client.meta.region_name) if url else None

    def dead_letter(self, msg: Message, reason: str) -> None:
        """Send the body to the dead-letter queue, then delete it here. With no RedrivePolicy the message is
        left to redelivery (said in one line)."""
        target = self.dead_letter_url()
        if target is None:
            log.error("message %s: %s; the queue has no RedrivePolicy, so it is left to redelivery", msg.id, reason)
            return
        self.client.send_message(QueueUrl=target, MessageBody=msg.body, MessageAttributes={
            "gpufleet-reason": {"DataType": "String", "StringValue": reason[:1024]}})
        self.delete(msg)


def open_queue(url: str, region: str | None = None) -> SqsJobQueue:
    return SqsJobQueue(url, region)


# --- Node platform: metric dimensions, secrets and registry logins through the instance role ------------

METADATA_TRIES = 3  # reads of the instance id before a node counts as off EC2


def instance_facts(imds: Imds | None = None) -> dict[str, str]:
    """What a job may know of its instance (id and type; nothing secret), which root's credentials endpoint
    publishes for jobs (trainer.node.jobcreds.INSTANCE), since the metadata service answers only root."""
    imds = imds or Imds()
    try:
        return {k: v for k, v in (("instance_id", imds.instance_id()), ("instance_type", imds.instance_type())) if v}
    except ImdsUnavailable:
        return {}


def instance_facts_of_node() -> dict[str, str]:
    try:
        return json.loads(Path(jobcreds.INSTANCE).read_text())
    except (OSError, ValueError):
        return {}


class NodePlatform(Platform):
    """This instance: its metrics' dimensions (node.json's group name and the instance id), SSM secrets and ECR
    logins through the instance role. The SSM client is made on first use from the node's region."""

    name = "aws"

    def __init__(self, node: dict, imds: Imds | None = None):
        self.node, self.imds = node, imds or Imds()
        self._ssm = None
        self._logins = LoginCache()
        self.instance_id, self._instance_type = None, None
        known = instance_facts_of_node()  # a job's process: the metadata service answers only root
        if known.get("instance_id"):
            self.instance_id, self._instance_type = known["instance_id"], known.get("instance_type")
            return
        for attempt in range(METADATA_TRIES):  # node.json names AWS: a slow answer (boot, load) is not "off EC2"
            try:
                self.instance_id = self.imds.instance_id()
                break
            except ImdsUnavailable:
                if attempt + 1 == METADATA_TRIES:
                    log.info("no instance metadata: this node's metrics carry no instance id")
                    return
                time.sleep(0.5)

    def ssm(self):
        if self._ssm is None:
            import boto3  # lazy: AWS SDK (~0.2 s) only when used

            region = self.node.get("region") or (self.imds.region() if self.instance_id else None)
            self._ssm = boto3.client("ssm", region_name=region)
        return self._ssm

    def metric_dimensions(self) -> dict[str, str]:
        """The nodes' group (node.json asg_name: the dimension the stack's dashboard and alarms read) and this
        instance."""
        return metric_names.dimensions(self.node.get("asg_name"), self.instance_id)

    def instance_type(self) -> str | None:
        if self._instance_type:
            return self._instance_type
        try:
            return self.imds.instance_type()
        except ImdsUnavailable:
            return None

    def secret(self, source: str, name: str) -> str:
        """An SSM parameter (a SecureString is decrypted with its key) below the stack's path
        ``/gpufleet/<stack>/``, the only parameters the node role may read."""
        if source != "ssm":
            return super().secret(source, name)
        from botocore.exceptions import ClientError  # lazy: AWS SDK (~0.2 s) only when used

        path = f"/gpufleet/{self.node.get('stack', '<stack>')}/"
        try:
            return self.ssm().get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ParameterNotFound":
                hint = f"no such SSM parameter; create it below {path} (aws ssm put-parameter --type SecureString)"
            elif code.startswith("AccessDenied"):
                hint = f"the node role may read SSM parameters below {path} only"
            else:
                hint = f"SSM refused the read ({exc})"
            raise UsageError(f"env: ssm:{name}: {code}: {hint}") from None

    def registry_login(self, image: str):
        """ECR credentials through the instance role (GetAuthorizationToken, valid 12 hours, cached) for an image
        on an ECR registry `<account>.dkr.ecr.<region>.amazonaws.com`: the stack's repository and its pull-through
        caches. The token opens every registry the role may pull from, so any account's host takes the same."""
        host = image_host(image)
        region = ecr_region(host)
        if region is None:
            return None

        def fetch() -> RegistryLogin:
            import boto3  # lazy: AWS SDK (~0.2 s) only when used

            data = boto3.client("ecr", region_name=region).get_authorization_token()["authorizationData"][0]
            user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
            return RegistryLogin(host, user, password, data["expiresAt"].timestamp())

        return self._logins.get(host, fetch)


# --- a job's own credentials: the job role through STS (trainer/clouds/aws_credentials.py) -----------------------
from trainer.clouds.aws_credentials import job_issuer  # noqa: E402,F401
