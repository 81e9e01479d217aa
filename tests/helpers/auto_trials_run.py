"""zero_auto's trial and its run of the same candidate, in one CPU process: which optimizer each gave DeepSpeed.

    python tests/helpers/auto_trials_run.py OUT.json CASE [CASE ...]

Each case fits a small module under ``zero_auto`` with its candidates given, so the search times exactly those and
the run trains the fastest that fitted; every ``deepspeed.initialize`` call's optimizer is recorded (type, CPU Adam
options, and each parameter group's hyper-parameters and shapes). OUT.json maps each case to its calls (the trials'
first, the run's last), its trials (name, fitted, reason) and the chosen candidate's name.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_zero.auto.search import BF16_STATES, ZENFLOW, Candidate
from lightning_zero.auto.strategy import ZeroAutoStrategy
from lightning_zero.memory.states import Layout
from tests.helpers.trainer import end_process_group, quiet_trainer

LR, BETAS, EPS, WEIGHT_DECAY = 3e-3, (0.8, 0.9), 1e-7, 0.05
EXACT = Candidate(Layout("deepspeed", 2, offload_optimizer=True), 4, 1, False, 2**20)
ZENFLOW_TRIAL, BF16_TRIAL = dataclasses.replace(EXACT, lever=ZENFLOW), dataclasses.replace(EXACT, lever=BF16_STATES)
#: case: (the candidates, the zero_auto settings, the Trainer's precision, the module's optimizer)
CASES: dict[str, tuple[list[Candidate], dict[str, Any], str, str]] = {
    "offload": ([EXACT], {}, "32-true", "adamw"),
    "offload_torch_adam": ([EXACT], {"cpu_adam_for_offload": False}, "32-true", "adamw"),
    "zenflow": ([ZENFLOW_TRIAL], {"approximate": True}, "32-true", "adamw"),
    "bf16_states": ([BF16_TRIAL], {"approximate": True}, "bf16-mixed", "adamw"),
    "bf16_states_sgd": ([BF16_TRIAL, EXACT], {"approximate": True}, "bf16-mixed", "sgd"),
}


class Grouped(L.LightningModule):
    """An MLP whose AdamW has two parameter groups (no decay on biases and norms) and a scheduler.

    Two outputs: DeepSpeed 0.19.8's ZenFlow fails on a weight of one row (its column selection slices rows).
    """

    def __init__(self, optimizer: str = "adamw") -> None:
        super().__init__()
        self.optimizer = optimizer
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 2))
        self.batch_size = 4

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        decay = [p for p in self.parameters() if p.dim() > 1]
        no_decay = [p for p in self.parameters() if p.dim() <= 1]
        groups: list[dict[str, Any]] = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=LR, weight_decay=WEIGHT_DECAY)
        optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 16, generator=generator), torch.randn(64, 2, generator=generator))
        return DataLoader(data, batch_size=self.batch_size)


class GivenCandidates(ZeroAutoStrategy):
    """zero_auto with its candidates given, so that a trial and the run are of the same one."""

    def __init__(self, given: list[Candidate], **zero: Any) -> None:
        super().__init__(zero={"memory_budget_gib": 1, "trial_steps": 1, "warmup_steps": 0, **zero})
        self.given = given

    def _candidates(self, *args: Any) -> list[Candidate]:
        return self.given


def describe(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What makes an optimizer step the way it does: its type, CPU Adam's options, each group's settings."""
    options = {name: getattr(optimizer, name, None) for name in ("adam_w_mode", "fp32_optimizer_states")}
    groups = [
        {
            **{
                key: list(value) if isinstance(value, tuple) else value
                for key, value in group.items()
                if key != "params"
            },
            "shapes": [list(p.shape) for p in group["params"]],
        }
        for group in optimizer.param_groups
    ]
    return {"type": type(optimizer).__name__, **options, "groups": groups}


def run_case(name: str) -> dict[str, Any]:
    import deepspeed

    given, zero, precision, optimizer = CASES[name]
    calls: list[dict[str, Any]] = []
    initialize = deepspeed.initialize

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(describe(kwargs["optimizer"]))
        return initialize(*args, **kwargs)

    deepspeed.initialize = recording
    try:
        strategy = GivenCandidates(given, **zero)
        quiet_trainer(devices=1, strategy=strategy, precision=precision, max_steps=2).fit(Grouped(optimizer))
    finally:
        deepspeed.initialize = initialize
    assert strategy.chosen is not None
    trials = [(m.candidate.name, m.fits, m.reason) for m in strategy.trials]
    return {"calls": calls, "trials": trials, "chosen": strategy.chosen.name}


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    out.write_text(json.dumps({name: run_case(name) for name in names}, default=str))
    end_process_group()


if __name__ == "__main__":
    main()
