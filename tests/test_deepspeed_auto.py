"""A DeepSpeed config file with ``"auto"`` optimizer and scheduler values, and a model built in ``configure_model``.

The values come from the module's own optimizer, which only exists once ``configure_model`` has built the model.
The test runs this file as a 1-process worker (``python tests/test_deepspeed_auto.py OUT``) under ZeRO-2 and ZeRO-3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # also run as a worker script

import pytest

from tests.helpers.trainer import quiet_trainer

pytestmark = pytest.mark.multiprocess  # every test here starts processes

LR, WEIGHT_DECAY, BETAS, STEPS = 3e-3, 0.05, (0.8, 0.9), 3
DS_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto", "eps": "auto", "torch_adam": True},
    },
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_max_lr": "auto"}},
}


def _worker(out: str) -> None:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_zero import ZeroStrategy
    from lightning_zero.memory.footprint import optimizer_state_numel

    class BuiltLate(L.LightningModule):
        """Like the language tasks: no parameters until ``configure_model``, which ``configure_optimizers`` needs."""

        def __init__(self) -> None:
            super().__init__()
            self.net: torch.nn.Module | None = None
            self.optimizer_calls = 0

        def configure_model(self) -> None:
            if self.net is None:
                self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            assert self.net is not None, "configure_model() has not run"
            self.optimizer_calls += 1
            return torch.optim.AdamW(self.net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            assert self.net is not None
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=4)

    results = {}
    for stage in (2, 3):
        strategy = ZeroStrategy(deepspeed_config={**DS_CONFIG, "zero_optimization": {"stage": stage}})
        trainer = quiet_trainer(
            devices=1,
            strategy=strategy,
            max_steps=STEPS,
        )
        module = BuiltLate()
        trainer.fit(module)
        assert module.net is not None
        group = trainer.optimizers[0].param_groups[0]
        assert strategy.config is not None
        results[f"stage{stage}"] = {
            "config_optimizer": strategy.config["optimizer"]["params"],
            "config_scheduler": strategy.config["scheduler"]["params"],
            "weight_decay": group["weight_decay"],
            "betas": list(group["betas"]),
            "adam_state_elements": optimizer_state_numel(trainer.optimizers[0]),
            "configure_optimizers_calls": module.optimizer_calls,
        }
    Path(out).write_text(json.dumps(results))


@pytest.mark.usefixtures("one_thread")
def test_auto_optimizer_values_come_from_the_module_after_configure_model(tmp_path: Path) -> None:
    from tests.helpers.launch import run_script

    out = tmp_path / "auto.json"
    run_script(Path(__file__), str(out), timeout=240)
    for stage, result in json.loads(out.read_text()).items():
        assert result["config_optimizer"] == {
            "lr": LR,
            "weight_decay": WEIGHT_DECAY,
            "betas": list(BETAS),
            "eps": 1e-8,
            "torch_adam": True,
        }, stage
        assert result["config_scheduler"] == {"total_num_steps": STEPS, "warmup_max_lr": LR}, stage
        assert result["weight_decay"] == WEIGHT_DECAY and result["betas"] == list(BETAS), stage
        assert result["adam_state_elements"] >= 2 * (8 * 16 + 16 + 16 + 1), stage  # two moments per weight
        # Read for its values only: DeepSpeed builds the optimizer of the config's section, Lightning never asks.
        assert result["configure_optimizers_calls"] == 1, stage


if __name__ == "__main__":
    _worker(sys.argv[1])
