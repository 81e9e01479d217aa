"""Count the Python calls of a training step under our DeepSpeed strategy and under Lightning's own class.

    python tests/helpers/step_calls_run.py OUT.json

One CPU process trains the tiny GPT-2 for a few steps under each of :data:`CONFIGS` (``zero2`` with and without
activation checkpointing, ``zero3``, ``zero2`` with the optimizer on the CPU) twice: through
:class:`DeepSpeedZeroStrategy`, and through Lightning's ``DeepSpeedStrategy`` (as our CPU-capable base class, with
no lightning-zero code on the step path) given the same resolved DeepSpeed config, with checkpointing switched on
in the model by hand and DeepSpeed's CPU Adam created in the module, as a Lightning user would. ``cProfile``
counts every Python call of the profiled steps: a count, unlike a time, does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L

from benchmarks.bench.main import for_lightning
from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy, _DeepSpeedOnCpu
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


def calls_per_step(ours: bool, fields: dict[str, Any]) -> float:
    zero = DeepSpeedZeroConfig(**fields)
    module = CpuAdamLM(scheduler=False) if zero.offloads and not ours else TinyLM(scheduler=False)
    if ours:
        strategy: Any = DeepSpeedZeroStrategy(zero=zero)
    else:
        values = TrainerValues(micro_batch_size=4, precision="32-true")
        settings = DeepSpeedSettings.from_zero(zero).with_trainer(values)
        strategy = _DeepSpeedOnCpu(config=for_lightning(settings.deepspeed_dict()))
        if zero.activation_checkpointing:
            module.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    profile = StepProfile()
    trainer = quiet_trainer(devices=1, strategy=strategy, max_steps=max(PROFILED) + 2, callbacks=[profile])
    trainer.fit(module)
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
