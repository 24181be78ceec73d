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
  handlers the test registers.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
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
