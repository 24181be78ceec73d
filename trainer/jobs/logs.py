"""Job output in the bucket: each attempt's merged stdout and stderr, shipped while it runs as ordered chunks
``jobs/<job_id>/logs/<attempt>/<node>/<seq>.log`` in the team's store (``<bucket>/teams/<team>/``, seq zero-padded,
so the key order is the output's order).

:class:`LogShipper` follows the local file a node's task writes the job's output to and ships what is new every
``every_s`` seconds, or as soon as ``chunk_bytes`` are waiting, whichever comes first, and everything that is
left on :meth:`LogShipper.close`. The output outlives the node: a reader needs only the bucket.
:func:`read` gives an attempt's chunks in order; :func:`follow` keeps polling for new chunks (across the next
attempts) until the job's record is in a final state.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Callable, Iterator

from trainer.loop.storage import MiB, Store
from trainer.periodic import Periodic

log = logging.getLogger("gpufleet.logs")

EVERY_S = 5.0
CHUNK_BYTES = 1 * MiB
POLL_S = 0.5  # how often the shipper looks at the file's size between shipments
_NODE = re.compile(r"[^A-Za-z0-9._-]")


def prefix(job_id: str, attempt: int | None = None) -> str:
    base = f"jobs/{job_id}/logs/"
    return base if attempt is None else f"{base}{attempt}/"


def chunk_key(job_id: str, attempt: int, node: str, seq: int) -> str:
    return f"{prefix(job_id, attempt)}{_NODE.sub('_', node) or 'node'}/{seq:08d}.log"


class LogShipper(Periodic):
    """Ships the growth of ``path`` to the store as chunks of at most ``chunk_bytes``; on close, all that is left
    (the final flush)."""

    def __init__(self, store: Store, job_id: str, attempt: int, node: str, path, *, every_s: float = EVERY_S,
                 chunk_bytes: int = CHUNK_BYTES, poll_s: float = POLL_S):
        super().__init__(self._tick, poll_s, f"logs-{job_id}", final=self.ship, on_error=self._not_shipped)
        self.store, self.path = store, path
        self.job_id, self.attempt, self.node = job_id, attempt, node
        self.every_s, self.chunk_bytes = every_s, chunk_bytes
        self.offset = 0
        self.seq = 0
        self._lock = threading.Lock()
        self._last = time.monotonic()

    def _waiting(self) -> int:
        try:
            with open(self.path, "rb") as f:
                return f.seek(0, 2) - self.offset
        except FileNotFoundError:
            return 0

    def ship(self) -> int:
        """Send what the file holds beyond what was sent, in chunks; the chunks sent."""
        sent = 0
        with self._lock:
            try:
                f = open(self.path, "rb")
            except FileNotFoundError:
                return 0
            with f:
                f.seek(self.offset)
                while data := f.read(self.chunk_bytes):
                    self.store.write_bytes(chunk_key(self.job_id, self.attempt, self.node, self.seq), data)
                    self.seq += 1
                    self.offset += len(data)
                    sent += 1
        return sent

    def _tick(self) -> None:
        """Every ``poll_s``: a shipment once ``every_s`` passed since the last one, or a chunk is waiting."""
        if time.monotonic() - self._last >= self.every_s or self._waiting() >= self.chunk_bytes:
            try:
                self.ship()
            finally:
                self._last = time.monotonic()

    def _not_shipped(self, exc: Exception) -> None:  # the store is away for a while: keep the output, send it next time
        log.warning("job %s: output not shipped yet (%s)", self.job_id, exc)


def attempts(store: Store, job_id: str) -> list[int]:
    """The attempts that have output, in order."""
    return sorted(int(a) for a in store.children(prefix(job_id)) if a.isdigit())


def chunks(store: Store, job_id: str, attempt: int) -> list[str]:
    """The chunk keys of an attempt, node by node, each node's in order."""
    def order(key: str):
        node, _, name = key[len(prefix(job_id, attempt)):].rpartition("/")
        return node, int(name.split(".")[0])

    return sorted((k for k in store.list(prefix(job_id, attempt)) if k.endswith(".log")), key=order)


def node_of(job_id: str, attempt: int, key: str) -> str:
    return key[len(prefix(job_id, attempt)):].rpartition("/")[0]


def read(store: Store, job_id: str, attempt: int) -> Iterator[tuple[str, bytes]]:
    """(node, bytes) of an attempt's chunks in order."""
    for key in chunks(store, job_id, attempt):
        yield node_of(job_id, attempt, key), store.read_bytes(key)


def follow(store: Store, job_id: str, finished: Callable[[], bool], first_attempt: int | None = None,
           poll_s: float = 2.0, only_attempt: bool = False) -> Iterator[tuple[int, str, bytes]]:
    """(attempt, node, bytes) of every chunk from ``first_attempt`` (default: the latest) on, new ones as they
    come, until ``finished()`` (the record is in a final state) and a last look found nothing new."""
    seen: set[str] = set()
    start = first_attempt if first_attempt is not None else (attempts(store, job_id) or [1])[-1]
    while True:
        done = finished()  # asked before the look, so output shipped before the end is never missed
        numbers = [a for a in attempts(store, job_id) if a == start or (a > start and not only_attempt)]
        for attempt in numbers:
            for key in chunks(store, job_id, attempt):
                if key not in seen:
                    seen.add(key)
                    yield attempt, node_of(job_id, attempt, key), store.read_bytes(key)
        if done:
            return
        time.sleep(poll_s)
