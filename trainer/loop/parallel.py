"""How the model is spread over the ranks: DDP (a whole replica per rank) or FSDP2 (`fully_shard`), plus the
per-unit wrappers both share: activation checkpointing and torch.compile; and the collectives the loop runs over
the ranks (the per-step stop agreement, a flag or bytes from every rank).

Units are the modules sharded (and compiled, and recomputed) one by one. A model names them with a
`shard_units()` method or a `shard_units` attribute (an iterable of submodules); by default they are the
children of the model's nn.ModuleList attributes (the usual `self.blocks` / `self.layers` of a
transformer), and the root alone when it has none. Under FSDP the root is sharded last and holds what the
units do not (embeddings, final norm, head).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from trainer.errors import UsageError
from trainer.loop.config import TrainConfig
from trainer.loop.stop import StopNotice

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int
    device: torch.device


def setup_ranks(sharded: bool = False) -> Ranks:
    """One process per device; under torchrun (or for FSDP), join the process group (NCCL and gloo on GPUs,
    gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 or sharded:
        init_process_group(device, world)
    return Ranks(rank, world, local_rank, device)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The model's units: its own `shard_units`, else the children of its ModuleLists, else none."""
    named = getattr(model, "shard_units", None)
    if named is not None:
        units = list(named() if callable(named) else named)
        if not all(isinstance(u, nn.Module) for u in units):
            raise UsageError("--model: shard_units must give nn.Module instances (submodules of the model)")
        return units
    return [child for module in model.modules() if isinstance(module, nn.ModuleList) for child in module]


def wrap_units(units: list[nn.Module], *, recompute: bool, compile_: bool) -> None:
    """In place: each unit's forward recomputed in backward and/or compiled. Module hooks (FSDP's
    all-gathers) stay outside the compiled region, so compile sees only the block's own math."""
    for unit in units:
        forward = unit.forward
        if recompute:
            forward = functools.partial(checkpoint, forward, use_reentrant=False)
        if compile_:
            forward = torch.compile(forward)
        unit.forward = forward


def parallelize(model: nn.Module, cfg: TrainConfig, device: torch.device, world: int) -> nn.Module:
    """The module the loop calls: the model itself (one rank), under DDP, or the model sharded in place."""
    units = shard_units(model)
    if (cfg.activation_checkpointing or cfg.compile) and not units:
        log.warning("the model names no units (shard_units or a ModuleList): recomputation and compile wrap the "
                    "whole model")
    wrap_units(units or [model], recompute=cfg.activation_checkpointing, compile_=cfg.compile)
    if cfg.parallel == "fsdp":
        mesh = init_device_mesh(device.type, (world,))
        mixed = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                 if cfg.precision == "bf16" else MixedPrecisionPolicy())
        for unit in units:
            fully_shard(unit, mesh=mesh, mp_policy=mixed, reshard_after_forward=cfg.reshard_after_forward)
        # the root's parameters are used again right away by backward: never resharded after forward
        fully_shard(model, mesh=mesh, mp_policy=mixed, reshard_after_forward=False)
        return model
    model.to(device)
    if world > 1:
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def is_sharded(net: nn.Module) -> bool:
    return isinstance(net, FSDPModule)


def gradient_sync(net: nn.Module, sync: bool):
    """A context in which backward reduces gradients across ranks (sync) or only accumulates them locally."""
    if is_sharded(net):
        net.set_requires_gradient_sync(sync)  # FSDP2's no_sync; applies to every unit under the root
        return contextlib.nullcontext()
    if isinstance(net, DistributedDataParallel) and not sync:
        return net.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip by the global gradient norm; under FSDP the gradients are shards (DTensors) and so is the norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(total, "full_tensor"):  # a DTensor: the sum over every rank's shard
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def init_process_group(device: torch.device, world: int) -> None:
    """Join the ranks: NCCL for GPU tensors and gloo for CPU ones (async checkpoints stage on the host).
    FSDP on a single process still needs a group: a one-rank group over an in-memory store."""
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"
    if world > 1:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def all_gather_bytes(data: bytes, ranks: Ranks) -> list[bytes]:
    """Every rank's bytes, on every rank (tensor collectives only: no pickling through numpy)."""
    if ranks.world == 1:
        return [data]
    size = torch.tensor([len(data)], device=ranks.device)
    sizes = [torch.zeros_like(size) for _ in range(ranks.world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=ranks.device)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(ranks.world)]
    dist.all_gather(gathered, mine)
    return [bytes(t[: int(s.item())].tolist()) for t, s in zip(gathered, sizes)]


def broadcast_flag(flag: bool, ranks: Ranks) -> bool:
    """Rank 0's flag, on every rank."""
    if ranks.world == 1:
        return flag
    box = torch.tensor([1 if flag else 0], device=ranks.device)
    dist.broadcast(box, src=0)
    return bool(box.item())


def agree(loss: torch.Tensor, notice: StopNotice) -> torch.Tensor:
    """One collective per optimizer step: returns [loss summed over ranks, number of ranks asked to stop].

    The all-reduce is queued, not waited for: the caller reads the result a step later, so the
    device never idles for it. All ranks read the same numbers and so stop after the same step.
    """
    flag = loss.new_ones((), dtype=torch.float32) if notice.is_set() else loss.new_zeros((), dtype=torch.float32)
    stats = torch.stack([loss.detach().float(), flag])  # made on the device: no host-to-device copy
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return stats
