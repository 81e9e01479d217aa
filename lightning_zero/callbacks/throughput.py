"""Throughput of a ZeRO run: Lightning's ``ThroughputMonitor`` plus what ZeRO runs need to be judged by.

    trainer = Trainer(callbacks=[ZeroThroughputMonitor(peak_tflops=989)], ...)

Besides Lightning's windowed ``train|...`` metrics (sent to the loggers), every training step logs, to the
progress bar and the loggers, over the last ``window_size`` steps:

- ``samples_per_sec`` and ``tokens_per_sec`` (all processes together),
- ``tflops_per_device`` and ``mfu`` (against ``peak_tflops``, or Lightning's table of known devices),
- ``optimizer_share``: the share of step time from the end of backward to the end of the step, i.e. the
  optimizer step (on the CPU under optimizer offload),
- ``skipped_steps``: fp16 steps DeepSpeed skipped for overflow,
- ``peak_allocated_gib`` and ``peak_reserved_gib`` on CUDA.

FLOPs per batch come from the module's ``flops_per_batch`` attribute when it has one; otherwise they are
measured once on the first batch with Lightning's ``measure_flops`` (a forward under ``no_grad``, times 3 for
forward and backward, times 4 with activation checkpointing) and stored as the module's ``flops_per_batch``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor
from torch.optim import Optimizer

from lightning_zero.internals import stage_throughputs
from lightning_zero.memory.budget import GIB
from lightning_zero.runtime.batches import samples_in, tokens_in, training_loss

#: Backward costs about twice the forward; recomputing activations adds one more forward.
BACKWARD_FACTOR = 3
CHECKPOINTED_FACTOR = 4


def forward_flops(module: LightningModule, batch: Any) -> int:
    """FLOPs of one forward of ``module``'s training step on ``batch`` (no gradients, nothing logged)."""
    loss = training_loss(module)
    with torch.no_grad():
        return int(measure_flops(module, lambda: loss(batch)))


class ZeroThroughputMonitor(ThroughputMonitor):
    """Samples/s, tokens/s, TFLOP/s per device, MFU, optimizer share, fp16 skipped steps and peak memory.

    Args:
        peak_tflops: The device's peak TFLOP/s at the training precision, for MFU (default: Lightning's table
            of known devices; no MFU when the device is not in it).
        batch_size_fn: Samples in a batch (default: first dimension of its first tensor).
        length_fn: Tokens in a batch (default: ``input_ids`` elements).
        window_size: Steps averaged over.
        prog_bar: Show the per-step metrics in the progress bar.
    """

    def __init__(
        self,
        peak_tflops: float | None = None,
        batch_size_fn: Callable[[Any], int] = samples_in,
        length_fn: Callable[[Any], int] | None = tokens_in,
        window_size: int = 20,
        prog_bar: bool = True,
    ) -> None:
        super().__init__(batch_size_fn=batch_size_fn, length_fn=length_fn, window_size=max(2, window_size))
        self.peak_tflops = peak_tflops
        self.prog_bar = prog_bar
        self._steps: deque[tuple[float, float, int, int]] = deque(maxlen=max(1, window_size))
        self._step_start = 0.0
        self._optimizer_start: float | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.peak_tflops is not None:
            self.available_flops = int(self.peak_tflops * 1e12)
            for throughput in stage_throughputs(self):
                throughput.available_flops = self.available_flops

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not hasattr(pl_module, "flops_per_batch"):
            factor = CHECKPOINTED_FACTOR if _checkpointing(trainer) else BACKWARD_FACTOR
            setattr(pl_module, "flops_per_batch", factor * forward_flops(pl_module, batch))  # noqa: B010
        self._synchronize(trainer)
        self._step_start = time.perf_counter()
        self._optimizer_start = None

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer) -> None:
        self._synchronize(trainer)
        self._optimizer_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._synchronize(trainer)
        end = time.perf_counter()
        optimizer = end - self._optimizer_start if self._optimizer_start is not None else 0.0
        tokens = self.length_fn(batch) if self.length_fn is not None else 0
        self._steps.append((end - self._step_start, optimizer, self.batch_size_fn(batch), tokens))
        for name, value in self.step_metrics(trainer, pl_module).items():
            pl_module.log(name, value, prog_bar=self.prog_bar, on_step=True, on_epoch=False, rank_zero_only=True)

    def step_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """The metrics over the current window (this rank's timings, samples scaled by the world size)."""
        seconds = sum(step[0] for step in self._steps)
        if seconds <= 0:
            return {}
        steps = len(self._steps)
        world = trainer.world_size
        metrics = {
            "samples_per_sec": world * sum(step[2] for step in self._steps) / seconds,
            "optimizer_share": sum(step[1] for step in self._steps) / seconds,
        }
        if self.length_fn is not None:
            metrics["tokens_per_sec"] = world * sum(step[3] for step in self._steps) / seconds
        flops = getattr(pl_module, "flops_per_batch", None)
        if flops:
            metrics["tflops_per_device"] = flops * steps / seconds / 1e12
            if self.available_flops:
                metrics["mfu"] = metrics["tflops_per_device"] * 1e12 / self.available_flops
        engine = getattr(trainer.strategy, "deepspeed_engine", None)
        if engine is not None and hasattr(engine, "skipped_steps"):
            metrics["skipped_steps"] = float(engine.skipped_steps)
        device = trainer.strategy.root_device
        if device.type == "cuda":
            metrics["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
            metrics["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        return metrics

    @staticmethod
    def _synchronize(trainer: Trainer) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _checkpointing(trainer: Trainer) -> bool:
    zero = getattr(trainer.strategy, "zero", None)
    return bool(getattr(zero, "activation_checkpointing", False))
