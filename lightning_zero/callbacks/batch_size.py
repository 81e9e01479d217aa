"""A batch-size finder that works under ZeRO and several processes.

    trainer = Trainer(strategy="zero2", callbacks=[ZeroBatchSizeFinder(max_batch_size=256)], ...)
    trainer = Trainer(..., callbacks=[ZeroBatchSizeFinder(global_batch_size=512)])  # micro-batch x accumulation

At the start of ``fit`` (after the strategy has built its engine and optimizers, before the dataloaders) it
runs one forward and backward per trial micro-batch on a batch of the real data, doubling until a trial does
not fit, then bisecting. Every rank takes part in every trial and the ranks agree after the forward and again
after the backward (an all-reduce of "did it fit"), so an out-of-memory error on one rank makes every rank
stop at the same size instead of leaving the others waiting in a collective. Between trials the gradients
are cleared through the strategy's optimizers (DeepSpeed's ZeRO optimizer included); no optimizer step is
taken, so the weights and optimizer state are those the run starts from.

What "fits" means is injectable: ``fits(trainer, module, micro_batch)`` after a trial. The default, on CUDA,
compares the peak allocation with the strategy's ``memory_budget_gib`` (the cap is lifted during trials so
the budget is measured rather than hit mid-collective); elsewhere only out-of-memory errors count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr

from lightning_zero.errors import ZeroConfigError
from lightning_zero.memory.budget import GIB, cap_device_memory
from lightning_zero.runtime.batches import is_out_of_memory, logging_silenced, take_samples

FitsCheck = Callable[[Trainer, LightningModule, int], bool]


def within_budget(trainer: Trainer, module: LightningModule, micro_batch: int) -> bool:
    """Default check: on CUDA, the trial's peak allocation is within the strategy's ``memory_budget_gib``."""
    device = trainer.strategy.root_device
    budget = getattr(getattr(trainer.strategy, "zero", None), "memory_budget_gib", None)
    if device.type != "cuda" or budget is None:
        return True
    return torch.cuda.max_memory_allocated(device) <= budget * GIB


def split_global_batch(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    """``(micro-batch, accumulation)`` with ``micro * accumulation * world == global_batch``, micro as large as fits."""
    if global_batch % world_size:
        raise ZeroConfigError(
            f"global_batch_size {global_batch} is not divisible by the {world_size} processes: use a multiple of it."
        )
    per_rank = global_batch // world_size
    micro = max(b for b in range(1, min(per_rank, max_micro_batch) + 1) if per_rank % b == 0)
    return micro, per_rank // micro


class ZeroBatchSizeFinder(Callback):
    """Find the largest micro-batch that fits, on every rank together, under any of our strategies.

    Args:
        max_batch_size: Largest micro-batch tried.
        start: First micro-batch tried.
        global_batch_size: Keep this many samples per optimizer step: choose micro-batch x gradient
            accumulation from the largest micro-batch that fits.
        batch_arg_name: The module or datamodule attribute that sets the dataloader's batch size.
        fits: ``fits(trainer, module, micro_batch) -> bool`` after each trial (see the module docstring).
    """

    def __init__(
        self,
        max_batch_size: int = 4096,
        start: int = 1,
        global_batch_size: int | None = None,
        batch_arg_name: str = "batch_size",
        fits: FitsCheck = within_budget,
    ) -> None:
        if start < 1 or max_batch_size < start:
            raise ZeroConfigError(
                f"Batch-size finder needs 1 <= start <= max_batch_size, got {start}, {max_batch_size}."
            )
        self.max_batch_size = max_batch_size
        self.start = start
        self.global_batch_size = global_batch_size
        self.batch_arg_name = batch_arg_name
        self.fits = fits
        self.tried: dict[int, bool] = {}
        self.micro_batch: int | None = None
        self.accumulation = 1

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not lightning_hasattr(pl_module, self.batch_arg_name):
            raise ZeroConfigError(
                f"The batch-size finder sets `{self.batch_arg_name}` but neither the module nor the datamodule has it:"
                " add it or pass `batch_arg_name`."
            )
        batch = trainer.strategy.batch_to_device(next(iter(_train_source(trainer, pl_module).train_dataloader())))
        with _uncapped(trainer):
            largest = self.search(lambda size: self.trial(trainer, pl_module, batch, size))
        if largest == 0:
            raise ZeroConfigError(
                f"Not even a micro-batch of {self.start} fits: use a strategy that saves more memory"
                " (`lightning-zero plan` compares them) or raise `memory_budget_gib`."
            )
        self.micro_batch, self.accumulation = largest, 1
        if self.global_batch_size is not None:
            self.micro_batch, self.accumulation = split_global_batch(
                self.global_batch_size, trainer.world_size, largest
            )
        self.apply(trainer, pl_module)

    def search(self, fits: Callable[[int], bool]) -> int:
        """The largest size in ``[start, max_batch_size]`` for which ``fits`` holds (0 if none): double, then bisect."""
        good, bad = 0, self.max_batch_size + 1
        size = self.start
        while size < bad:
            if self._record(size, fits(size)):
                good = size
                size = min(size * 2, self.max_batch_size) if size < self.max_batch_size else bad
            else:
                bad = size
        while bad - good > 1 and good:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if self._record(middle, fits(middle)) else (good, middle)
        return good

    def _record(self, size: int, fitted: bool) -> bool:
        self.tried[size] = fitted
        return fitted

    def trial(self, trainer: Trainer, pl_module: LightningModule, batch: Any, size: int) -> bool:
        """One forward and backward at micro-batch ``size``; whether it fitted on every rank."""
        strategy = trainer.strategy
        device = strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        samples = take_samples(batch, size)
        loss: Any = None
        try:
            with logging_silenced(pl_module):
                output = strategy.training_step(samples, 0)
            loss = output["loss"] if isinstance(output, Mapping) else output
            ok = True
        except RuntimeError as error:
            ok = _out_of_memory_or_raise(error)
        if strategy.reduce_boolean_decision(ok, all=True):
            try:
                strategy.backward(loss, trainer.optimizers[0] if trainer.optimizers else None)
            except RuntimeError as error:
                ok = _out_of_memory_or_raise(error)
            ok = strategy.reduce_boolean_decision(ok, all=True)
        else:
            ok = False
        del loss, samples
        self._clear(trainer, pl_module)
        fitted = ok and self.fits(trainer, pl_module, size)
        return strategy.reduce_boolean_decision(fitted, all=True)

    @staticmethod
    def _clear(trainer: Trainer, pl_module: LightningModule) -> None:
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        pl_module.zero_grad(set_to_none=True)
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.empty_cache()

    def apply(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Set the chosen micro-batch on the module/datamodule and the accumulation on the Trainer (and engine)."""
        assert self.micro_batch is not None
        lightning_setattr(pl_module, self.batch_arg_name, self.micro_batch)
        assert lightning_getattr(pl_module, self.batch_arg_name) == self.micro_batch
        trainer.accumulate_grad_batches = self.accumulation
        engine = getattr(trainer.strategy, "deepspeed_engine", None)
        if engine is not None:
            engine.set_train_micro_batch_size(self.micro_batch)
            engine.set_train_batch_size(self.micro_batch * self.accumulation * trainer.world_size)


def _out_of_memory_or_raise(error: RuntimeError) -> bool:
    if not is_out_of_memory(error):
        raise error
    return False


def _train_source(trainer: Trainer, pl_module: LightningModule) -> Any:
    datamodule = getattr(trainer, "datamodule", None)
    return datamodule if datamodule is not None and hasattr(datamodule, "train_dataloader") else pl_module


@contextmanager
def _uncapped(trainer: Trainer) -> Any:
    """Lift the CUDA budget cap during trials (their peak is compared with the budget instead), then restore it."""
    device = trainer.strategy.root_device
    budget = getattr(getattr(trainer.strategy, "zero", None), "memory_budget_gib", None)
    if device.type == "cuda" and budget is not None:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    try:
        yield
    finally:
        if budget is not None:
            cap_device_memory(device, budget)
