"""Count the Python calls of a training step under our DeepSpeed strategy and under Lightning's own class.

    python tests/helpers/step_calls_run.py OUT.json

One CPU process trains the tiny GPT-2 for a few steps under each of :data:`CONFIGS` (``zero2`` with and without
activation checkpointing, ``zero3``, ``zero2`` with the optimizer on the CPU) twice: through
:class:`DeepSpeedZeroStrategy`, and through Lightning's own ``DeepSpeedStrategy`` class given the same resolved
DeepSpeed config, with checkpointing switched on in the model by hand and DeepSpeed's CPU Adam created in the
module, as a Lightning user would. Lightning's class refuses a CPU at set-up: :func:`lightning_deepspeed_on_cpu`
lifts that one check, for this script only. ``cProfile`` counts every Python call of the profiled steps: a count,
unlike a time, does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

from benchmarks.bench.main import for_lightning
from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, TrainerValues
from lightning_zero.strategies.deepspeed_settings import DeepSpeedSettings
from tests.helpers.tiny import TinyLM
from tests.helpers.trainer import end_process_group, quiet_trainer

PROFILED = range(3, 7)


class StepProfile(L.Callback):
    """Profiles the steps in :data:`PROFILED`, from batch start to batch end."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, index: int) -> None:
        if index in PROFILED:
            self.profile.enable()

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        if index in PROFILED:
            self.profile.disable()

    def calls_per_step(self) -> float:
        return pstats.Stats(self.profile).total_calls / len(PROFILED)  # type: ignore[attr-defined]


class CpuAdamLM(TinyLM):
    """The tiny GPT-2 creating DeepSpeed's CPU Adam itself, as Lightning's docs tell its offload users to (ours
    swaps the task's AdamW for the same optimizer before the engine is built)."""

    def configure_optimizers(self) -> Any:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])


#: The configurations counted, by the suffix of their keys in the output: our preset fields for each.
CONFIGS: dict[str, dict[str, Any]] = {
    "": {"stage": 2},
    "+ac": {"stage": 2, "activation_checkpointing": True},
    "+zero3": {"stage": 3},
    "+offload": {"stage": 2, "offload_optimizer": "cpu"},
}


@contextmanager
def lightning_deepspeed_on_cpu() -> Iterator[None]:
    """Lightning's ``DeepSpeedStrategy`` as it is, but for the check in its ``setup_environment`` that refuses any
    accelerator but CUDA, and with DeepSpeed's CPU accelerator while it runs.

    The rest of its set-up runs unchanged when the strategy is given the device ``cpu:0``: the device index it
    checks and passes to ``deepspeed.initialize`` is then 0, the local rank of this one process.
    """
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    replaced = get_accelerator()
    set_accelerator(CPU_Accelerator())
    try:
        with mock.patch.object(DeepSpeedStrategy, "setup_environment", DDPStrategy.setup_environment):
            yield
    finally:
        set_accelerator(replaced)


def calls_per_step(ours: bool, fields: dict[str, Any]) -> float:
    zero = DeepSpeedZeroConfig(**fields)
    module = CpuAdamLM(scheduler=False) if zero.offloads and not ours else TinyLM(scheduler=False)
    if ours:
        return profiled_fit(DeepSpeedZeroStrategy(zero=zero), module)
    values = TrainerValues(micro_batch_size=4, precision="32-true")
    settings = DeepSpeedSettings.from_zero(zero).with_trainer(values)
    strategy = DeepSpeedStrategy(
        config=for_lightning(settings.deepspeed_dict()), parallel_devices=[torch.device("cpu", 0)]
    )
    if zero.activation_checkpointing:
        module.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with lightning_deepspeed_on_cpu():
        return profiled_fit(strategy, module)


def profiled_fit(strategy: Any, module: L.LightningModule) -> float:
    """Python calls per profiled step of fitting ``module`` under ``strategy`` in this process."""
    profile = StepProfile()
    trainer = quiet_trainer(devices=1, strategy=strategy, max_steps=max(PROFILED) + 2, callbacks=[profile])
    trainer.fit(module)
    assert trainer.strategy is strategy
    return profile.calls_per_step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    counts = {
        f"{'ours' if ours else 'lightning'}{suffix}": calls_per_step(ours, fields)
        for suffix, fields in CONFIGS.items()
        for ours in (True, False)
    }
    args.out.write_text(json.dumps(counts))
    end_process_group()


if __name__ == "__main__":
    main()
