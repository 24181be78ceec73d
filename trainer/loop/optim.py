"""The optimizer and its learning-rate schedule: AdamW, linear warmup then cosine decay."""
from __future__ import annotations

import math

import torch

from trainer.loop.config import TrainConfig


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """Multiplier of the peak LR for 0-based step: linear warmup, then cosine decay to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused kernels on GPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def build_schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup_steps, cfg.steps))


def apply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, optimizer: torch.optim.Optimizer,
                   cfg: TrainConfig) -> None:
    """After a resume: the LR schedule of this run's flags (--lr, --warmup-steps, --steps) at the resumed step.
    The scheduler's saved state holds the base LR it was made with, which would otherwise win over --lr."""
    lr = cfg.lr * lr_factor(scheduler.last_epoch, cfg.warmup_steps, cfg.steps)
    scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["initial_lr"], group["lr"] = cfg.lr, lr
    scheduler._last_lr = [lr for _ in optimizer.param_groups]
