"""The run's own samples/s beside the trial's that chose it: a trial that predicts its run well is what
``zero_auto``'s choice rests on, so each run says how close it came."""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_info


class RunAgainstTrial(Callback):
    """Times the run's optimizer steps after its first ``warmup_steps`` and says at the end of training how many
    samples a second they took, beside ``trial_samples_per_sec`` (:attr:`samples_per_sec`, 0 until then)."""

    def __init__(self, trial_samples_per_sec: float, samples_per_step: int, warmup_steps: int = 1) -> None:
        self.trial_samples_per_sec = trial_samples_per_sec
        self.samples_per_step = samples_per_step
        self.warmup_steps = warmup_steps
        self.marks: list[float] = []
        self.samples_per_sec = 0.0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % int(trainer.accumulate_grad_batches):
            return  # not the micro-batch that ended an optimizer step
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.marks.append(time.perf_counter())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        timed = self.marks[self.warmup_steps :]
        if len(timed) < 2:
            return
        self.samples_per_sec = self.samples_per_step * (len(timed) - 1) / (timed[-1] - timed[0])
        share = self.samples_per_sec / self.trial_samples_per_sec if self.trial_samples_per_sec else 0.0
        rank_zero_info(
            f"zero_auto: the run trained at {self.samples_per_sec:.2f} samples/s after {self.warmup_steps} step(s),"
            f" {share:.0%} of its trial's {self.trial_samples_per_sec:.2f}."
        )
