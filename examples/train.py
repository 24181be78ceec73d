"""A plain PyTorch training script, as a user writes it, that the cluster runs safely on spot capacity.

    python train.py --steps 200                          # on a laptop: checkpoints in ./checkpoints
    torchrun --nnodes $GPUFLEET_NNODES --node-rank $GPUFLEET_NODE_RANK --rdzv-endpoint $GPUFLEET_RDZV_ENDPOINT \
        --nproc-per-node $GPUFLEET_NPROC_PER_NODE train.py --steps 200      # on the cluster, any number of nodes

The only cluster-specific lines use `trainer.jobs.api`: where the checkpoints go, whether to stop, and the
commit-protocol checkpointer. Stopped (a spot notice reaches the job as SIGTERM and the stop file), it saves
the step it is at and exits 75; Slurm requeues it and the next attempt resumes at the following step.
The data of step s is drawn from a generator seeded with s, so a resumed run sees what it would have seen.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from trainer.jobs import api


def model_and_optimizer(dim: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batch(step: int, dim: int, size: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, dim, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--metrics", help="append one JSON line per step here (rank 0)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds added to each step (demos: a slower job)")
    args = p.parse_args()

    job = api.info()
    world = job.world_size
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    model, optimizer = model_and_optimizer(args.dim)
    model.to(device)
    ckpt = api.Checkpointer()  # the job's own prefix: GPUFLEET_CHECKPOINT_URI
    start, state = ckpt.restore()
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
    net = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    if job.rank == 0:
        print(f"job {job.job_id} attempt {job.attempt}: step {start} of {args.steps}, {world} process(es) on "
              f"{job.nnodes} node(s)", flush=True)
    out = open(args.metrics, "a") if args.metrics and job.rank == 0 else None
    step = start
    while step < args.steps:
        step += 1
        x, y = (t.to(device) for t in batch(step, args.dim, args.batch_size, job.rank))
        loss = nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        stop = torch.tensor([1.0 if api.stop_requested() else 0.0], device=device)
        if world > 1:
            dist.all_reduce(stop)  # every rank stops after the same step
        if out:
            out.write(json.dumps({"step": step, "loss": loss.item(), "attempt": job.attempt, "world": world,
                                  "nnodes": job.nnodes}) + "\n")
            out.flush()
        if stop.item() and step < args.steps:
            if job.rank == 0:
                ckpt.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})
                print(f"stop requested: saved step {step}; exiting {api.EXIT_REQUEUE} to be requeued", flush=True)
            if world > 1:
                dist.barrier()
            return api.EXIT_REQUEUE
    if job.rank == 0:
        ckpt.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})
        print(f"done at step {step}, loss {loss.item():.4f}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
