"""The checkpoints of one training run, in one component: it alone knows their format (rank 0's whole-state
files, trainer.loop.checkpoint, or every rank's DCP shards, trainer.loop.dcp), their cadence
(--checkpoint-every), background saves, and how a run resumes from the newest valid one.

A checkpoint holds the model, the optimizer, the LR schedule, the loss scaler, the data position, every
rank's RNG state and the config it was trained with. Every rank takes part in each save and resume; rank 0
decides for all (which checkpoint, whether a save fits) and every rank learns its answer, so every rank
stops with the same one line.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer.errors import Fault, UsageError
from trainer.loop import parallel
from trainer.loop.checkpoint import FORMAT, Checkpointer, NoValidCheckpoint, from_bytes, to_bytes
from trainer.loop.config import TrainConfig, global_batch_change, resume_changes
from trainer.loop.data import DataStream, StreamBatches
from trainer.loop.dcp import ShardedCheckpoints
from trainer.loop.optim import apply_schedule
from trainer.loop.parallel import Ranks, all_gather_bytes, broadcast_flag
from trainer.loop.storage import open_store

log = logging.getLogger("trainer")


@dataclass
class TrainState:
    """What a checkpoint holds (with the RNG states) and a step updates."""

    cfg: TrainConfig
    ranks: Ranks
    model: torch.nn.Module  # the model itself (sharded in place under FSDP), not its DDP wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    data: DataStream | StreamBatches


class CheckpointManager:
    def __init__(self, state: TrainState) -> None:
        self.state, self.cfg, self.ranks = state, state.cfg, state.ranks
        self.checkpoints = Checkpointer(open_store(self.cfg.checkpoint_uri), self.cfg.keep_checkpoints)
        self.sharded = (ShardedCheckpoints(self.checkpoints, self.ranks.device, background=self.cfg.async_checkpoint)
                        if self.cfg.dcp else None)
        self.saved: int | None = None  # the step of the newest save begun

    @property
    def uri(self) -> str:
        return self.checkpoints.store.uri

    # --- before step 1 ---------------------------------------------------------------------------------

    def take_location(self) -> None:
        """Rank 0 owns the location: check it answers, clean what killed writers left, and check before step 1
        that a save will have room (about the model and AdamW's two moments when there is no checkpoint yet)."""
        if self.ranks.rank == 0:
            self.checkpoints.probe()
            self.checkpoints.clean_leftovers()
            weights = sum(t.numel() * t.element_size() for t in self.state.model.state_dict().values())
            self.checkpoints.check_room(estimate=3 * weights)

    def resume(self) -> int:
        """Load the newest valid checkpoint (rank 0 picks it) and this rank's RNG state; returns its step (0: none).

        Every checkpoint corrupt: UsageError on every rank, unless --start-over says to start from step 0.
        """
        step, fmt, found = self._pick()
        if step is None:
            torch.manual_seed(self.cfg.seed + self.ranks.rank)  # per-rank streams (dropout) from here on
            return 0
        if fmt == FORMAT:
            trainer_state = self._load_files(step, found[2] if found else None)
        else:
            trainer_state = self._load_shards(step)
        s = self.state
        s.scheduler.load_state_dict(trainer_state["scheduler"])
        apply_schedule(s.scheduler, s.optimizer, self.cfg)
        if s.scaler.is_enabled() and trainer_state["scaler"]:
            s.scaler.load_state_dict(trainer_state["scaler"])
        s.data.load_state(trainer_state["data"])
        log.info("resuming from the checkpoint of step %d at %s", step, self.uri)
        if trainer_state["world"] == self.ranks.world:
            set_rng_state(trainer_state["rng"][self.ranks.rank], self.ranks.device)
        else:
            log.warning("checkpoint written by %d ranks, now %d: RNG streams restart", trainer_state["world"],
                        self.ranks.world)
            torch.manual_seed(self.cfg.seed + self.ranks.rank)
        return trainer_state["step"]

    def _pick(self) -> tuple[int | None, int | None, tuple | None]:
        """(step, format, what rank 0 read of it) of the newest valid checkpoint, the same on every rank."""
        found, refused = None, None
        if self.ranks.rank == 0:
            try:
                found = self.checkpoints.latest()
            except NoValidCheckpoint as exc:
                if not self.cfg.start_over:
                    refused = str(exc)
                else:
                    log.warning("%s: starting over from step 0 (--start-over)", exc)
        step, fmt = (found[0], found[1]["format"]) if found else (None, None)
        if self.ranks.world > 1:
            box = torch.tensor([-2 if refused else -1 if step is None else step, fmt or 0], device=self.ranks.device)
            dist.broadcast(box, src=0)
            if box[0].item() == -2:
                refused = refused or "every checkpoint is corrupt (rank 0 says which)"
            step, fmt = (None, None) if box[0].item() < 0 else (int(box[0].item()), int(box[1].item()))
        if refused:
            raise UsageError(f"{refused}; nothing to resume from: rerun with --start-over to train from step 0, "
                             "or give another --checkpoint-uri")
        return step, fmt, found

    def _load_files(self, step: int, parts: dict[str, bytes] | None) -> dict:
        """Whole-state files (rank 0 has read them already): the model and optimizer; returns the rest."""
        s = self.state
        if parallel.is_sharded(s.model):
            raise UsageError(f"--parallel fsdp: the checkpoint of step {step} at {self.uri} holds whole-state "
                             "files; resume it with --parallel ddp")
        parts = {name: from_bytes(data) for name, data in (parts or self.checkpoints.load(step)).items()}
        optim, trainer_state = parts["optim.pt"], parts["trainer.pt"]
        self._check_config(trainer_state, step)
        try:
            s.model.load_state_dict(parts["model.pt"])
        except RuntimeError as exc:  # missing or unexpected keys, size mismatches: another model
            detail = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
            raise UsageError(f"--model {self.cfg.model}: the checkpoint of step {step} at {self.uri} holds the "
                             f"weights of another model ({detail[:200]}); resume with that model or give another "
                             "--checkpoint-uri") from None
        s.optimizer.load_state_dict(optim["optimizer"])
        return {**trainer_state, "scheduler": optim["scheduler"], "scaler": optim["scaler"]}

    def _load_shards(self, step: int) -> dict:
        """DCP shards, resharded to this run's ranks as needed: the model and optimizer; returns the rest."""
        s = self.state
        sharded = self.sharded or ShardedCheckpoints(self.checkpoints, self.ranks.device, background=False)
        model_state, optim_state = get_state_dict(s.model, s.optimizer)
        loaded = {"model": model_state, "optim": optim_state, "trainer": b""}
        sharded.load(step, loaded)
        set_state_dict(s.model, s.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
        trainer_state = from_bytes(loaded["trainer"])
        self._check_config(trainer_state, step)
        return trainer_state

    def _check_config(self, trainer_state: dict, step: int) -> None:
        """Refuse (one line) a resume with other values of what the checkpoint cannot serve (the model, the data,
        the seed) or with another global batch; say which changed flags apply from the next step on."""
        saved = trainer_state.get("config") or {}
        refused, applied = resume_changes(saved, self.cfg)
        where = f"the checkpoint of step {step} at {self.uri}"
        if refused:
            raise UsageError(f"{', '.join(refused)}: {where} was written with other values; resume with them or "
                             "give another --checkpoint-uri")
        if "batch_size" in saved and "grad_accum" in saved:
            changed = global_batch_change(saved, trainer_state["world"], self.cfg, self.ranks.world, where)
            if changed:
                raise UsageError(changed)
        if applied:
            log.warning("resuming with changed flags, applied from step %d on: %s", step + 1, ", ".join(applied))

    # --- while training ----------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether step `step` gets a periodic checkpoint (the last step's is the final save)."""
        every = self.cfg.checkpoint_every
        return bool(every) and step % every == 0 and step < self.cfg.steps

    def save(self, step: int, before_commit: Callable[[float], None], final: bool = False) -> None:
        """Checkpoint step `step`; every rank takes part. Sharded periodic saves go on in the background (after
        any save in flight) when --async-checkpoint; a final one is waited for. ``before_commit(seconds)`` runs
        once on every rank before the commit, with the seconds the save has held training up so far (a
        background save: once staged; rank 0: after every part is written). A save the store has no room for
        stops every rank before anything is written."""
        began, s = time.perf_counter(), self.state
        self.saved = step

        def before() -> None:
            before_commit(time.perf_counter() - began)

        rngs = [from_bytes(b) for b in all_gather_bytes(to_bytes(rng_state(self.ranks.device)), self.ranks)]
        trainer_state = {"step": step, "data": s.data.state(), "rng": rngs, "world": self.ranks.world,
                         "config": dataclasses.asdict(self.cfg)}
        schedule = {"scheduler": s.scheduler.state_dict(), "scaler": s.scaler.state_dict()}
        if self.sharded is not None:
            model_state, optim_state = get_state_dict(s.model, s.optimizer)
            estimate = self.ranks.world * tensor_bytes(model_state, optim_state)
            self._check_room(lambda: self.checkpoints.check_room(estimate=estimate))
            background = self.cfg.async_checkpoint and not final
            coordinator = before if self.ranks.rank == 0 and not background else None
            blocked = self.sharded.save(step, {"model": model_state, "optim": optim_state,
                                               "trainer": to_bytes({**trainer_state, **schedule})},
                                        background, coordinator)
            log.info("checkpoint of step %d %s in %.2fs", step,
                     "staged, writing in the background" if background else "saved", blocked)
            if coordinator is None:
                before()
            return
        parts = {}
        if self.ranks.rank == 0:
            parts = {"model.pt": s.model.state_dict(),
                     "optim.pt": {"optimizer": s.optimizer.state_dict(), **schedule},
                     "trainer.pt": trainer_state}
        self._check_room(lambda: self.checkpoints.check_room(parts))  # one line, older checkpoints intact
        if self.ranks.rank == 0:
            self.checkpoints.save(step, parts, before_commit=before)
            log.info("checkpoint of step %d saved in %.2fs", step, time.perf_counter() - began)
        else:
            before()
        if self.ranks.world > 1:
            dist.barrier()

    def _check_room(self, room: Callable[[], None]) -> None:
        """On rank 0, which writes the location: ``room()`` (whether the save fits). Every rank learns the answer,
        so every rank stops with the same one line (Fault) before anything is written."""
        problem = None
        if self.ranks.rank == 0:
            try:
                room()
            except Fault as exc:
                problem = exc
        if broadcast_flag(problem is not None, self.ranks) and problem is None:
            problem = Fault(f"checkpoint location {self.uri}: rank 0 stopped the save (its log says why)")
        if problem is not None:
            raise problem

    def close(self) -> None:
        """Wait for the save in flight, if any (its failure is raised here)."""
        if self.sharded is not None:
            self.sharded.close()


def rng_state(device: torch.device) -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def tensor_bytes(*states) -> int:
    """Tensor bytes of this rank's shards of (nested) state dicts: about its share of a sharded save."""
    total = 0
    for state in states:
        for value in (state.values() if isinstance(state, dict) else state):
            if isinstance(value, dict):
                total += tensor_bytes(value)
            elif isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.numel() * local.element_size()
    return total
