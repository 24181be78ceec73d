"""Checkpoints in a Store, written with a commit protocol.

Layout under the checkpoint URI, for step N (zero-padded to 9 digits):
  step-N/<part>    the parts, written first;
  step-N.json      the manifest, written last: {"format", "step", "parts": {name: {...}}}.
Two formats share the protocol. Format 1 ("full"): rank 0's whole-state files model.pt, optim.pt,
trainer.pt, each with its "sha256" and "bytes". Format 2 ("dcp", trainer.loop.sharded): every rank's
torch.distributed.checkpoint shard files and DCP's .metadata, with the world size that wrote them.
A checkpoint exists only once its manifest does, so a crash mid-save leaves nothing that looks valid.
Loading checks every part (format 1: size and SHA-256; format 2: every shard present); a corrupt newest
checkpoint is skipped with a warning and the previous one is used. After each commit only the newest
`keep` checkpoints remain.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from trainer.errors import Fault, UsageError
from trainer.loop.storage import Store

log = logging.getLogger("trainer")
MANIFEST = re.compile(r"^step-(\d{9})\.json$")
FORMAT = 1
SHARDED_FORMAT = 2


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


def step_name(step: int) -> str:
    return f"step-{step:09d}"



class Checkpointer:
    """The checkpoints under one Store: save, list, verify, load, prune."""

    def __init__(self, store: Store, keep: int) -> None:
        self.store = store
        self.keep = keep

    def probe(self) -> None:
        """Write, read back and delete a marker, so that a location that cannot hold checkpoints is
        refused before the first step rather than at the first save."""
        key, data = f".probe-{os.getpid()}-{os.urandom(4).hex()}", os.urandom(16)
        where = f"--checkpoint-uri {self.store.uri}"
        try:
            self.store.write_bytes(key, data)
            back = self.store.read_bytes(key)
            self.store.delete(key)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise Fault(f"{where}: no space left to write a checkpoint") from None
            raise UsageError(f"{where}: cannot hold checkpoints ({exc.strerror or exc}); "
                             "give a writable directory or bucket prefix") from None
        if back != data:
            raise Fault(f"{where}: a marker written there read back different bytes; the store is not reliable")

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
            written = {name: pool.submit(self._put, f"{step_name(step)}/{name}", obj) for name, obj in parts.items()}
            entries = {name: future.result() for name, future in written.items()}
        self.commit(step, entries, FORMAT)

    def commit(self, step: int, parts: dict[str, dict], fmt: int, **extra) -> None:
        """Write the manifest of parts already in the store (the commit), then drop old checkpoints."""
        manifest = {"format": fmt, "step": step, "time": time.time(), **extra, "parts": parts}
        self.store.write_bytes(f"{step_name(step)}.json", json.dumps(manifest, indent=1).encode())
        self._prune(step)

    def _put(self, key: str, obj: object) -> dict:
        data = obj if isinstance(obj, bytes) else to_bytes(obj)
        with ThreadPoolExecutor(max_workers=1) as hasher:
            digest = hasher.submit(_sha256, data)  # alongside the upload
            self.store.write_bytes(key, data)
            return {"sha256": digest.result(), "bytes": len(data)}

    def manifest(self, step: int) -> dict:
        """The manifest of a committed checkpoint; raises CorruptCheckpoint."""
        try:
            manifest = json.loads(self.store.read_bytes(f"{step_name(step)}.json"))
            if (manifest.get("format") not in (FORMAT, SHARDED_FORMAT) or manifest.get("step") != step
                    or not isinstance(manifest["parts"], dict)):
                raise CorruptCheckpoint(f"{step_name(step)}.json: unexpected format or step")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{step_name(step)}.json: missing") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpoint(f"{step_name(step)}.json: unreadable manifest ({exc})") from None
        return manifest

    def load(self, step: int) -> dict[str, bytes]:
        """The verified parts of a committed format-1 checkpoint (fetched concurrently); raises CorruptCheckpoint."""
        manifest = self.manifest(step)
        if manifest["format"] != FORMAT:
            raise CorruptCheckpoint(f"{step_name(step)}: a sharded checkpoint, not whole-state files")
        entries = manifest["parts"]
        with ThreadPoolExecutor(max_workers=max(1, len(entries))) as pool:
            fetched = {name: pool.submit(self._fetch, f"{step_name(step)}/{name}", entry)
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
        """The newest format-1 checkpoint that verifies, falling back past corrupt ones with a warning."""
        found = self.latest()
        if found and found[1]["format"] != FORMAT:
            raise CorruptCheckpoint(f"{step_name(found[0])}: a sharded checkpoint, not whole-state files")
        return (found[0], found[2]) if found else None

    def latest(self) -> tuple[int, dict, dict[str, bytes] | None] | None:
        """The newest checkpoint that verifies, falling back past corrupt ones with a warning: (step, manifest,
        the parts of a format-1 checkpoint or None for a sharded one, whose shards are checked present)."""
        from trainer.loop.sharded import verify_present  # torch.distributed.checkpoint only when needed

        for step in self.steps():
            try:
                manifest = self.manifest(step)
                if manifest["format"] == SHARDED_FORMAT:
                    verify_present(self, step, manifest)
                    return step, manifest, None
                return step, manifest, self.load(step)
            except CorruptCheckpoint as exc:
                log.warning("checkpoint %s%s is corrupt (%s); trying the previous one",
                            self.store.uri.rstrip("/") + "/", step_name(step), exc)
        return None

    def _prune(self, newest: int) -> None:
        """Keep the newest `keep` checkpoints; delete older ones (manifest first) and older orphan parts."""
        kept = set(self.steps()[: self.keep])
        for step in self.steps()[self.keep:]:
            self.store.delete(f"{step_name(step)}.json")
        for key in self.store.list("step-"):
            m = re.match(r"^step-(\d{9})/", key)
            if m and int(m.group(1)) not in kept and int(m.group(1)) < newest:
                self.store.delete(key)
