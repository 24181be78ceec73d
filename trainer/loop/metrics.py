"""Per-step records: a JSON-lines file and a progress display (a bar on a terminal, plain lines in logs)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO


class MetricsFile:
    """Appends one JSON object per line; a resumed run continues the same file."""

    def __init__(self, path: str | None) -> None:
        self._file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: followers see each step

    def write(self, record: dict) -> None:
        if self._file:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file:
            self._file.close()


class Progress:
    """A redrawn bar (at most 10 times a second) on a terminal; otherwise a line every `every` steps."""

    def __init__(self, total: int, every: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.every = every
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._drawn = 0.0

    def update(self, record: dict) -> None:
        step = record["step"]
        if self.tty:
            now = time.monotonic()
            if now - self._drawn >= 0.1 or step == self.total:
                self._drawn = now
                filled = 30 * step // self.total
                self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self._text(record)}\033[K")
                self.stream.flush()
        elif step % self.every == 0 or step == self.total:
            self.stream.write(self._text(record) + "\n")
            self.stream.flush()

    def _text(self, record: dict) -> str:
        return (f"step {record['step']}/{self.total} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                f"{record['step_time_s'] * 1000:.0f} ms/step {record['samples_per_s']:.0f} samples/s")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
