"""Tencent Cloud's wire protocols, standard library only: credentials, the CVM metadata service, API 3.0
(TC3-HMAC-SHA256) and TDMQ CMQ's data-flow API (the HMAC signature of API 2.0).

Written from Tencent's documentation: API 3.0 "Signature v3" (canonical request of method, path, query,
content-type/host/x-tc-action headers and the payload's SHA-256; key derived from "TC3"+SecretKey, date,
service, "tc3_request"; X-TC-Token for temporary keys); CMQ "Common Request Parameters" and "Signature"
(Action, Nonce, Timestamp, SecretId, SignatureMethod, Token, sorted into ``POST<host><path>?k=v&...``,
HMAC then base64; JSON answers with ``code``, ``message``, ``requestId``); and the instance metadata at
``http://metadata.tencentyun.com/latest/`` (``meta-data/cam/security-credentials/<role>`` answers
TmpSecretId, TmpSecretKey, Token, ExpiredTime).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

from trainer.loop import notices

METADATA = "http://metadata.tencentyun.com"
METADATA_ENDPOINT = "TENCENTCLOUD_METADATA_ENDPOINT"   # gpufleet's pointer to a metadata service (tests: a fake)
REFRESH_MARGIN_S = 900   # past botocore's 15-minute advisory refresh window, so its refresh gets a new key
CMQ_PATH = "/v2/index.php"
# A job's own key (trainer.node.jobcreds): the variables AWS SDKs read, set by the TaskProlog on every cloud
CREDENTIALS_URI, CREDENTIALS_TOKEN = "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class MetadataUnavailable(notices.MetadataUnavailable):
    """No Tencent metadata service answers (not on a CVM, or unreachable)."""


class ApiError(Exception):
    """An error answer of a Tencent Cloud API (API 3.0 Response.Error, or a CMQ code other than 0)."""

    def __init__(self, code, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class Credentials:
    secret_id: str
    secret_key: str
    token: str = ""
    expires_at: float | None = None   # wall clock; None for a permanent key


def env_credentials(environ=os.environ) -> Credentials | None:
    """A key from the environment: the SDK's and CLI's TENCENTCLOUD_SECRET_ID/_SECRET_KEY/_SESSION_TOKEN, or
    the TENCENTCLOUD_SECRETID/SECRETKEY/SESSIONTOKEN an SCF function's role puts there."""
    for sid, skey, token in (("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN"),
                             ("TENCENTCLOUD_SECRETID", "TENCENTCLOUD_SECRETKEY", "TENCENTCLOUD_SESSIONTOKEN")):
        if environ.get(sid) and environ.get(skey):
            return Credentials(environ[sid], environ[skey], environ.get(token, ""))
    return None


class Metadata:
    """The CVM instance metadata service over a proxy-free opener."""

    def __init__(self, endpoint: str | None = None, timeout_s: float = 2.0):
        self.base = (endpoint or os.environ.get(METADATA_ENDPOINT) or METADATA).rstrip("/") + "/latest/"
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path: str) -> str | None:
        """GET /latest/<path>; None when the item does not exist (404)."""
        try:
            with self._opener.open(self.base + path, timeout=self.timeout_s) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise MetadataUnavailable(f"metadata {path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise MetadataUnavailable(f"no Tencent metadata service at {self.base}: {exc}") from None

    def role_credentials(self, role: str | None = None) -> Credentials:
        """The temporary key of the instance's CAM role (the first listed when ``role`` is not given)."""
        if not role:
            listed = (self.get("meta-data/cam/security-credentials/") or "").split()
            if not listed:
                raise MetadataUnavailable("this instance has no CAM role (meta-data/cam/security-credentials/)")
            role = listed[0]
        text = self.get(f"meta-data/cam/security-credentials/{role}")
        if text is None:
            raise MetadataUnavailable(f"this instance does not have the CAM role {role!r}")
        doc = json.loads(text)
        if doc.get("Code", "Success") != "Success":
            raise MetadataUnavailable(f"CAM role {role!r}: {doc.get('Code')}")
        return Credentials(doc["TmpSecretId"], doc["TmpSecretKey"], doc.get("Token", ""),
                           float(doc["ExpiredTime"]) if doc.get("ExpiredTime") else None)


class RoleCredentials:
    """A CAM role's temporary key, fetched again from the metadata service shortly before it expires."""

    def __init__(self, metadata: Metadata, role: str | None = None, margin_s: float = REFRESH_MARGIN_S):
        self.metadata, self.role, self.margin_s = metadata, role, margin_s
        self._creds: Credentials | None = None
        self._lock = threading.Lock()

    def get(self) -> Credentials:
        with self._lock:
            c = self._creds
            if c is None or (c.expires_at is not None and time.time() > c.expires_at - self.margin_s):
                self._creds = self.metadata.role_credentials(self.role)
            return self._creds


class EndpointCredentials:
    """A job's own key on a gpufleet node: the node's credentials endpoint on loopback (trainer.node.jobcreds),
    asked with the job's token, the way AWS SDKs ask a container-credentials endpoint (the TaskProlog sets
    ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` and ``AWS_CONTAINER_AUTHORIZATION_TOKEN``); asked again shortly before
    the key expires. Only a loopback http:// address is asked: the token never leaves the machine."""

    def __init__(self, uri: str, token: str, margin_s: float = REFRESH_MARGIN_S, timeout_s: float = 5.0):
        if not on_loopback(uri):
            raise ValueError(f"credentials endpoint {uri!r}: only a loopback http:// address is asked")
        self.uri, self.token, self.margin_s, self.timeout_s = uri, token, margin_s, timeout_s
        self._creds: Credentials | None = None
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _fetch(self) -> Credentials:
        req = urllib.request.Request(self.uri, headers={"Authorization": self.token})
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise MetadataUnavailable(f"the node's credentials endpoint refused this job's token (HTTP {exc.code})"
                                      ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise MetadataUnavailable(f"no credentials endpoint at {self.uri}: {exc}") from None
        expires = datetime.strptime(doc["Expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        return Credentials(doc["AccessKeyId"], doc["SecretAccessKey"], doc.get("Token", ""), expires.timestamp())

    def get(self) -> Credentials:
        with self._lock:
            c = self._creds
            if c is None or time.time() > c.expires_at - self.margin_s:
                self._creds = self._fetch()
            return self._creds


def on_loopback(uri: str) -> bool:
    return uri.startswith("http://") and (urllib.parse.urlparse(uri).hostname or "") in LOOPBACK_HOSTS


def endpoint_credentials(environ=os.environ) -> EndpointCredentials | None:
    """The job's endpoint, where the TaskProlog gave one (AWS's container-credentials variables, on loopback; one
    elsewhere is another host's, an ECS task's or an EKS pod's, and holds no Tencent key)."""
    uri, token = environ.get(CREDENTIALS_URI), environ.get(CREDENTIALS_TOKEN)
    return EndpointCredentials(uri, token) if uri and token and on_loopback(uri) else None


class StaticCredentials:
    def __init__(self, creds: Credentials):
        self.creds = creds

    def get(self) -> Credentials:
        return self.creds


# --- API 3.0 ---------------------------------------------------------------------------------------

def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def tc3_headers(creds: Credentials, service: str, host: str, action: str, version: str, region: str,
                payload: str, timestamp: int) -> dict[str, str]:
    """The headers of a TC3-HMAC-SHA256 signed POST of a JSON payload to ``host``."""
    date = datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d")
    content_type = "application/json; charset=utf-8"
    signed = "content-type;host;x-tc-action"
    canonical = "\n".join(["POST", "/", "", f"content-type:{content_type}\nhost:{host}\nx-tc-action:{action.lower()}",
                           "", signed, hashlib.sha256(payload.encode()).hexdigest()])
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join(["TC3-HMAC-SHA256", str(timestamp), scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(("TC3" + creds.secret_key).encode(), date), service), "tc3_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers = {
        "Authorization": f"TC3-HMAC-SHA256 Credential={creds.secret_id}/{scope}, SignedHeaders={signed}, "
                         f"Signature={signature}",
        "Content-Type": content_type, "Host": host, "X-TC-Action": action, "X-TC-Timestamp": str(timestamp),
        "X-TC-Version": version, "X-TC-Region": region,
    }
    if creds.token:
        headers["X-TC-Token"] = creds.token
    return headers


class Api:
    """API 3.0 over HTTPS at ``<service>.tencentcloudapi.com``; ``endpoint`` (scheme://host:port) replaces
    every service's host (a fake on loopback)."""

    def __init__(self, credentials, region: str, endpoint: str | None = None, timeout_s: float = 10.0):
        self.credentials, self.region, self.endpoint, self.timeout_s = credentials, region, endpoint, timeout_s
        self._opener = urllib.request.build_opener()

    def call(self, service: str, version: str, action: str, params: dict) -> dict:
        base = self.endpoint or f"https://{service}.tencentcloudapi.com"
        host = urllib.parse.urlparse(base).netloc
        payload = json.dumps(params, separators=(",", ":"))
        headers = tc3_headers(self.credentials.get(), service, host, action, version, self.region, payload,
                              int(time.time()))
        req = urllib.request.Request(base, data=payload.encode(), headers=headers, method="POST")
        with self._opener.open(req, timeout=self.timeout_s) as resp:
            body = json.loads(resp.read())["Response"]
        if "Error" in body:
            raise ApiError(body["Error"].get("Code"), f"{service} {action}: {body['Error'].get('Message')}")
        return body


# --- TDMQ CMQ data-flow API ------------------------------------------------------------------------

def cmq_signature(secret_key: str, method: str, host: str, path: str, params: dict, algorithm: str = "sha256") -> str:
    """Base64 HMAC of ``METHOD host path ? k=v&...`` over the parameters sorted by name ('_' as '.')."""
    query = "&".join(f"{k.replace('_', '.')}={params[k]}" for k in sorted(params))
    digest = hashlib.sha256 if algorithm == "sha256" else hashlib.sha1
    mac = hmac.new(secret_key.encode(), f"{method.upper()}{host}{path}?{query}".encode(), digest).digest()
    return base64.b64encode(mac).decode()


class Cmq:
    """Signed POSTs of form parameters to ``<endpoint>/v2/index.php``; answers are JSON."""

    def __init__(self, endpoint: str, credentials, timeout_s: float = 10.0, client: str = "gpufleet"):
        self.endpoint = endpoint.rstrip("/")
        self.host = urllib.parse.urlparse(self.endpoint).netloc
        self.credentials, self.timeout_s, self.client = credentials, timeout_s, client
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(self, action: str, params: dict, wait_s: float = 0) -> dict:
        creds = self.credentials.get()
        signed = {**{k: str(v) for k, v in params.items()}, "Action": action, "RequestClient": self.client,
                  "SecretId": creds.secret_id, "Nonce": str(random.randint(1, 2**31 - 1)),
                  "Timestamp": str(int(time.time())), "SignatureMethod": "HmacSHA256"}
        if creds.token:
            signed["Token"] = creds.token
        signed["Signature"] = cmq_signature(creds.secret_key, "POST", self.host, CMQ_PATH, signed)
        req = urllib.request.Request(self.endpoint + CMQ_PATH, data=urllib.parse.urlencode(signed).encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"}, method="POST")
        with self._opener.open(req, timeout=self.timeout_s + wait_s) as resp:
            body = json.loads(resp.read())
        if body.get("code") != 0:
            raise ApiError(body.get("code"), f"cmq {action}: {body.get('message')}")
        return body


# --- API 3.0: versions, throttling, error text (CVM, SSM) ------------------------------------------

CVM_VERSION = "2017-03-12"   # Cloud Virtual Machine (RunInstances, DescribeInstances, TerminateInstances)
SSM_VERSION = "2019-09-23"   # Secrets Manager (GetSecretValue, PutSecretValue)
THROTTLED = "RequestLimitExceeded"  # the common error code, and its sub-codes (".UinLimitExceeded", ...)


def throttled(exc: BaseException) -> bool:
    """Whether an API answer is the common RequestLimitExceeded (or one of its sub-codes): try again later."""
    return isinstance(exc, ApiError) and str(exc.code or "").startswith(THROTTLED)


def error_message(exc: ApiError) -> str:
    """The service's own Message of an API 3.0 error, without the "<service> <Action>: " that Api.call adds."""
    text = str(exc)
    prefix = f"{exc.code}: "
    text = text[len(prefix):] if text.startswith(prefix) else text
    head, sep, rest = text.partition(": ")
    return rest if sep and len(head.split()) == 2 else text


def call_with_backoff(api: "Api", service: str, version: str, action: str, params: dict, *, attempts: int = 8,
                      base_s: float = 0.5, max_s: float = 10.0, retry_codes: tuple[str, ...] = (),
                      sleep=time.sleep) -> dict:
    """``api.call`` again, after a growing pause with jitter, while the answer is throttling (or one of
    ``retry_codes``) or the connection failed, at most ``attempts`` calls; then the last error is raised.
    A call that creates something carries its ClientToken, so a repeat after a lost answer creates nothing new."""
    for attempt in range(1, attempts + 1):
        try:
            return api.call(service, version, action, params)
        except ApiError as exc:
            if attempt == attempts or not (throttled(exc) or exc.code in retry_codes):
                raise
        except OSError:
            if attempt == attempts:
                raise
        delay = min(max_s, base_s * 2 ** (attempt - 1))
        sleep(delay * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")
