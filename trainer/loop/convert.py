"""`python -m trainer convert --checkpoint-uri URI --out FILE [--step N]`: a sharded (DCP) checkpoint -> one
torch.save file of the model's full state dict, for inference: `model.load_state_dict(torch.load(FILE))`.

It reads the newest committed checkpoint (or step N), from any store the trainer writes to; the shards of
a remote store are downloaded to a temporary directory first. No process group is needed.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch

from trainer.errors import ArgumentParser, UsageError
from trainer.loop.checkpoint import Checkpointer, CorruptCheckpoint
from trainer.loop.storage import open_store

log = logging.getLogger("trainer")


def convert(uri: str, out: str, step: int | None = None) -> int:
    """Writes the model state of the checkpoint at `uri` to `out`; returns the step converted."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # lazy: torch DCP (~1 s) after the flags

    from trainer.loop.dcp import download  # lazy: torch DCP (~1 s) after the flags

    checkpoints = Checkpointer(open_store(uri), keep=1)
    if step is None:
        found = checkpoints.latest()
        if found is None:
            raise UsageError(f"--checkpoint-uri {uri}: no committed checkpoint there")
        step = found[0]
    with tempfile.TemporaryDirectory(prefix="gpufleet-convert-") as tmp:
        try:
            local = download(checkpoints, step, Path(tmp) / "dcp")
        except CorruptCheckpoint as exc:
            raise UsageError(f"--checkpoint-uri {uri}: cannot convert step {step}: {exc}") from None
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(local, whole)
        state = torch.load(whole, map_location="cpu", weights_only=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state["model"], out)
    log.info("the model of step %d at %s written to %s (%d tensors)", step, uri, out, len(state["model"]))
    return step


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer convert",
                       description="Write the model of a sharded (DCP) checkpoint as one state-dict file.")
    p.add_argument("--checkpoint-uri", required=True, help="where train wrote its checkpoints")
    p.add_argument("--out", required=True, help="the file to write (torch.save of the model's state dict)")
    p.add_argument("--step", type=int, default=None, help="the step to convert (default: the newest)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    convert(args.checkpoint_uri, args.out, args.step)
    return 0
