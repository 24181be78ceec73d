"""Under torchrun: resume a run's newest checkpoint the way `train` does, then write (rank 0) the full model and
optimizer state and the data position it resumed with to $PROBE_OUT. Arguments: train's flags."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from trainer.loop.config import parse_args
from trainer.loop.manager import CheckpointManager
from trainer.loop.parallel import setup_ranks
from trainer.loop.train import build_trainer


def main(argv: list[str]) -> None:
    cfg = parse_args(argv)
    ranks = setup_ranks(sharded=cfg.parallel == "fsdp")
    trainer = build_trainer(cfg, ranks)
    checkpoints = CheckpointManager(trainer)
    step = checkpoints.resume()
    model_state, optim_state = get_state_dict(
        trainer.model, trainer.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ranks.rank == 0:
        torch.save({"step": step, "model": model_state, "optim": optim_state, "data": trainer.data.state()},
                   os.environ["PROBE_OUT"])
    checkpoints.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
