"""A fault-injecting HTTP proxy on loopback in front of moto server: real requests, real responses, and on the
requests a rule matches, a fault instead (an error status, or a body cut short with a Content-Length that
agrees with it and no checksum header: a lying, truncated body that only a size or hash check can catch).

    with FaultProxy(moto_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.add(Fault("truncate", method="GET", path="/bucket/key", times=1))
"""
from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

from infra.demo.loopback_http import LoopbackServer, QuietHandler

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}


@dataclass
class Fault:
    kind: str                 # "error" (status with an S3/SQS-style error body) or "truncate" (half the body)
    method: str | None = None
    path: str | None = None   # a substring of the request path
    target: str | None = None  # a substring of the X-Amz-Target header (SQS JSON: "ChangeMessageVisibility")
    times: int | None = None  # None: every matching request
    status: int = 500
    hits: int = 0

    def matches(self, method: str, path: str, target: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return ((self.method is None or self.method == method) and (self.path is None or self.path in path)
                and (self.target is None or self.target in target))


class FaultProxy:
    def __init__(self, upstream: str):
        up = urlparse(upstream)
        self.upstream_url = upstream
        self.upstream = (up.hostname, up.port)
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _any(self) -> None:
                body = self._body()
                fault = proxy.take(self.command, self.path, self.headers.get("X-Amz-Target", ""))
                if fault and fault.kind == "error":
                    if self.headers.get("X-Amz-Target"):  # the JSON protocol (SQS)
                        self._reply(fault.status, '{"__type": "InternalError", "message": "injected fault"}',
                                    "application/x-amz-json-1.0")
                    else:
                        self._reply(fault.status, "<Error><Code>InternalError</Code><Message>injected fault"
                                    "</Message></Error>", "application/xml")
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if fault and fault.kind == "truncate" and data:
                    data = data[: len(data) // 2]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in HOP or (fault and k.lower().startswith("x-amz-checksum")):
                        continue
                    if fault and k.lower() == "content-range":
                        continue
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = LoopbackServer(Handler)

    def take(self, method: str, path: str, target: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, path, target):
                    fault.hits += 1
                    return fault
        return None

    def add(self, fault: Fault) -> Fault:
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def __enter__(self) -> "FaultProxy":
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)
