"""Object stores for checkpoints: local directories and S3 (any S3-compatible endpoint via AWS_ENDPOINT_URL).

`open_store(uri)` picks the implementation; keys are relative to the URI's prefix and use "/".
A missing key raises FileNotFoundError on every store.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from trainer.errors import UsageError

MiB = 1024 * 1024


class Store:
    """The store API the trainer, agent and Azure adapter share."""

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

    def exists(self, key: str) -> bool:
        raise NotImplementedError


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
                copy(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        for parent in path.parents:  # drop directories the delete left empty, up to the root
            if parent == self.root or any(parent.iterdir()):
                break
            parent.rmdir()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


class S3Store(Store):
    """s3://bucket/prefix through boto3: multipart transfers (TransferConfig) and botocore's standard retries."""

    def __init__(self, bucket: str, prefix: str, *, client=None) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}"
        self.client = client or boto3.client(
            "s3", config=Config(retries={"mode": "standard", "total_max_attempts": 10}, max_pool_connections=32)
        )
        self.transfer = TransferConfig(
            multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB, max_concurrency=16, use_threads=True
        )

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _missing(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("404", "NoSuchKey", "NotFound")

    def write_bytes(self, key: str, data: bytes) -> None:
        self.client.upload_fileobj(io.BytesIO(data), self.bucket, self._key(key), Config=self.transfer)

    def read_bytes(self, key: str) -> bytes:
        buf = io.BytesIO()
        self._download(key, buf)
        return buf.getvalue()

    def upload_file(self, key: str, path: str | os.PathLike) -> None:
        self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer)

    def download_file(self, key: str, path: str | os.PathLike) -> None:
        with open(path, "wb") as out:
            self._download(key, out)

    def _download(self, key: str, fileobj) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.download_fileobj(self.bucket, self._key(key), fileobj, Config=self.transfer)
        except ClientError as exc:
            if self._missing(exc):
                raise FileNotFoundError(f"{self.uri}{key}") from exc
            raise

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        for page in pages:
            keys.extend(obj["Key"][len(self.prefix):] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if self._missing(exc):
                return False
            raise
        return True


def open_store(uri: str) -> Store:
    """A store for a local path, file://, s3://bucket/prefix, az://container/prefix or an Azure blob https URL."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "s3":
        if not parsed.netloc:
            raise UsageError(f"checkpoint URI {uri!r}: missing bucket; expected s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path)
    if scheme == "az" or (scheme == "https" and parsed.netloc.endswith(".blob.core.windows.net")):
        from trainer.azure_blob import open_azure_store

        return open_azure_store(uri)
    if scheme == "file":
        return LocalStore(parsed.path)
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        if not uri:
            raise UsageError("checkpoint URI is empty; expected a path, file://, s3://, az:// or an Azure blob URL")
        return LocalStore(uri)
    raise UsageError(
        f"checkpoint URI {uri!r}: unsupported scheme {scheme!r}; expected a path, file://, s3://bucket/prefix, "
        "az://container/prefix or https://<account>.blob.core.windows.net/<container>/<prefix>"
    )
