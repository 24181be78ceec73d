"""Registry logins for container jobs: which registry an image comes from, the node's credentials for it, and
the private docker config directory a job's docker commands read them from.

Nodes pull job images from the stack's registry with the node's own identity (no credential helper, no
`docker login` into a shared config): the platform (trainer.node.platform) turns the identity into docker
credentials for the image's registry host (AWS: ECR GetAuthorizationToken through the instance role; Azure:
the managed identity's token exchanged for an ACR refresh token), cached until shortly before they expire.
The job's task hands them to the container launcher (trainer.node.container), which writes them into a directory
of its own (0700, ``config.json`` with ``auths``), points the pull's ``DOCKER_CONFIG`` at it and removes it before
the container starts.

The derivations (:func:`image_host`, :func:`ecr_region`, :func:`is_acr`, :func:`docker_config`,
:func:`jwt_expiry`) are pure.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("gpufleet.registry")

REFRESH_MARGIN_S = 900   # a cached login is renewed this long before it expires (ECR's last 12 h, ACR's 3 h)
ACR_USER = "00000000-0000-0000-0000-000000000000"  # the user name an ACR refresh token logs in with
_ECR_HOST = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?\Z")
_ACR_HOST = re.compile(r"^[a-z0-9]{5,50}\.azurecr\.io\Z")


@dataclass(frozen=True)
class RegistryLogin:
    """Docker credentials for one registry host, valid until ``expires_at`` (epoch seconds)."""

    host: str
    username: str
    password: str
    expires_at: float

    def __repr__(self) -> str:  # never the password in a log line
        return f"RegistryLogin(host={self.host!r}, username={self.username!r}, expires_at={self.expires_at:.0f})"


def image_host(ref: str) -> str | None:
    """The registry host of an image reference as docker reads it (the first path component when it has a
    '.' or ':' or is 'localhost'), or None for an image of Docker Hub or a local name."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first.lower()
    return None


def ecr_region(host: str | None) -> str | None:
    """The region of an ECR registry host `<account>.dkr.ecr.<region>.amazonaws.com[.cn]`, else None."""
    m = _ECR_HOST.match(host or "")
    return m.group(2) if m else None


def is_acr(host: str | None) -> bool:
    """Whether the host is an Azure container registry's login server `<name>.azurecr.io`."""
    return bool(_ACR_HOST.match(host or ""))


def docker_config(logins: list[RegistryLogin]) -> dict:
    """The config.json docker reads credentials from: ``auths`` of base64 `user:password` per host."""
    return {"auths": {login.host: {"auth": base64.b64encode(f"{login.username}:{login.password}".encode()).decode()}
                      for login in logins}}


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (epoch seconds), or None when the token is not one."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


def write_config_dir(path: Path, logins: list[RegistryLogin]) -> Path:
    """A private docker config directory (0700) holding ``config.json`` (0600) with these logins."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)  # whatever the umask
    fd = os.open(path / "config.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(docker_config(logins), f)
    return path


class LoginCache:
    """Logins per host, fetched again once less than REFRESH_MARGIN_S of their life is left."""

    def __init__(self, margin_s: float = REFRESH_MARGIN_S, clock: Callable[[], float] = time.time):
        self.margin_s, self.clock = margin_s, clock
        self._logins: dict[str, RegistryLogin] = {}
        self._lock = threading.Lock()

    def get(self, host: str, fetch: Callable[[], RegistryLogin]) -> RegistryLogin:
        with self._lock:
            login = self._logins.get(host)
            if login is None or login.expires_at - self.clock() < self.margin_s:
                login = self._logins[host] = fetch()
            return login
