"""Object stores for checkpoints: the Store interface, local directories, and the registry of the clouds' stores
(trainer.clouds.<cloud>.open_store: S3 and any S3-compatible endpoint, Azure Blob, Tencent COS).

`open_store(uri)` picks the implementation; keys are relative to the URI's prefix and use "/".
A missing key raises FileNotFoundError on every store.

Conditional writes (job records): ``read_versioned(key)`` gives the object and its version, an opaque string
that changes whenever the object does (S3's ETag, Blob's ETag, a local file's SHA-256); ``write_if(key, data,
version)`` writes only while the object is still at that version (``None``: only while it is absent) and raises
:class:`Conflict` otherwise, so two read-modify-write cycles never lose each other's update.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from trainer.clouds import adapter
from trainer.errors import UsageError

MiB = 1024 * 1024
LEFTOVER_AGE_S = 60  # a temporary file untouched this long, and unlocked, is a killed write's


class Conflict(Exception):
    """A conditional write found the object changed since the version it was given (or present, for a create)."""


class Store:
    """The store API the trainer, the job records, the code bundles and the clouds' adapters share."""

    uri: str

    def write_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def read_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def upload_file(self, key: str, path: str | os.PathLike) -> None:
        raise NotImplementedError

    def download_file(self, key: str, path: str | os.PathLike) -> None:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        """Keys under prefix, sorted."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove key; a missing key is not an error."""
        raise NotImplementedError

    def children(self, prefix: str) -> list[str]:
        """The names one level below ``prefix`` (ending in "/") that hold keys, sorted: ``children("jobs/")``
        lists the job ids without listing their checkpoints. Stores with a delimiter listing override this."""
        return sorted({k[len(prefix):].split("/", 1)[0] for k in self.list(prefix) if "/" in k[len(prefix):]})

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The object and its version; FileNotFoundError when it is missing."""
        raise NotImplementedError

    def write_if(self, key: str, data: bytes, version: str | None) -> str:
        """Write ``data`` only if the object is still at ``version`` (None: only if absent); its new version.
        Conflict when it is not."""
        raise NotImplementedError

    def free_bytes(self) -> int | None:
        """Room left for new keys where the store has a limit (a local disk), else None."""
        return None

    def clean_leftovers(self) -> list[str]:
        """Remove what a killed writer left behind (not another process's write in progress); the names removed."""
        return []


class LocalStore(Store):
    """A directory. Writes go to a temporary file, are fsynced and renamed, so readers never see half a file."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"key {key!r} escapes the store root {self.root}")
        return path

    def _atomic_write(self, key: str, copy) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                fcntl.flock(out, fcntl.LOCK_EX)  # held while written: clean_leftovers skips a locked .tmp file
                copy(out)
                out.flush()
                os.fsync(out.fileno())
                if path.is_dir() and not path.is_symlink():  # a directory where the file goes (a corrupted
                    shutil.rmtree(path)                      # checkpoint passed over): the write replaces it
                os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def write_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda out: out.write(data))

    def read_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def upload_file(self, key: str, path: str | os.PathLike) -> None:
        with open(path, "rb") as src:
            self._atomic_write(key, lambda out: shutil.copyfileobj(src, out, 16 * MiB))

    def download_file(self, key: str, path: str | os.PathLike) -> None:
        shutil.copyfile(self._path(key), path)

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        keys = []
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                if name.startswith(".") and name.endswith((".tmp", ".lock")):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def children(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        for parent in path.parents:  # drop directories the delete left empty, up to the root
            if parent == self.root or any(parent.iterdir()):
                break
            parent.rmdir()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        data = self._path(key).read_bytes()
        return data, hashlib.sha256(data).hexdigest()

    def write_if(self, key: str, data: bytes, version: str | None) -> str:
        """Check and write under an exclusive lock of the file's lock file (``.<name>.lock`` beside it), so a
        writer of another process cannot slip in between; the write itself is atomic (rename)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                current = None
            if current != version:
                raise Conflict(f"{self.uri}/{key}: at version {current}, not {version}")
            self.write_bytes(key, data)
        return hashlib.sha256(data).hexdigest()

    def free_bytes(self) -> int | None:
        existing = next((p for p in (self.root, *self.root.parents) if p.exists()), self.root)
        return shutil.disk_usage(existing).free

    def clean_leftovers(self) -> list[str]:
        """Temporary files of writes that were killed: those no live writer holds the lock of."""
        removed = []
        if not self.root.is_dir():
            return removed
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                if not (name.startswith(".") and name.endswith(".tmp")):
                    continue
                path = Path(dirpath, name)
                try:
                    if time.time() - path.stat().st_mtime < LEFTOVER_AGE_S:  # may be a write just starting
                        continue
                    with open(path, "rb") as f:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live writer holds it: not ours to touch
                        path.unlink()
                except (BlockingIOError, FileNotFoundError):
                    continue
                removed.append(path.relative_to(self.root).as_posix())
        return removed


# Object-store URIs of the clouds: scheme (or https host suffix) -> the trainer.clouds module that opens them.
SCHEMES = {"s3": "aws", "az": "azure", "cos": "tencent"}
HTTPS_HOSTS = {".blob.core.windows.net": "azure"}


def store_cloud(uri: str) -> str | None:
    """The cloud whose store serves ``uri``, or None for a local path."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "https":
        return next((c for suffix, c in HTTPS_HOSTS.items() if (parsed.hostname or "").endswith(suffix)), None)
    return SCHEMES.get(scheme)


def local_path(uri: str) -> str:
    """The directory a path or ``file:///abs/path`` names; UsageError for a URI of no store, or a file:// host."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):  # file://relative/x: 'relative' is a host, the path /x
            raise UsageError(f"{uri!r}: a file:// URI names no host; write file:///absolute/path "
                             f"(or the plain path {parsed.netloc + parsed.path!r})")
        return parsed.path
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        if not uri:
            raise UsageError("checkpoint URI is empty; expected a path, file://, s3://, az://, an Azure blob URL "
                             "or cos://")
        return uri
    raise UsageError(
        f"checkpoint URI {uri!r}: unsupported scheme {scheme!r}; expected a path, file://, s3://bucket/prefix, "
        "az://container/prefix, https://<account>.blob.core.windows.net/<container>/<prefix> or "
        "cos://<bucket>-<appid>/<prefix>"
    )


def open_store(uri: str) -> Store:
    """A store for a local path, file:///abs, s3://bucket/prefix, az://container/prefix, an Azure blob https URL or
    cos://bucket/prefix."""
    cloud = store_cloud(uri)
    if cloud:
        return adapter(cloud).open_store(uri)
    return LocalStore(local_path(uri))
