"""Fakes of Tencent Cloud endpoints on 127.0.0.1, over real HTTP, written from Tencent's documentation (there is
no emulator): the CVM metadata service, TDMQ CMQ's data-flow API and API 3.0 (Auto Scaling, TDMQ).

- Metadata (CVM "Instance Metadata", "Querying the Repossession Status of a Spot Instance", "CAM role"): GET
  /latest/meta-data/<item>; 404 for items not set. ``meta-data/spot/termination-time`` appears once a spot
  instance is marked for reclamation (UTC+8 time text); ``meta-data/cam/security-credentials/`` lists the role,
  ``.../<role>`` answers {TmpSecretId, TmpSecretKey, Token, ExpiredTime, Expiration, Code}.
- CMQ ("Common Request Parameters", "Signature", SendMessage, ReceiveMessage, DeleteMessage,
  GetQueueAttributes; error codes of the CMQ SDK: 4100 authentication failed, 4430 receipt handle invalid or
  expired, 4440 no such queue, 7000 no message): POST /v2/index.php with form parameters, the signature
  checked against the key the fake was given (the Token must match the key's token). Messages are hidden
  for the queue's visibilityTimeout after a receive, dropped msgRetentionSeconds after their send, and
  moved to the dead-letter queue when a receive would exceed maxReceiveCount.
- API 3.0 ("Signature v3"): POST / with X-TC-Action; the TC3-HMAC-SHA256 Authorization header checked;
  answers {"Response": {..., "RequestId"}} or {"Response": {"Error": {Code, Message}}}. Actions are
  handlers the test registers; FakeCvm and FakeSsm register CVM's and Secrets Manager's (below).
- CVM 2017-03-12 (RunInstances, DescribeInstances, TerminateInstances, the Instance and Filter data types, the
  CVM error codes), Secrets Manager 2019-09-23 (GetSecretValue, PutSecretValue, its error codes) and STS
  2018-08-13 (AssumeRole): see FakeCvm, FakeSsm and FakeSts.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from infra.demo.loopback_http import LoopbackServer, QuietHandler
from trainer.clouds.tencent_api import Credentials

ROLE = "gpufleet-test-nodes"
KEY = Credentials("AKIDtmpsecretid", "tmpsecretkey", "session-token-1")


def cmq_expected(secret_key: str, host: str, params: dict) -> str:
    """The signature the CMQ documentation defines (written here apart from the client's code)."""
    text = "POST" + host + "/v2/index.php?" + "&".join(f"{k.replace('_', '.')}={v}" for k, v in sorted(params.items()))
    return base64.b64encode(hmac.new(secret_key.encode(), text.encode(), hashlib.sha256).digest()).decode()


def tc3_expected(secret_id: str, secret_key: str, service: str, host: str, action: str, payload: str,
                 timestamp: int) -> str:
    """The Authorization header of API 3.0's signature v3 (written here apart from the client's code)."""
    day = time.strftime("%Y-%m-%d", time.gmtime(timestamp))
    canonical = (f"POST\n/\n\ncontent-type:application/json; charset=utf-8\nhost:{host}\n"
                 f"x-tc-action:{action.lower()}\n\ncontent-type;host;x-tc-action\n"
                 + hashlib.sha256(payload.encode()).hexdigest())
    scope = f"{day}/{service}/tc3_request"
    string = f"TC3-HMAC-SHA256\n{timestamp}\n{scope}\n" + hashlib.sha256(canonical.encode()).hexdigest()
    key = ("TC3" + secret_key).encode()
    for part in (day, service, "tc3_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, string.encode(), hashlib.sha256).hexdigest()
    return (f"TC3-HMAC-SHA256 Credential={secret_id}/{scope}, SignedHeaders=content-type;host;x-tc-action, "
            f"Signature={signature}")


class FakeMetadata(LoopbackServer):
    def __init__(self, instance_id: str = "ins-1a2b3c4d", instance_type: str = "GN10Xp.2XLARGE40",
                 role: str = ROLE, key: Credentials = KEY, key_lifetime_s: float = 7200):
        self.items: dict[str, str] = {
            "meta-data/instance-id": instance_id,
            "meta-data/instance/instance-type": instance_type,
            "meta-data/placement/region": "ap-shanghai",
            "meta-data/cam/security-credentials/": role,
        }
        self.role, self.key, self.key_lifetime_s = role, key, key_lifetime_s
        self.gets: list[str] = []
        self.key_fetches = 0
        self._lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, path: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self.items.pop(path, None)
            else:
                self.items[path] = value

    def reclaim(self) -> str:
        """Mark the instance for reclamation two minutes from now (the OS time, UTC+8)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + 8 * 3600 + 120))
        self.set("meta-data/spot/termination-time", when)
        return when

    def _role_document(self) -> str:
        expires = int(time.time() + self.key_lifetime_s)
        return json.dumps({"TmpSecretId": self.key.secret_id, "TmpSecretKey": self.key.secret_key,
                           "Token": self.key.token, "ExpiredTime": expires,
                           "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
                           "Code": "Success"})

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            def do_GET(self):
                path = self.path.removeprefix("/latest/")
                with fake._lock:
                    fake.gets.append(path)
                    if path == f"meta-data/cam/security-credentials/{fake.role}":
                        fake.key_fetches += 1
                        value = fake._role_document()
                    else:
                        value = fake.items.get(path)
                if value is None:
                    return self._reply(404, "Not Found")
                self._reply(200, value)

        return Handler


@dataclass
class _Msg:
    id: str
    body: str
    enqueued: float
    visible_at: float
    dequeues: int = 0
    first_dequeue: float = 0.0
    receipt: str = ""


@dataclass
class Queue:
    name: str
    visibility_s: float = 30
    retention_s: float = 43200
    dead_letter: str | None = None
    max_receives: int = 0
    messages: list[_Msg] = field(default_factory=list)


class FakeCmq(LoopbackServer):
    """TDMQ CMQ's data-flow API for one account (``key``)."""

    def __init__(self, key: Credentials = KEY):
        self.key = key
        self.queues: dict[str, Queue] = {}
        self.calls: list[tuple[str, dict]] = []
        self._cond = threading.Condition()
        super().__init__(self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, queue: str) -> str:
        return f"{self.endpoint}/{queue}"

    def create(self, name: str, **attrs) -> Queue:
        with self._cond:
            q = self.queues[name] = Queue(name, **attrs)
            return q

    def bodies(self, queue: str) -> list[str]:
        with self._cond:
            return [m.body for m in self.queues[queue].messages]

    def counts(self, queue: str) -> tuple[int, int]:
        """(visible, hidden) messages."""
        now = time.time()
        with self._cond:
            self._expire(self.queues[queue], now)
            msgs = self.queues[queue].messages
            return sum(m.visible_at <= now for m in msgs), sum(m.visible_at > now for m in msgs)

    # --- the API ------------------------------------------------------------------------------------
    def _expire(self, q: Queue, now: float) -> None:
        q.messages = [m for m in q.messages if m.enqueued + q.retention_s > now]
        if q.dead_letter and q.max_receives:
            for m in [m for m in q.messages if m.visible_at <= now and m.dequeues >= q.max_receives]:
                q.messages.remove(m)
                self.queues[q.dead_letter].messages.append(_Msg(uuid.uuid4().hex, m.body, now, now))

    def _call(self, action: str, p: dict) -> dict:
        q = self.queues.get(p.get("queueName", ""))
        if q is None:
            return {"code": 4440, "message": f"queue {p.get('queueName')!r} does not exist"}
        now = time.time()
        self._expire(q, now)
        if action == "GetQueueAttributes":
            return {"code": 0, "queueName": q.name, "visibilityTimeout": int(q.visibility_s),
                    "msgRetentionSeconds": int(q.retention_s), "pollingWaitSeconds": 0,
                    "activeMsgNum": sum(m.visible_at <= now for m in q.messages),
                    "inactiveMsgNum": sum(m.visible_at > now for m in q.messages)}
        if action == "SendMessage":
            msg = _Msg(f"msg-{uuid.uuid4().hex[:12]}", p["msgBody"], now, now + float(p.get("delaySeconds", 0)))
            q.messages.append(msg)
            self._cond.notify_all()
            return {"code": 0, "msgId": msg.id}
        if action == "ReceiveMessage":
            deadline = now + float(p.get("pollingWaitSeconds", 0))
            while True:
                now = time.time()
                self._expire(q, now)
                ready = [m for m in q.messages if m.visible_at <= now]
                if ready:
                    m = ready[0]
                    m.dequeues += 1
                    m.first_dequeue = m.first_dequeue or now
                    m.visible_at = now + q.visibility_s
                    m.receipt = uuid.uuid4().hex
                    return {"code": 0, "msgBody": m.body, "msgId": m.id, "receiptHandle": m.receipt,
                            "enqueueTime": int(m.enqueued), "nextVisibleTime": int(m.visible_at),
                            "firstDequeueTime": int(m.first_dequeue), "dequeueCount": m.dequeues}
                if now >= deadline:
                    return {"code": 7000, "message": "no message"}
                self._cond.wait(min(0.05, deadline - now))
        if action == "DeleteMessage":
            for m in q.messages:
                if m.receipt and m.receipt == p.get("receiptHandle") and m.visible_at > now:
                    q.messages.remove(m)
                    return {"code": 0}
            return {"code": 4430, "message": "receipt handle invalid or expired"}
        return {"code": 4000, "message": f"unknown action {action}"}

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            content_type = "application/json"

            def do_POST(self):
                if self.path != "/v2/index.php":
                    return self._reply(404)
                length = int(self.headers.get("Content-Length", 0))
                params = dict(parse_qsl(self.rfile.read(length).decode(), keep_blank_values=True))
                signature = params.pop("Signature", "")
                host = self.headers.get("Host", "")
                wanted = cmq_expected(fake.key.secret_key, host, params)
                if (params.get("SecretId") != fake.key.secret_id or not hmac.compare_digest(signature, wanted)
                        or params.get("Token", "") != fake.key.token or params.get("SignatureMethod") != "HmacSHA256"):
                    return self._reply(200, json.dumps({"code": 4100, "message": "authentication failed"}))
                with fake._cond:
                    fake.calls.append((params["Action"], params))
                    answer = fake._call(params["Action"], params)
                self._reply(200, json.dumps({"requestId": uuid.uuid4().hex, **answer}))

        return Handler


class FakeApi3(LoopbackServer):
    """API 3.0 for one account: every request's TC3 signature is checked; ``handlers[(service, action)]``
    answer the parameters (a dict; raise ``Refused(code, message)`` for an error answer)."""

    def __init__(self, key: Credentials = KEY):
        self.key = key
        self.handlers: dict[tuple[str, str], object] = {}
        self.calls: list[tuple[str, str, dict]] = []
        self.versions: dict[str, str] = {}   # service -> the API version it answers (unchecked when absent)
        self.regions: list[str] = []         # X-TC-Region of every signed request
        super().__init__(self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            content_type = "application/json"

            def do_POST(self):
                payload = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                action, version = self.headers.get("X-TC-Action", ""), self.headers.get("X-TC-Version", "")
                auth = self.headers.get("Authorization", "")
                service = auth.split("Credential=", 1)[-1].split("/")[2] if "Credential=" in auth else ""
                expected = tc3_expected(fake.key.secret_id, fake.key.secret_key, service, self.headers.get("Host", ""),
                                        action, payload, int(self.headers.get("X-TC-Timestamp", "0")))
                if auth != expected or self.headers.get("X-TC-Token", "") != fake.key.token or not version:
                    return self._answer({"Error": {"Code": "AuthFailure.SignatureFailure", "Message": "bad signature"}})
                if fake.versions.get(service, version) != version:
                    return self._answer({"Error": {"Code": "NoSuchVersion", "Message": f"{service} {version}"}})
                fake.regions.append(self.headers.get("X-TC-Region", ""))
                params = json.loads(payload or "{}")
                fake.calls.append((service, action, params))
                handler = fake.handlers.get((service, action))
                if handler is None:
                    return self._answer({"Error": {"Code": "InvalidAction", "Message": f"{service} {action}"}})
                try:
                    self._answer(handler(params))
                except Refused as exc:
                    self._answer({"Error": {"Code": exc.code, "Message": exc.message}})

            def _answer(self, body: dict):
                self._reply(200, json.dumps({"Response": {**body, "RequestId": uuid.uuid4().hex}}))

        return Handler


class Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


# --- CVM (API version 2017-03-12) on FakeApi3 -------------------------------------------------------------

CVM_VERSION = "2017-03-12"
SSM_VERSION = "2019-09-23"
THROTTLE = ("RequestLimitExceeded", "The number of requests exceeds the frequency limit.")


@dataclass
class FakeInstance:
    id: str
    name: str
    type: str
    zone: str
    vpc: str
    subnet: str
    charge: str
    template: str
    tags: dict[str, str]
    ip: str
    placement_groups: list[str]
    market: dict | None
    state: str = "PENDING"
    describes: int = 0          # DescribeInstances answers that listed it
    error: str | None = None    # LatestOperationErrorMsg of a failed launch


class FakeCvm:
    """CVM for one region, written from Tencent's API documentation (there is no emulator):

    - RunInstances: ``LaunchTemplate.LaunchTemplateId`` must name a template; ``Placement.Zone`` a zone of the
      region (else ``InvalidZone.MismatchRegion``); ``VirtualPrivateCloud`` the VPC and a subnet of that zone
      (``InvalidParameterValue.SubnetNotExist`` / ``.SubnetIdZoneIdNotMatch`` / ``.VpcIdSubnetIdNotMatch``);
      ``InstanceCount`` 1..100; ``SPOTPAID`` with ``InstanceMarketOptions.MarketType`` spot and only then;
      ``DisasterRecoverGroupIds`` one group at most; ``TagSpecification`` binds tags to the instances;
      ``InstanceName`` as given for one instance, with the suffix 1..n for several (the documented default
      without a pattern string); a ``ClientToken`` (64 characters at most) seen before answers the same
      instance ids and creates nothing. Answers ``InstanceIdSet``. An instance is PENDING in the first
      DescribeInstances answer that lists it, RUNNING after; its private IP appears after ``ip_after`` answers.
    - DescribeInstances: ``InstanceIds`` (100 at most) or ``Filters`` (not both, ``InvalidParameterCombination``;
      10 filters and 5 values each at most, ``InvalidFilterValue.LimitExceeded``) with ``tag:<key>``,
      ``tag-key``, ``instance-name``, ``zone``, ``instance-id``; ``Offset``/``Limit`` (100 at most);
      answers ``TotalCount`` and ``InstanceSet`` (Instance: InstanceId, InstanceName, InstanceType,
      InstanceState, InstanceChargeType, Placement, VirtualPrivateCloud, PrivateIpAddresses, Tags,
      LatestOperationState, LatestOperationErrorMsg).
    - TerminateInstances: 100 ids at most; an unknown id is ``InvalidInstanceId.NotFound``, a terminating one
      ``UnsupportedOperation.InstanceStateTerminating`` (nothing is done then). A terminated instance is listed
      TERMINATING once, then no more.

    Injectable: ``sold_out[(type, zone)] = code`` (zone None: every zone; or ``(type, zone, charge type)``)
    answers RunInstances with that capacity error; ``throttle[action] = n`` answers the next n calls of the
    action RequestLimitExceeded; ``fail_launch``: instance types whose instances end LAUNCH_FAILED.
    """

    def __init__(self, subnets: dict[str, str], vpc: str = "vpc-1a2b3c4d",
                 templates: tuple[str, ...] = ("lt-1a2b3c4d",), placement_groups: tuple[str, ...] = ("ps-1a2b3c4d",),
                 ip_after: int = 1):
        self.subnets, self.vpc, self.templates = dict(subnets), vpc, set(templates)   # subnet -> zone
        self.zones = set(self.subnets.values())
        self.placement_groups, self.ip_after = set(placement_groups), ip_after
        self.instances: dict[str, FakeInstance] = {}
        self.sold_out: dict[tuple, str] = {}
        self.throttle: dict[str, int] = {}
        self.fail_launch: set[str] = set()
        self.tokens: dict[str, list[str]] = {}
        self.launches: list[dict] = []      # parameters of every RunInstances that created instances
        self.terminated: list[str] = []
        self._ips = iter(range(10, 250))
        self._lock = threading.Lock()

    def install(self, api: FakeApi3) -> "FakeCvm":
        api.versions["cvm"] = CVM_VERSION
        for action, fn in (("RunInstances", self._run), ("DescribeInstances", self._describe),
                           ("TerminateInstances", self._terminate)):
            api.handlers[("cvm", action)] = self._guarded(action, fn)
        return self

    def add(self, name: str, tags: dict[str, str], zone: str | None = None, state: str = "RUNNING") -> FakeInstance:
        """An instance that exists already (another stack's, a leftover)."""
        subnet = next(s for s, z in self.subnets.items() if zone in (None, z))
        with self._lock:
            inst = self._new(name, "S5.MEDIUM2", self.subnets[subnet], subnet, "POSTPAID_BY_HOUR", "", tags, [], None)
            inst.state, inst.describes = state, self.ip_after
            return inst

    def live(self) -> list[FakeInstance]:
        with self._lock:
            return [i for i in self.instances.values() if i.state != "TERMINATING"]

    def by_node(self, name: str) -> list[FakeInstance]:
        return [i for i in self.live() if i.tags.get("gpufleet-slurm-node") == name]

    # --- the API ----------------------------------------------------------------------------------------
    def _guarded(self, action, fn):
        def handler(params):
            with self._lock:
                if self.throttle.get(action, 0) > 0:
                    self.throttle[action] -= 1
                    raise Refused(*THROTTLE)
                return fn(params)
        return handler

    def _new(self, name, itype, zone, subnet, charge, template, tags, groups, market) -> FakeInstance:
        n = next(self._ips)
        inst = FakeInstance(f"ins-{uuid.uuid4().hex[:8]}", name, itype, zone, self.vpc, subnet, charge, template,
                            dict(tags), f"10.0.{sorted(self.subnets).index(subnet)}.{n}", list(groups), market)
        self.instances[inst.id] = inst
        return inst

    def _run(self, p: dict) -> dict:
        token = p.get("ClientToken")
        if token is not None and len(token) > 64:
            raise Refused("InvalidClientToken.TooLong", "ClientToken is longer than 64 characters")
        if token in self.tokens:
            return {"InstanceIdSet": list(self.tokens[token])}
        template = (p.get("LaunchTemplate") or {}).get("LaunchTemplateId")
        if template not in self.templates:
            raise Refused("InvalidParameterValue.LaunchTemplateIdNotExisted", f"launch template {template!r}")
        count = p.get("InstanceCount", 1)
        if not isinstance(count, int) or not 1 <= count <= 100:
            raise Refused("InvalidParameterValue", f"InstanceCount {count!r} is not in [1, 100]")
        zone = (p.get("Placement") or {}).get("Zone")
        if zone not in self.zones:
            raise Refused("InvalidZone.MismatchRegion", f"zone {zone!r} is not in this region")
        vpc = p.get("VirtualPrivateCloud") or {}
        if vpc.get("SubnetId") not in self.subnets:
            raise Refused("InvalidParameterValue.SubnetNotExist", f"subnet {vpc.get('SubnetId')!r}")
        if vpc.get("VpcId") != self.vpc:
            raise Refused("InvalidParameterValue.VpcIdSubnetIdNotMatch", f"vpc {vpc.get('VpcId')!r}")
        if self.subnets[vpc["SubnetId"]] != zone:
            raise Refused("InvalidParameterValue.SubnetIdZoneIdNotMatch", f"{vpc['SubnetId']} is not in {zone}")
        charge = p.get("InstanceChargeType", "POSTPAID_BY_HOUR")
        market = p.get("InstanceMarketOptions")
        if charge not in ("POSTPAID_BY_HOUR", "SPOTPAID", "PREPAID", "CDHPAID"):
            raise Refused("InvalidParameterValue", f"InstanceChargeType {charge!r}")
        if (charge == "SPOTPAID") != bool(market) or (market and market.get("MarketType") != "spot"):
            raise Refused("InvalidParameterCombination", "SPOTPAID goes with InstanceMarketOptions MarketType spot")
        if market and (market.get("SpotOptions") or {}).get("SpotInstanceType", "one-time") != "one-time":
            raise Refused("InvalidParameterValue", "SpotInstanceType: only one-time is supported")
        groups = p.get("DisasterRecoverGroupIds") or []
        if len(groups) > 1 or not set(groups) <= self.placement_groups:
            raise Refused("InvalidParameterValue", f"DisasterRecoverGroupIds {groups!r}")
        itype = p.get("InstanceType")
        code = (self.sold_out.get((itype, zone, charge)) or self.sold_out.get((itype, zone))
                or self.sold_out.get((itype, None)))
        if code:
            raise Refused(code, f"{itype} is sold out in {zone}")
        tags = {}
        for spec in p.get("TagSpecification") or []:
            if spec.get("ResourceType") == "instance":
                tags.update({t["Key"]: t["Value"] for t in spec.get("Tags") or []})
        name = p.get("InstanceName") or "unnamed"
        made = []
        for i in range(count):
            inst = self._new(name if count == 1 else f"{name}{i + 1}", itype, zone, vpc["SubnetId"], charge,
                             template, tags, groups, market)
            if itype in self.fail_launch:
                inst.error = f"{itype}: creation failed"
            made.append(inst.id)
        self.launches.append(p)
        if token is not None:
            self.tokens[token] = made
        return {"InstanceIdSet": made}

    @staticmethod
    def _matches(inst: FakeInstance, name: str, values: list[str]) -> bool:
        if name.startswith("tag:"):
            return inst.tags.get(name[4:]) in values
        if name == "tag-key":
            return any(v in inst.tags for v in values)
        field = {"instance-name": inst.name, "zone": inst.zone, "instance-id": inst.id}.get(name)
        if field is None:
            raise Refused("InvalidFilter", f"filter {name!r} is not supported")
        return field in values

    def _view(self, inst: FakeInstance) -> dict:
        inst.describes += 1
        if inst.state == "PENDING" and inst.describes > 1:
            inst.state = "LAUNCH_FAILED" if inst.error else "RUNNING"
        has_ip = inst.describes > self.ip_after and inst.state != "LAUNCH_FAILED"
        return {"InstanceId": inst.id, "InstanceName": inst.name, "InstanceType": inst.type,
                "InstanceState": inst.state, "InstanceChargeType": inst.charge,
                "Placement": {"Zone": inst.zone, "ProjectId": 0},
                "VirtualPrivateCloud": {"VpcId": inst.vpc, "SubnetId": inst.subnet},
                "PrivateIpAddresses": [inst.ip] if has_ip else None,
                "Tags": [{"Key": k, "Value": v} for k, v in inst.tags.items()],
                "LatestOperationState": "FAILED" if inst.state == "LAUNCH_FAILED" else "SUCCESS",
                "LatestOperationErrorMsg": inst.error if inst.state == "LAUNCH_FAILED" else None}

    def _describe(self, p: dict) -> dict:
        ids, filters = p.get("InstanceIds"), p.get("Filters")
        if ids and filters:
            raise Refused("InvalidParameterCombination", "InstanceIds and Filters cannot be given together")
        limit, offset = p.get("Limit", 20), p.get("Offset", 0)
        if not 0 < limit <= 100 or (ids and len(ids) > 100):
            raise Refused("InvalidParameterValue", "Limit and InstanceIds allow 100 at most")
        if filters and (len(filters) > 10 or any(len(f.get("Values") or []) > 5 for f in filters)):
            raise Refused("InvalidFilterValue.LimitExceeded", "10 filters and 5 values per filter at most")
        found = [i for i in self.instances.values()
                 if (not ids or i.id in ids) and all(self._matches(i, f["Name"], f["Values"]) for f in filters or [])]
        page = found[offset:offset + limit]
        answer = {"TotalCount": len(found), "InstanceSet": [self._view(i) for i in page]}
        for inst in page:
            if inst.state == "TERMINATING":
                del self.instances[inst.id]   # listed terminating once, then gone
        return answer

    def _terminate(self, p: dict) -> dict:
        ids = p.get("InstanceIds") or []
        if not 0 < len(ids) <= 100:
            raise Refused("InvalidParameterValue", "InstanceIds: 1 to 100 ids")
        for i in ids:
            if i not in self.instances:
                raise Refused("InvalidInstanceId.NotFound", f"no instance {i}")
            if self.instances[i].state == "TERMINATING":
                raise Refused("UnsupportedOperation.InstanceStateTerminating", f"{i} is being terminated")
        for i in ids:
            self.instances[i].state = "TERMINATING"
            self.terminated.append(i)
        return {}


# --- Secrets Manager (API version 2019-09-23) on FakeApi3 -------------------------------------------------

class FakeSsm:
    """Secrets Manager, written from Tencent's API documentation: GetSecretValue (SecretName, VersionId; answers
    SecretName, VersionId and SecretBinary (base64) or SecretString) and PutSecretValue (a new version:
    VersionId of letters, digits, '-' and '_' up to 64 characters starting with a letter or digit, and
    SecretBinary or SecretString). Error codes: ResourceNotFound.SecretNotExist (no such secret),
    ResourceNotFound (no such version), ResourceInUse.VersionIdExists, InvalidParameterValue.

    ``before_put(params)`` runs before a PutSecretValue is applied (a racing writer)."""

    VERSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

    def __init__(self):
        self.secrets: dict[str, dict[str, dict[str, str]]] = {}   # name -> version -> {"SecretBinary"|"SecretString"}
        self.before_put = None
        self._lock = threading.Lock()

    def install(self, api: FakeApi3) -> "FakeSsm":
        api.versions["ssm"] = SSM_VERSION
        api.handlers[("ssm", "GetSecretValue")] = self._get
        api.handlers[("ssm", "PutSecretValue")] = self._put
        return self

    def create(self, name: str, version: str = "init", text: str = "unset") -> None:
        """The stack's secret, as the infra creates it: an initial version holding a placeholder."""
        with self._lock:
            self.secrets[name] = {version: {"SecretString": text}}

    def put_binary(self, name: str, version: str, data: bytes) -> None:
        with self._lock:
            self.secrets[name][version] = {"SecretBinary": base64.b64encode(data).decode()}

    def _secret(self, p: dict) -> dict:
        if p.get("SecretName") not in self.secrets:
            raise Refused("ResourceNotFound.SecretNotExist", f"secret {p.get('SecretName')!r} does not exist")
        return self.secrets[p["SecretName"]]

    def _get(self, p: dict) -> dict:
        with self._lock:
            versions = self._secret(p)
            value = versions.get(p.get("VersionId"))
            if value is None:
                raise Refused("ResourceNotFound", f"version {p.get('VersionId')!r} does not exist")
            return {"SecretName": p["SecretName"], "VersionId": p["VersionId"], "SecretBinary": "",
                    "SecretString": "", **value}

    def _put(self, p: dict) -> dict:
        if self.before_put:
            self.before_put(p)
        with self._lock:
            versions = self._secret(p)
            version = p.get("VersionId") or ""
            if not self.VERSION_ID.match(version):
                raise Refused("InvalidParameterValue", f"VersionId {version!r}")
            if bool(p.get("SecretBinary")) == bool(p.get("SecretString")):
                raise Refused("InvalidParameterValue", "give either SecretBinary or SecretString")
            if p.get("SecretBinary"):
                try:
                    base64.b64decode(p["SecretBinary"], validate=True)
                except ValueError:
                    raise Refused("InvalidParameterValue", "SecretBinary is not base64") from None
            if version in versions:
                raise Refused("ResourceInUse.VersionIdExists", f"version {version!r} already exists")
            versions[version] = {k: p[k] for k in ("SecretBinary", "SecretString") if p.get(k)}
            return {"SecretName": p["SecretName"], "VersionId": version}


STS_VERSION = "2018-08-13"


class FakeSts:
    """STS AssumeRole, written from Tencent's API documentation (version 2018-08-13): RoleArn
    (``qcs::cam::uin/<uin>:roleName/<name>`` or ``...:role/<id>``), RoleSessionName (2-128 of ``[\\w+=,.@-]``),
    DurationSeconds (at most 43200, default 7200) and Policy (a CAM policy, URL-encoded once, without a principal);
    answers Credentials {Token, TmpSecretId, TmpSecretKey}, ExpiredTime (Unix time) and Expiration (ISO 8601).
    Each answer is a fresh key; ``issued`` holds (session name, the decoded policy) of each."""

    ROLE_ARN = re.compile(r"qcs::cam::uin/\d+:(roleName/[\w+=,.@-]+|role/\d+)\Z")
    SESSION = re.compile(r"[\w+=,.@-]{2,128}\Z")

    def __init__(self, roles: tuple[str, ...]):
        self.roles = set(roles)
        self.issued: list[tuple[str, dict | None]] = []

    def install(self, api: FakeApi3) -> "FakeSts":
        api.versions["sts"] = STS_VERSION
        api.handlers[("sts", "AssumeRole")] = self._assume
        return self

    def _assume(self, p: dict) -> dict:
        from urllib.parse import unquote

        arn, session, duration = p.get("RoleArn", ""), p.get("RoleSessionName", ""), p.get("DurationSeconds", 7200)
        if not self.ROLE_ARN.match(arn) or not self.SESSION.match(session):
            raise Refused("InvalidParameter", f"RoleArn {arn!r} or RoleSessionName {session!r}")
        if not isinstance(duration, int) or not 0 < duration <= 43200:
            raise Refused("InvalidParameter.DurationSecondsInvalid", str(duration))
        if arn not in self.roles:
            raise Refused("InvalidParameter.RoleNotExist", arn)
        policy = None
        if "Policy" in p:
            try:
                policy = json.loads(unquote(p["Policy"]))
            except ValueError:
                raise Refused("InvalidParameter.PolicyFormatError", "not a URL-encoded JSON policy") from None
            if "principal" in json.dumps(policy) or policy.get("version") != "2.0":
                raise Refused("InvalidParameter.PolicyFormatError", "a policy of version 2.0, without principal")
        self.issued.append((session, policy))
        expires = int(time.time()) + duration
        n = len(self.issued)
        return {"Credentials": {"Token": f"job-token-{n}", "TmpSecretId": f"AKIDjob{n}", "TmpSecretKey": f"jobkey{n}"},
                "ExpiredTime": expires,
                "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))}
