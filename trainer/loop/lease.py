"""One writer per checkpoint location: a lease with a generation, taken with create-if-absent writes.

Under the checkpoint URI, ``lease/<generation, 9 digits>`` objects: a runner takes the lease by creating
the next generation (a conditional write: S3 ``If-None-Match: *``, Azure ``overwrite=False``, a local hard
link), so two runners can never hold the same generation. The newest generation owns the location; a
runner checks that it still does before it writes a checkpoint's parts and again before it commits the
manifest, so a runner that was superseded (its job handed to another node while it still ran) stops
without committing over the newer one.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import time

from trainer.errors import Fault
from trainer.loop.storage import Store

log = logging.getLogger("trainer")
PREFIX = "lease/"
KEY = re.compile(r"^lease/(\d{9})$")


class Fenced(Fault):
    """A newer runner took the checkpoint location over: this one must stop without writing."""


class Lease:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.generation: int | None = None

    def generations(self) -> list[int]:
        found = (KEY.match(k) for k in self.store.list(PREFIX))
        return sorted(int(m.group(1)) for m in found if m)

    def acquire(self, attempts: int = 20) -> int:
        """Take the next generation; older generations are removed (best effort)."""
        if not getattr(self.store, "conditional_create", True):
            log.warning("checkpoint location %s: this store has no create-if-absent write; the lease is taken with a "
                        "look then a write, so two runners starting at the same moment are not told apart",
                        self.store.uri)
        holder = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode()
        for _ in range(attempts):
            gens = self.generations()
            generation = (gens[-1] if gens else 0) + 1
            try:
                self.store.create(f"{PREFIX}{generation:09d}", holder)
            except FileExistsError:
                continue  # another runner took this one in between: try the next
            self.generation = generation
            for old in gens:
                self.store.delete(f"{PREFIX}{old:09d}")
            if gens:
                log.info("checkpoint location %s: lease generation %d (took over from %d)",
                         self.store.uri, generation, gens[-1])
            return generation
        raise Fault(f"checkpoint location {self.store.uri}: could not take the lease in {attempts} tries; "
                           "other runners keep taking it")

    def check(self) -> None:
        """Raise Fenced unless this runner's generation is still the newest."""
        if self.generation is None:
            return
        gens = self.generations()
        newest = gens[-1] if gens else None
        if newest != self.generation:
            raise Fenced(f"checkpoint location {self.store.uri} was taken over by another runner (lease "
                         f"generation {newest}, this run holds {self.generation}); stopping without saving")
