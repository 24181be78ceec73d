"""Checkpoint store on Azure Blob Storage: ``az://container/prefix`` or
``https://<account>.blob.core.windows.net/<container>/<prefix>``.

A blob upload commits at once (single put or block-list commit), so readers never see half a blob.
Large files go up and down in parallel blocks; azure-core retries transient errors with backoff.
Credentials and endpoints: see ``trainer.azure_auth``.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

from trainer.azure_auth import connection_string, credential, default_account
from trainer.errors import UsageError
from trainer.storage import MiB, Store

BLOB_HOST = ".blob.core.windows.net"
CONCURRENCY = 8


def parse_uri(uri: str) -> tuple[str | None, str, str]:
    """(account or None for az://, container, prefix ending in '/' or '')."""
    parsed = urlparse(uri)
    if parsed.scheme == "az":
        account, container, path = None, parsed.netloc, parsed.path
    elif parsed.scheme == "https" and (parsed.hostname or "").endswith(BLOB_HOST):
        account = parsed.hostname[: -len(BLOB_HOST)]
        container, _, path = parsed.path.lstrip("/").partition("/")
    else:
        raise UsageError(f"checkpoint URI {uri!r}: expected az://container/prefix or "
                         f"https://<account>{BLOB_HOST}/<container>/<prefix>")
    if not container:
        raise UsageError(f"checkpoint URI {uri!r}: missing container")
    prefix = path.strip("/")
    return account, container, prefix + "/" if prefix else ""


class AzureBlobStore(Store):
    def __init__(self, container_client, prefix: str, uri: str) -> None:
        self.container = container_client
        self.prefix = prefix
        self.uri = uri

    def _name(self, key: str) -> str:
        return self.prefix + key

    def write_bytes(self, key: str, data: bytes) -> None:
        self.container.upload_blob(self._name(key), data, overwrite=True, max_concurrency=CONCURRENCY)

    def read_bytes(self, key: str) -> bytes:
        return self._download(key).readall()

    def upload_file(self, key: str, path: str | os.PathLike) -> None:
        with open(path, "rb") as src:
            self.container.upload_blob(self._name(key), src, overwrite=True, max_concurrency=CONCURRENCY)

    def download_file(self, key: str, path: str | os.PathLike) -> None:
        stream = self._download(key)  # raises before the target file is touched
        with open(path, "wb") as out:
            stream.readinto(out)

    def _download(self, key: str):
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self.container.download_blob(self._name(key), max_concurrency=CONCURRENCY)
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(f"{self.uri}{key}") from exc

    def list(self, prefix: str = "") -> list[str]:
        names = self.container.list_blob_names(name_starts_with=self._name(prefix))
        return sorted(name[len(self.prefix):] for name in names)

    def delete(self, key: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self.container.delete_blob(self._name(key))
        except ResourceNotFoundError:
            pass

    def exists(self, key: str) -> bool:
        return self.container.get_blob_client(self._name(key)).exists()


def open_azure_store(uri: str) -> AzureBlobStore:
    from azure.storage.blob import BlobServiceClient

    account, container, prefix = parse_uri(uri)
    options = {"max_block_size": 8 * MiB, "max_single_put_size": 16 * MiB, "max_chunk_get_size": 8 * MiB}
    conn = connection_string(account)
    if conn:
        service = BlobServiceClient.from_connection_string(conn, **options)
    else:
        account = account or default_account()
        if not account:
            raise UsageError(f"checkpoint URI {uri!r}: az:// needs the storage account in AZURE_STORAGE_ACCOUNT "
                             "(or AZURE_STORAGE_CONNECTION_STRING)")
        service = BlobServiceClient(f"https://{account}{BLOB_HOST}", credential=credential(), **options)
    return AzureBlobStore(service.get_container_client(container), prefix, uri.rstrip("/") + "/")
