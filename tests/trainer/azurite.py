"""Azurite (the Azure Storage emulator, npm) on 127.0.0.1 with ports the OS picks, in memory.

`with Azurite() as az:` yields the running emulator; `az.connection_string` is what
AZURE_STORAGE_CONNECTION_STRING takes. The process (its own session) is killed on exit.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "node_modules" / ".bin" / "azurite"
ACCOUNT = "devstoreaccount1"
# Azurite's fixed, public development key (documented by Microsoft; not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_LISTENING = re.compile(r"Azurite (Blob|Queue) service is successfully listening at (http://\S+)")


class Azurite:
    def __init__(self, start_timeout_s: float = 30.0):
        self.start_timeout_s = start_timeout_s
        self.endpoints: dict[str, str] = {}
        self.output: list[str] = []
        self._ready = threading.Event()
        self._proc: subprocess.Popen | None = None

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoints['Blob']}/{ACCOUNT};QueueEndpoint={self.endpoints['Queue']}/{ACCOUNT};")

    def _read(self) -> None:
        for line in self._proc.stdout:
            self.output.append(line.rstrip())
            m = _LISTENING.search(line)
            if m:
                self.endpoints[m.group(1)] = m.group(2)
                if len(self.endpoints) == 2:
                    self._ready.set()
        self._ready.set()  # exited: let the waiter see it

    def __enter__(self) -> "Azurite":
        self._proc = subprocess.Popen(
            [str(BINARY), "--silent", "--inMemoryPersistence", "--extentMemoryLimit", "256",
             "--skipApiVersionCheck", "--loose", "--disableTelemetry",
             "--blobHost", "127.0.0.1", "--blobPort", "0", "--queueHost", "127.0.0.1", "--queuePort", "0",
             "--tableHost", "127.0.0.1", "--tablePort", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(self.start_timeout_s) or len(self.endpoints) < 2:
            self.__exit__()
            raise RuntimeError("Azurite did not start:\n" + "\n".join(self.output[-20:]))
        return self

    def __exit__(self, *exc) -> None:
        if self._proc and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
