"""`python -m trainer train [--config FILE] [flags]`."""
from __future__ import annotations

from trainer.loop.config import parse_args


def main(argv: list[str]) -> int:
    cfg = parse_args(argv)
    from trainer.loop.train import train  # lazy: torch loads only once the flags are good

    return train(cfg, exiting=True)
