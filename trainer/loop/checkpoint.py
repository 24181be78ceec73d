"""Checkpoints in a Store, written with a commit protocol.

Layout under the checkpoint URI, for step N (zero-padded to 9 digits):
  step-N/<part>    the parts, written first;
  step-N.json      the manifest, written last: {"format", "step", "parts": {name: {...}}}.
Two formats share the protocol. Format 1 ("full"): rank 0's whole-state files model.pt, optim.pt,
trainer.pt, each with its "sha256" and "bytes". Format 2 ("dcp", trainer.loop.dcp): every rank's
torch.distributed.checkpoint shard files and DCP's .metadata, with the world size that wrote them.
A checkpoint exists only once its manifest does, so a crash mid-save leaves nothing that looks valid.
Any manifest not of exactly that shape is corrupt (a warning, and the previous checkpoint is used); a
manifest or part that does not check out is read again (READS times) before it is called corrupt, since a
short or failed read is a fault of the transfer. When every checkpoint is corrupt, `latest` refuses
(NoValidCheckpoint) rather than start over. One writer at a time: the scheduler runs one attempt of a job at a time. A
whole-state save needs room for one checkpoint (`check_room`; the older go only after the commit).
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
MANIFEST = re.compile(r"^step-(\d{9})\.json\Z")
FORMAT = 1
SHARDED_FORMAT = 2
METADATA = ".metadata"  # DCP's metadata file, one of a sharded checkpoint's parts


NEARLY_FULL = 1 << 20  # bytes: a disk with less free after a failed write was full
READS = 3  # a manifest or part that does not check out is read this many times before it is called corrupt
PART_NAME = re.compile(r"^(?!.*(?:^|/)\.{1,2}(?:/|$))[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*\Z")  # relative, no . or ..


class CorruptCheckpoint(Exception):
    """A committed checkpoint whose manifest or parts do not check out."""


class NoValidCheckpoint(Exception):
    """Checkpoints exist but every one of them is corrupt."""


def parse_manifest(data: bytes, step: int) -> dict:
    """A manifest of exactly the documented shape; any other raises CorruptCheckpoint."""
    where = f"{step_name(step)}.json"
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise CorruptCheckpoint(f"{where}: not JSON ({exc})") from None
    if (not isinstance(manifest, dict) or manifest.get("format") not in (FORMAT, SHARDED_FORMAT)
            or manifest.get("step") != step or isinstance(manifest.get("step"), bool)):
        raise CorruptCheckpoint(f"{where}: not a manifest of step {step} in a known format")
    parts = manifest.get("parts")
    if not isinstance(parts, dict) or not parts:
        raise CorruptCheckpoint(f"{where}: 'parts' is not a non-empty map of part name to entry")
    for name, entry in parts.items():
        if not PART_NAME.match(name):
            raise CorruptCheckpoint(f"{where}: part name {name!r} is not a relative name")
        if not isinstance(entry, dict):
            raise CorruptCheckpoint(f"{where}: part {name!r} has no entry ({entry!r})")
        size = entry.get("bytes")
        if manifest["format"] == FORMAT and (not isinstance(entry.get("sha256"), str) or not isinstance(size, int)
                                             or isinstance(size, bool) or size < 0):
            raise CorruptCheckpoint(f"{where}: part {name!r} has no valid sha256 and bytes ({entry!r})")
    return manifest


def no_space(exc: BaseException) -> bool:
    """Whether a write failed for a full disk (an OSError, or one that DCP wrapped with the ranks' failures)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(exc) or "[Errno 28]" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()  # releases the GIL: runs alongside the upload


def verify_present(store: Store, step: int, manifest: dict) -> None:
    """A sharded checkpoint's DCP metadata and every shard its manifest names are in the store; raises
    CorruptCheckpoint."""
    if METADATA not in manifest["parts"]:  # a sharded commit always names it (a format-2 claim over other files)
        raise CorruptCheckpoint(f"{step_name(step)}: a sharded manifest that names no {METADATA}")
    listed = set(store.list(step_name(step) + "/"))
    missing = [name for name in manifest["parts"] if f"{step_name(step)}/{name}" not in listed]
    if missing:
        raise CorruptCheckpoint(f"{step_name(step)}: missing shard(s) {', '.join(missing)}")


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


def _nbytes(obj) -> int:
    """Tensor bytes in a (nested) state object: the size of its torch.save, near enough."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0



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

    def save(self, step: int, parts: dict[str, object], before_commit=None) -> None:
        """Write all parts, then the manifest (the commit), then drop old checkpoints.

        A bytes part is stored as given, any other object as torch.save bytes. Parts are serialized
        and written concurrently and each is hashed while it uploads, so the transfer dominates.
        ``before_commit`` runs once the parts are written, before the manifest: what it records is never
        lost to a kill after the commit. A full disk removes this step's parts and raises Fault.
        """
        try:
            with ThreadPoolExecutor(max_workers=len(parts)) as pool:
                written = {name: pool.submit(self._put, f"{step_name(step)}/{name}", obj)
                           for name, obj in parts.items()}
                entries = {name: future.result() for name, future in written.items()}
        except OSError as exc:
            if not self.filled_up(exc):
                raise
            raise self.out_of_space(step, self.room_needed(parts)) from None
        if before_commit:
            before_commit()
        self.commit(step, entries, FORMAT)

    def filled_up(self, exc: BaseException) -> bool:
        """Whether a failed write was a full disk: ENOSPC, or (torch's zip writer reports a short write as
        "unexpected pos") a failure that left the store's disk with next to no room."""
        if no_space(exc):
            return True
        free = self.store.free_bytes()
        return free is not None and free < NEARLY_FULL

    def out_of_space(self, step: int, needed: int) -> Fault:
        """After a save that filled the disk: this step's parts removed, and the one line to stop with."""
        self._drop_parts(step)
        return Fault(f"checkpoint of step {step}: no space left at {self.store.uri} (needs about {_mib(needed)} "
                     "MiB); the older checkpoints are intact")

    def commit(self, step: int, parts: dict[str, dict], fmt: int, **extra) -> None:
        """Write the manifest of parts already in the store (the commit), then drop old checkpoints."""
        manifest = {"format": fmt, "step": step, "time": time.time(), **extra, "parts": parts}
        self.store.write_bytes(f"{step_name(step)}.json", json.dumps(manifest, indent=1).encode())
        self._prune(step)

    def room_needed(self, parts: dict[str, object] | None = None) -> int:
        """Bytes a save needs: the newest checkpoint's size (its manifest), else the given parts' sizes."""
        for step in self.steps():
            try:
                entries = parse_manifest(self.store.read_bytes(f"{step_name(step)}.json"), step)["parts"]
                return sum(e.get("bytes", 0) for e in entries.values() if isinstance(e.get("bytes"), int))
            except (OSError, CorruptCheckpoint):
                continue
        return sum(len(p) if isinstance(p, bytes) else _nbytes(p) for p in (parts or {}).values())

    def check_room(self, parts: dict[str, object] | None = None, estimate: int = 0) -> None:
        """Refuse a save the store has no room for, before anything is written (Fault).

        The room is one checkpoint's (the older ones go only after the commit): the newest one's size, else
        that of ``parts``, else ``estimate``.
        """
        free = self.store.free_bytes()
        if free is None:
            return
        needed = self.room_needed(parts) or estimate
        if needed > free:
            raise Fault(f"checkpoint location {self.store.uri}: a save needs about {_mib(needed)} MiB, "
                               f"{_mib(free)} MiB free; free space or give another --checkpoint-uri")

    def _drop_parts(self, step: int) -> None:
        for key in self.store.list(f"{step_name(step)}/"):
            try:
                self.store.delete(key)
            except OSError:
                pass
        self.store.clean_leftovers()

    def _put(self, key: str, obj: object) -> dict:
        data = obj if isinstance(obj, bytes) else to_bytes(obj)
        with ThreadPoolExecutor(max_workers=1) as hasher:
            digest = hasher.submit(_sha256, data)  # alongside the upload
            self.store.write_bytes(key, data)
            return {"sha256": digest.result(), "bytes": len(data)}

    def manifest(self, step: int) -> dict:
        """The manifest of a committed checkpoint; raises CorruptCheckpoint."""
        for attempt in range(1, READS + 1):  # a manifest read short does not parse: read it again
            try:
                return parse_manifest(self._read(f"{step_name(step)}.json"), step)
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{step_name(step)}.json: missing") from None
            except CorruptCheckpoint as exc:
                if attempt == READS:
                    raise
                log.warning("%s; reading it again", exc)
        raise AssertionError("unreachable")

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

    def _read(self, key: str) -> bytes:
        """A key's bytes, retried on a failed transfer; a key that is a directory is missing."""
        for attempt in range(1, READS + 1):
            try:
                return self.store.read_bytes(key)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise FileNotFoundError(key) from None
            except Exception as exc:  # a transfer fault (short read, checksum, 5xx after retries): read again
                if attempt == READS:
                    raise CorruptCheckpoint(f"{key}: unreadable after {READS} reads ({exc})") from None
                log.warning("reading %s failed (%s); reading it again", key, exc)
        raise AssertionError("unreachable")

    def _fetch(self, key: str, entry: dict) -> bytes:
        for attempt in range(1, READS + 1):
            try:
                data = self._read(key)
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{key}: missing") from None
            if len(data) == entry["bytes"] and _sha256(data) == entry["sha256"]:
                return data
            if attempt < READS:
                log.warning("%s: %d bytes that do not match the manifest (%d bytes, its sha256); reading it again",
                            key, len(data), entry["bytes"])
        raise CorruptCheckpoint(f"{key}: checksum mismatch in {READS} reads")

    def load_latest(self) -> tuple[int, dict[str, bytes]] | None:
        """The newest format-1 checkpoint that verifies, falling back past corrupt ones with a warning."""
        found = self.latest()
        if found and found[1]["format"] != FORMAT:
            raise CorruptCheckpoint(f"{step_name(found[0])}: a sharded checkpoint, not whole-state files")
        return (found[0], found[2]) if found else None

    def latest(self) -> tuple[int, dict, dict[str, bytes] | None] | None:
        """The newest checkpoint that verifies, falling back past corrupt ones with a warning: (step, manifest,
        the parts of a format-1 checkpoint or None for a sharded one, whose shards are checked present)."""
        steps = self.steps()
        for step in steps:
            try:
                manifest = self.manifest(step)
                if manifest["format"] == SHARDED_FORMAT:
                    verify_present(self.store, step, manifest)
                    return step, manifest, None
                return step, manifest, self.load(step)
            except CorruptCheckpoint as exc:
                log.warning("checkpoint %s%s is corrupt (%s); trying the previous one",
                            self.store.uri.rstrip("/") + "/", step_name(step), exc)
        if steps:
            raise NoValidCheckpoint(f"every checkpoint at {self.store.uri} is corrupt (steps "
                                    f"{', '.join(map(str, steps))})")
        return None

    def clean_leftovers(self) -> list[str]:
        """What killed writers left: temporary files, and parts of uncommitted steps older than the newest
        commit (a kill during a save or a prune). Call it as the location's only writer (the run's rank 0)."""
        removed = self.store.clean_leftovers()
        steps = self.steps()
        if steps:
            committed = set(steps)
            for key in self.store.list("step-"):
                m = re.match(r"^step-(\d{9})/", key)
                if m and int(m.group(1)) not in committed and int(m.group(1)) < steps[0]:
                    self.store.delete(key)
                    removed.append(key)
        if removed:
            log.info("removed %d leftovers of killed writes at %s", len(removed), self.store.uri)
        return removed

    def _prune(self, newest: int) -> None:
        """Keep the newest `keep` checkpoints; delete older ones (manifest first) and older orphan parts."""
        kept = set(self.steps()[: self.keep])
        for step in self.steps()[self.keep:]:
            self.store.delete(f"{step_name(step)}.json")
        for key in self.store.list("step-"):
            m = re.match(r"^step-(\d{9})/", key)
            if m and int(m.group(1)) not in kept and int(m.group(1)) < newest:
                self.store.delete(key)
