"""An object store over S3's API through boto3 (trainer.loop.storage's Store): AWS S3, and Tencent COS through
its S3-compatible endpoint (trainer.clouds.tencent). S3's errors become the Store's in one place (``_errors``).
"""
from __future__ import annotations

import contextlib
import io
import os

from trainer.loop.storage import Conflict, MiB, Store


class S3Store(Store):
    """s3://bucket/prefix through boto3: multipart transfers (TransferConfig) and botocore's standard retries.

    Conditional writes are S3's own (PutObject with If-Match: <ETag> or If-None-Match: *); ``conditional``
    False (Tencent COS, which documents no If-Match on PUT Object) makes ``write_if`` a plain write.
    """

    conditional = True

    def __init__(self, bucket: str, prefix: str, *, client=None) -> None:
        import boto3  # lazy: AWS SDK (~0.2 s) only when used
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

    def dcp_writer(self, key: str):
        """Sharded checkpoints through s3torchconnector's DCP writer (the AWS CRT), when it is installed;
        None: the trainer's DCP writer over this store (boto3)."""
        crt = self._crt_client()
        if crt is None:
            return None
        from s3torchconnector.dcp import S3StorageWriter  # lazy: s3-dcp extra
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        writer = S3StorageWriter(crt.region, f"s3://{self.bucket}/{self._key(key)}", thread_count=4)
        writer.fs = S3FileSystem(crt.region, s3_client=crt)  # the writer takes no endpoint of its own
        return writer

    def dcp_reader(self, key: str):
        crt = self._crt_client()
        if crt is None:
            return None
        from s3torchconnector.dcp import S3StorageReader  # lazy: s3-dcp extra
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        reader = S3StorageReader(crt.region, f"s3://{self.bucket}/{self._key(key)}")
        reader.fs = S3FileSystem(crt.region, s3_client=crt, reader_constructor=reader._reader_constructor)
        return reader

    def _crt_client(self):
        """An s3torchconnector client in boto3's region, at AWS_ENDPOINT_URL(_S3) when set; None if not installed."""
        try:
            import s3torchconnector.dcp  # noqa: F401  # lazy: s3-dcp extra (None without it)
            from s3torchconnector import S3ClientConfig
            from s3torchconnector._s3client import S3Client
        except ImportError:
            return None
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return S3Client(self.client.meta.region_name, endpoint=endpoint,
                        s3client_config=S3ClientConfig(force_path_style=bool(endpoint)))

    @contextlib.contextmanager
    def _errors(self, key: str, conditional: bool = False, missing_is_conflict: bool = False):
        """S3's errors as the Store interface's: a missing object (404, NoSuchKey, NotFound) is FileNotFoundError,
        or a Conflict where ``missing_is_conflict`` (an If-Match on a deleted object); for a ``conditional`` write,
        412 PreconditionFailed (changed, or present for a create) and 409 ConditionalRequestConflict (a concurrent
        conditional write won) are a Conflict. Anything else is raised as it is."""
        from botocore.exceptions import ClientError  # lazy: AWS SDK (~0.2 s) only when used

        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            missing = error.get("Code", "") in ("404", "NoSuchKey", "NotFound")
            if (conditional and status in (409, 412)) or (missing and missing_is_conflict):
                raise Conflict(f"{self.uri}{key}: {error.get('Code', status)}") from None
            if missing:
                raise FileNotFoundError(f"{self.uri}{key}") from exc
            raise

    def write_bytes(self, key: str, data: bytes) -> None:
        if len(data) < self.transfer.multipart_threshold:  # one PUT, on this thread (Ctrl-C stops it at once)
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
            return
        self.client.upload_fileobj(io.BytesIO(data), self.bucket, self._key(key), Config=self.transfer)

    def read_bytes(self, key: str) -> bytes:
        """Small objects in one GET on this thread; large ones in parallel ranged GETs."""
        with self._errors(key):
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        if resp["ContentLength"] < self.transfer.multipart_threshold:
            return resp["Body"].read()  # botocore checks the length it reads against ContentLength
        resp["Body"].close()
        buf = io.BytesIO()
        self._download(key, buf)
        return buf.getvalue()

    def upload_file(self, key: str, path: str | os.PathLike) -> None:
        self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer)

    def download_file(self, key: str, path: str | os.PathLike) -> None:
        with open(path, "wb") as out:
            self._download(key, out)

    def _download(self, key: str, fileobj) -> None:
        with self._errors(key):
            self.client.download_fileobj(self.bucket, self._key(key), fileobj, Config=self.transfer)

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        for page in pages:
            keys.extend(obj["Key"][len(self.prefix):] for obj in page.get("Contents", []))
        return sorted(keys)

    def children(self, prefix: str) -> list[str]:
        names = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(prefix), Delimiter="/")
        for page in pages:
            names.extend(p["Prefix"][len(self._key(prefix)):].rstrip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def exists(self, key: str) -> bool:
        try:
            with self._errors(key):
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return False
        return True

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        with self._errors(key):
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        return resp["Body"].read(), resp["ETag"]

    def write_if(self, key: str, data: bytes, version: str | None) -> str:
        """A Conflict when the object changed since ``version`` (None: when it exists); see _errors."""
        condition = {} if not self.conditional else {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        with self._errors(key, conditional=True, missing_is_conflict=version is not None):
            resp = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
        return resp["ETag"]
