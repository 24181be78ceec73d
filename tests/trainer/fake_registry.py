"""A private registry on 127.0.0.1 (Docker Registry HTTP API v2, read side, with basic auth), written from the
distribution spec, serving one tiny image made here: /bin/sh (dash) and the C library, one gzipped layer, a
schema-2 manifest. Docker treats 127.0.0.0/8 as an insecure registry, so the daemon pulls over plain HTTP.

Every request without the right `Authorization: Basic` gets 401 with `WWW-Authenticate: Basic realm=...`, as a
registry that needs a login answers; ``seen`` records (method, path, Authorization header) of each request.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import threading
from pathlib import Path

from infra.demo.loopback_http import LoopbackServer, QuietHandler

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
FILES = ("/bin/sh", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tiny_image() -> tuple[bytes, dict[str, bytes]]:
    """(manifest, blobs by digest) of an image whose /bin/sh runs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "lib", "lib/x86_64-linux-gnu", "lib64", "tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path in FILES:
            data = Path(os.path.realpath(path if path != "/bin/sh" else "/bin/dash")).read_bytes()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    layer_tar = buf.getvalue()
    layer = gzip.compress(layer_tar, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [_digest(layer_tar)]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"mediaType": CONFIG, "size": len(config), "digest": _digest(config)},
                           "layers": [{"mediaType": LAYER, "size": len(layer), "digest": _digest(layer)}]}).encode()
    return manifest, {_digest(config): config, _digest(layer): layer}


class FakeRegistry(LoopbackServer):
    def __init__(self, username: str, password: str, repository: str = "gpufleet/job", tag: str = "1"):
        self.auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.repository, self.tag = repository, tag
        self.manifest, self.blobs = tiny_image()
        self.seen: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def image(self) -> str:
        return f"{self.host}/{self.repository}:{self.tag}"

    def _handler(self):
        fake = self
        manifests = re.compile(rf"^/v2/{re.escape(fake.repository)}/manifests/(.+)$")
        blobs = re.compile(rf"^/v2/{re.escape(fake.repository)}/blobs/(sha256:[0-9a-f]{{64}})$")

        class Handler(QuietHandler):
            def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _serve(self):
                auth = self.headers.get("Authorization")
                with fake._lock:
                    fake.seen.append((self.command, self.path, auth))
                if auth != fake.auth:
                    err = json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]})
                    return self._send(401, err.encode(), {"WWW-Authenticate": 'Basic realm="fake-registry"',
                                                          "Content-Type": "application/json",
                                                          "Docker-Distribution-API-Version": "registry/2.0"})
                if self.path == "/v2/":
                    return self._send(200, b"{}", {"Content-Type": "application/json",
                                                   "Docker-Distribution-API-Version": "registry/2.0"})
                m = manifests.match(self.path)
                if m and m.group(1) in (fake.tag, _digest(fake.manifest)):
                    return self._send(200, fake.manifest, {"Content-Type": MANIFEST,
                                                           "Docker-Content-Digest": _digest(fake.manifest)})
                m = blobs.match(self.path)
                if m and m.group(1) in fake.blobs:
                    return self._send(200, fake.blobs[m.group(1)], {"Content-Type": "application/octet-stream",
                                                                    "Docker-Content-Digest": m.group(1)})
                err = json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "not here"}]})
                self._send(404, err.encode(), {"Content-Type": "application/json"})

            do_GET = do_HEAD = _serve

        return Handler
