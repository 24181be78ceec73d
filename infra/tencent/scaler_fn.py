"""The queue-mode scaler: a Serverless Cloud Function that a timer runs every minute.

Tencent Auto Scaling's alarm policies see only CPU, memory and traffic of the group's own instances, and
Cloud Monitor can trigger a scaling policy but not set a size computed from another product's metric.
So this function does what the AWS stack's step policy does: nodes = waiting + running jobs (one job per
node), from nodes.min (0) to nodes.max. It reads the job queue's counts with TDMQ's
DescribeCmqQueueDetail (ActiveMsgNum: waiting; InactiveMsgNum: received, not yet deleted) and sets the
group with Auto Scaling's ModifyDesiredCapacity; both are API 3.0 calls signed TC3-HMAC-SHA256 with the
function role's temporary key (SCF puts it in TENCENTCLOUD_SECRETID/SECRETKEY/SESSIONTOKEN). Scale-in
removes unprotected nodes only: a node protects itself while it runs a job.

Standard library only: SCF runs this file (with infra/scaling.py beside it as scaling.py) from a zip.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

try:
    from infra.scaling import desired_for_backlog
except ImportError:  # in the function's zip
    from scaling import desired_for_backlog  # type: ignore[no-redef]

TDMQ = ("tdmq", "2020-02-17")
AS = ("as", "2018-04-19")


class ApiError(Exception):
    """A TencentCloud API 3.0 error response (Response.Error)."""


@dataclass(frozen=True)
class Credentials:
    secret_id: str
    secret_key: str
    token: str = ""

    @classmethod
    def from_env(cls, env) -> "Credentials":
        return cls(env["TENCENTCLOUD_SECRETID"], env["TENCENTCLOUD_SECRETKEY"], env.get("TENCENTCLOUD_SESSIONTOKEN", ""))


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def tc3_headers(creds: Credentials, service: str, host: str, action: str, version: str, region: str,
                payload: str, timestamp: int) -> dict[str, str]:
    """The headers of a TC3-HMAC-SHA256 signed POST of a JSON payload to `host` (API 3.0)."""
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
    """TencentCloud API 3.0 over HTTPS; `endpoint` (scheme://host:port) replaces every service's host."""

    def __init__(self, creds: Credentials, region: str, endpoint: str | None = None, timeout_s: float = 10):
        self.creds, self.region, self.endpoint, self.timeout_s = creds, region, endpoint, timeout_s

    def call(self, service_version: tuple[str, str], action: str, params: dict) -> dict:
        service, version = service_version
        base = self.endpoint or f"https://{service}.tencentcloudapi.com"
        host = base.split("://", 1)[1].rstrip("/")
        payload = json.dumps(params, separators=(",", ":"))
        headers = tc3_headers(self.creds, service, host, action, version, self.region, payload, int(time.time()))
        request = urllib.request.Request(base, data=payload.encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
            body = json.loads(resp.read())["Response"]
        if "Error" in body:
            raise ApiError(f"{service} {action}: {body['Error'].get('Code')}: {body['Error'].get('Message')}")
        return body


def scale(api: Api, queue: str, group_id: str, min_size: int, max_size: int) -> dict:
    """One pass: the wanted node count for the queue's backlog, set on the group."""
    detail = api.call(TDMQ, "DescribeCmqQueueDetail", {"QueueName": queue})["QueueDescribe"]
    waiting, running = int(detail.get("ActiveMsgNum") or 0), int(detail.get("InactiveMsgNum") or 0)
    desired = desired_for_backlog(waiting, running, min_size, max_size)
    api.call(AS, "ModifyDesiredCapacity", {"AutoScalingGroupId": group_id, "DesiredCapacity": desired})
    return {"waiting": waiting, "running": running, "desired": desired}


def main_handler(event, context, env=os.environ) -> dict:
    """SCF entry point (timer trigger)."""
    api = Api(Credentials.from_env(env), env["GPUFLEET_REGION"])
    result = scale(api, env["GPUFLEET_QUEUE"], env["GPUFLEET_GROUP_ID"], int(env["GPUFLEET_MIN"]),
                   int(env["GPUFLEET_MAX"]))
    print(json.dumps(result))
    return result
