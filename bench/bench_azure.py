"""Azure figures, on Pulumi's mock runtime and against Azurite on loopback.

- azure_program_mock_s: the Azure stack program on the mock runtime (what each preview and test pays).
- azure_queue_cycle_ms: one job message's receive, extend (new pop receipt) and delete, mean over 50.
- azure_blob_roundtrip_MBps: a 32 MiB checkpoint file up and down through AzureBlobStore. Azurite is
  a single Node process, so this measures the adapter's overhead on top of it, not Azure's bandwidth.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024


def _program_s() -> float:
    from tests.infra.azure.conftest import azure_config, run_stack

    cfg = azure_config()
    run_stack(cfg)  # imports and first-run costs out of the way
    started = time.perf_counter()
    run_stack(cfg)
    return time.perf_counter() - started


def run() -> dict[str, dict]:
    from tests.trainer.azurite import ACCOUNT, Azurite
    from trainer.clouds.azure import AzureJobQueue
    from trainer.loop.storage import open_store

    figures = {"azure_program_mock_s": {"value": _program_s(), "unit": "s", "target": "< 3"}}
    saved = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    with Azurite() as az, tempfile.TemporaryDirectory() as tmp:
        from azure.storage.blob import BlobServiceClient
        from azure.storage.queue import QueueServiceClient

        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = az.connection_string
        try:
            QueueServiceClient.from_connection_string(az.connection_string).create_queue("bench")
            queue = AzureJobQueue(f"https://{ACCOUNT}.queue.core.windows.net/bench")
            rounds = 50
            for i in range(rounds):
                queue.send(f"job-{i}")
            started = time.perf_counter()
            for _ in range(rounds):
                msg = queue.receive(wait_s=0)
                queue.extend(msg, 600)
                queue.delete(msg)
            figures["azure_queue_cycle_ms"] = {"value": (time.perf_counter() - started) / rounds * 1000,
                                               "unit": "ms", "target": "< 50 (Azurite)"}

            BlobServiceClient.from_connection_string(az.connection_string).create_container("bench")
            src, dst = Path(tmp, "src.bin"), Path(tmp, "dst.bin")
            src.write_bytes(os.urandom(32 * MiB))
            store = open_store("az://bench/ckpt")
            started = time.perf_counter()
            store.upload_file("model.pt", src)
            store.download_file("model.pt", dst)
            figures["azure_blob_roundtrip_MBps"] = {"value": 64 / (time.perf_counter() - started),
                                                    "unit": "MiB/s", "target": "> 5 (Azurite)"}
        finally:
            if saved is None:
                os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
            else:
                os.environ["AZURE_STORAGE_CONNECTION_STRING"] = saved
    return figures
