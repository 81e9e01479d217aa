"""Exact resume from any step: the position inside the epoch, every rank's RNG states, and epoch-end checkpoints.

Lightning restores the model, optimizers, LR schedulers and loop counters, but on its own:

* a plain ``DataLoader`` (not stateful) restarts the interrupted epoch from its first batch, so a checkpoint
  written mid-epoch (``ModelCheckpoint(every_n_train_steps=...)``) replays batches and skips others;
* RNG states (dropout, samplers without a fixed seed) are not saved;
* a ``max_steps`` run whose checkpoint was written in ``on_train_epoch_end`` resumes wrongly. For iteration-based
  training ``FitLoop.restarting`` is forced on, so an epoch that ended is taken as restarted "on epoch end" with
  its batch counters not reset: the resumed run counts that epoch's batches as fetched, reads the loader again as
  the tail of the old epoch, then starts another epoch (one epoch too far, on the wrong samples). Where
  ``max_steps`` cut the epoch short, the rest of it is skipped.

:class:`ExactResume` fixes the three. Add it next to your ``ModelCheckpoint`` (the ``lightning-zero`` CLI adds
it for you). Skipped batches are read from the loader again, from the RNG state of the epoch's start (so the
sampler order and DataLoader worker seeds are those of the interrupted epoch), but not trained on.

After a weights-only resume (see :mod:`lightning_zero.checkpoint.weights_only`) it sets the fresh optimizer's learning
rates to the restored schedulers' last ones.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from lightning_zero.checkpoint.strategy import SafeCheckpoints
from lightning_zero.checkpoint.weights_only import (
    ShardedCheckpointFallback,
    scheduled_learning_rates,
    set_learning_rates,
)
from lightning_zero.internals import fit_loop_loader_and_fetcher

_KEY = "lightning_zero_rng"


def rng_state() -> dict[str, Any]:
    """This process's torch, numpy and Python RNG states, in types that ``torch.load(weights_only=True)`` reads."""
    kind, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss],
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _gather(state: dict[str, Any]) -> list[dict[str, Any]]:
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return [state]
    states: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Tell ``loader``'s sampler, or its batch sampler's, which epoch it serves (distributed samplers shuffle by it)."""
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    for sampler in {id(sampler): sampler for sampler in samplers}.values():  # often one object twice
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def fix_epoch_end_loop_state(loops: dict[str, Any]) -> bool:
    """Rewrite a checkpoint's loop state written in ``on_train_epoch_end`` (at the epoch's end, or where ``max_steps``
    cut it short) into the state written in ``on_train_batch_end`` of the same batch, which Lightning resumes
    correctly (with :class:`ExactResume` continuing a cut-short epoch where it stopped); True if rewritten."""
    fit = loops.get("fit_loop", {})
    epochs, batches = fit.get("epoch_progress"), fit.get("epoch_loop.batch_progress")
    if not epochs or not batches:
        return False
    epoch_total, batch_total = epochs["total"], batches["total"]
    finished_epoch_not_completed = epoch_total["processed"] == epoch_total["started"] == epoch_total["completed"] + 1
    last_batch_completed = batch_total["completed"] == batch_total["processed"] > 0
    if not (finished_epoch_not_completed and last_batch_completed):
        return False
    for progress in (epochs["total"], epochs["current"]):
        progress["processed"] -= 1
    for progress in (batches["total"], batches["current"]):
        progress["completed"] -= 1
    return True


class _FastForward:
    """Yields ``loader``'s batches after the first ``skip`` on its next iteration only (later epochs read it
    whole). RNG states are set to those at the epoch's start before the iterator is made (samplers draw their
    seed then), and to the checkpoint's after the skipped batches."""

    def __init__(self, loader: Any, skip: int, epoch_start: dict[str, Any], resumed: dict[str, Any]) -> None:
        self.loader = loader
        self.skip = skip
        self.epoch_start = epoch_start
        self.resumed = resumed
        self.used = False

    def __iter__(self) -> Iterator[Any]:
        if self.used:
            return iter(self.loader)
        self.used = True
        set_rng_state(self.epoch_start)
        iterator = iter(self.loader)
        for _ in itertools.islice(iterator, self.skip):
            pass
        set_rng_state(self.resumed)
        return iterator

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class RandomStates:
    """Every rank's RNG states, at the save and at the start of the epoch it fell in; restored on resume."""

    def __init__(self) -> None:
        self.epoch_start: dict[str, Any] | None = None
        self.loaded: dict[str, Any] | None = None

    def save(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[_KEY] = _gather({"now": rng_state(), "epoch_start": self.epoch_start or rng_state()})

    def load(self, checkpoint: dict[str, Any], rank: int, world_size: int) -> None:
        states = checkpoint.get(_KEY)
        if states:
            self.loaded = states[rank] if len(states) == world_size else states[0]


def continue_mid_epoch(trainer: L.Trainer, states: dict[str, Any]) -> bool:
    """Make the training loader skip the batches that the interrupted epoch trained, drawing them from the epoch's
    starting RNG states; False (nothing done) unless the checkpoint was written inside an epoch."""
    fit_loop = trainer.fit_loop
    done = fit_loop.epoch_loop.batch_progress.current.ready  # batches trained in the interrupted epoch
    mid_epoch = fit_loop.restarted_mid_epoch and 0 < done < trainer.num_training_batches
    combined, fetcher = fit_loop_loader_and_fetcher(fit_loop)
    if not mid_epoch or combined is None or fetcher is None:
        return False
    for loader in combined.flattened:  # Lightning sets the epoch after `on_train_start`, too late for us
        set_sampler_epoch(loader, fit_loop.epoch_progress.current.processed)  # type: ignore[attr-defined]
    combined.flattened = [
        _FastForward(loader, done, states["epoch_start"], states["now"]) for loader in combined.flattened
    ]
    iter(fetcher)  # Lightning made the epoch's iterator already, over the loaders as they were
    return True


class ExactResume(Callback):
    """Resume exactly where a checkpoint was written: mid-epoch position, RNG states, epoch-end ``max_steps`` runs,
    and, after a weights-only resume, the scheduled learning rates.

    Each is one piece: :class:`RandomStates`, :func:`continue_mid_epoch`, :func:`fix_epoch_end_loop_state` and
    :func:`~lightning_zero.checkpoint.weights_only.scheduled_learning_rates`. To resume a lightning-zero sharded
    checkpoint under a plain Lightning strategy, add
    :class:`WeightsOnlyResume` as well.
    """

    def __init__(self) -> None:
        self.random_states = RandomStates()
        self._learning_rates: list[list[float]] | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.random_states.epoch_start = rng_state()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.random_states.save(checkpoint)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.max_steps != -1 and "loops" in checkpoint:
            fix_epoch_end_loop_state(checkpoint["loops"])
        self._learning_rates = scheduled_learning_rates(checkpoint)
        self.random_states.load(checkpoint, trainer.global_rank, trainer.world_size)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._learning_rates is not None:
            set_learning_rates([config.scheduler for config in trainer.lr_scheduler_configs], self._learning_rates)
            self._learning_rates = None
        loaded, self.random_states.loaded = self.random_states.loaded, None
        if loaded is not None and not continue_mid_epoch(trainer, loaded):
            set_rng_state(loaded["now"])


class WeightsOnlyResume(Callback):
    """Lets a plain Lightning strategy (``ddp``...) resume from a lightning-zero sharded checkpoint directory
    (DeepSpeed, FSDP2), weights-only with one warning, by wrapping the strategy's ``CheckpointIO`` in
    :class:`ShardedCheckpointFallback`. The lightning-zero strategies resume any checkpoint themselves: there it does
    nothing. The ``lightning-zero`` CLI adds it."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        strategy, io = trainer.strategy, trainer.strategy.checkpoint_io
        if not isinstance(strategy, SafeCheckpoints) and not isinstance(io, ShardedCheckpointFallback):
            strategy.checkpoint_io = ShardedCheckpointFallback(io)
