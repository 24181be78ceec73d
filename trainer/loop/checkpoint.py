"""Checkpoints in a Store, written with a commit protocol.

Layout under the checkpoint URI, for step N (zero-padded to 9 digits):
  step-N/<part>    the parts (serialized state), written first;
  step-N.json      the manifest, written last: {"format", "step", "parts": {name: {"sha256", "bytes"}}}.
A checkpoint exists only once its manifest does, so a crash mid-save leaves nothing that looks valid.
Loading checks every part's size and SHA-256; a corrupt newest checkpoint is skipped with a warning
and the previous one is used. After each commit only the newest `keep` checkpoints remain.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from trainer.loop.storage import Store

log = logging.getLogger("trainer")
MANIFEST = re.compile(r"^step-(\d{9})\.json$")
FORMAT = 1


class CorruptCheckpoint(Exception):
    """A committed checkpoint whose manifest or parts do not check out."""


def to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()  # releases the GIL: runs alongside the upload


def _name(step: int) -> str:
    return f"step-{step:09d}"


class Checkpointer:
    """The checkpoints under one Store: save, list, verify, load, prune."""

    def __init__(self, store: Store, keep: int) -> None:
        self.store = store
        self.keep = keep

    def steps(self) -> list[int]:
        """Committed steps, newest first."""
        found = (MANIFEST.match(key) for key in self.store.list("step-"))
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def save(self, step: int, parts: dict[str, object]) -> None:
        """Write all parts, then the manifest (the commit), then drop old checkpoints.

        A bytes part is stored as given, any other object as torch.save bytes. Parts are serialized
        and written concurrently and each is hashed while it uploads, so the transfer dominates.
        """
        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            written = {name: pool.submit(self._put, f"{_name(step)}/{name}", obj) for name, obj in parts.items()}
            entries = {name: future.result() for name, future in written.items()}
        manifest = {"format": FORMAT, "step": step, "time": time.time(), "parts": entries}
        self.store.write_bytes(f"{_name(step)}.json", json.dumps(manifest, indent=1).encode())
        self._prune(step)

    def _put(self, key: str, obj: object) -> dict:
        data = obj if isinstance(obj, bytes) else to_bytes(obj)
        with ThreadPoolExecutor(max_workers=1) as hasher:
            digest = hasher.submit(_sha256, data)  # alongside the upload
            self.store.write_bytes(key, data)
            return {"sha256": digest.result(), "bytes": len(data)}

    def load(self, step: int) -> dict[str, bytes]:
        """The verified parts of a committed checkpoint (fetched concurrently); raises CorruptCheckpoint."""
        try:
            manifest = json.loads(self.store.read_bytes(f"{_name(step)}.json"))
            entries = manifest["parts"]
            if manifest.get("format") != FORMAT or manifest.get("step") != step:
                raise CorruptCheckpoint(f"{_name(step)}.json: unexpected format or step")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{_name(step)}.json: missing") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpoint(f"{_name(step)}.json: unreadable manifest ({exc})") from None
        with ThreadPoolExecutor(max_workers=max(1, len(entries))) as pool:
            fetched = {name: pool.submit(self._fetch, f"{_name(step)}/{name}", entry)
                       for name, entry in entries.items()}
            return {name: f.result() for name, f in fetched.items()}

    def _fetch(self, key: str, entry: dict) -> bytes:
        try:
            data = self.store.read_bytes(key)
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{key}: missing") from None
        if len(data) != entry["bytes"] or _sha256(data) != entry["sha256"]:
            raise CorruptCheckpoint(f"{key}: checksum mismatch")
        return data

    def load_latest(self) -> tuple[int, dict[str, bytes]] | None:
        """The newest checkpoint that verifies, falling back past corrupt ones with a warning."""
        for step in self.steps():
            try:
                return step, self.load(step)
            except CorruptCheckpoint as exc:
                log.warning("checkpoint %s%s is corrupt (%s); trying the previous one",
                            self.store.uri.rstrip("/") + "/", _name(step), exc)
        return None

    def _prune(self, newest: int) -> None:
        """Keep the newest `keep` checkpoints; delete older ones (manifest first) and older orphan parts."""
        kept = set(self.steps()[: self.keep])
        for step in self.steps()[self.keep:]:
            self.store.delete(f"{_name(step)}.json")
        for key in self.store.list("step-"):
            m = re.match(r"^step-(\d{9})/", key)
            if m and int(m.group(1)) not in kept and int(m.group(1)) < newest:
                self.store.delete(key)
