"""The cluster in a box: `python -m infra.demo` (see infra.demo.cli)."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from infra.demo.cli import main as run

    return run(argv)
