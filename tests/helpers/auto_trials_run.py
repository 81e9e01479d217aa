"""zero_auto's trial and its run of the same candidate, in one CPU process: which optimizer each gave DeepSpeed.

    python tests/helpers/auto_trials_run.py OUT.json CASE [CASE ...]

Each case fits a small module under ``zero_auto`` with one given candidate, so the search times exactly that one
and the run trains it; every ``deepspeed.initialize`` call's optimizer is recorded (type, CPU Adam options, and
each parameter group's hyper-parameters and shapes). OUT.json maps each case to its calls, the trial's first.
"""

from __future__ import annotations

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
ZERO2_OFFLOAD = Layout("deepspeed", 2, offload_optimizer=True)
#: case: (the candidate, the zero_auto settings, the Trainer's precision)
CASES: dict[str, tuple[Candidate, dict[str, Any], str]] = {
    "offload": (Candidate(ZERO2_OFFLOAD, 4, 1, False, 2**20), {}, "32-true"),
    "offload_torch_adam": (Candidate(ZERO2_OFFLOAD, 4, 1, False, 2**20), {"cpu_adam_for_offload": False}, "32-true"),
    "zenflow": (Candidate(ZERO2_OFFLOAD, 4, 1, False, 2**20, ZENFLOW), {"approximate": True}, "32-true"),
    "bf16_states": (Candidate(ZERO2_OFFLOAD, 4, 1, False, 2**20, BF16_STATES), {"approximate": True}, "bf16-mixed"),
}


class Grouped(L.LightningModule):
    """An MLP whose AdamW has two parameter groups (no decay on biases and norms) and a scheduler.

    Two outputs: DeepSpeed 0.19.8's ZenFlow fails on a weight of one row (its column selection slices rows).
    """

    def __init__(self) -> None:
        super().__init__()
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
        optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 16, generator=generator), torch.randn(64, 2, generator=generator))
        return DataLoader(data, batch_size=self.batch_size)


class OneCandidate(ZeroAutoStrategy):
    """zero_auto with its candidates given, so that the trial and the run are of the same one."""

    def __init__(self, candidate: Candidate, **zero: Any) -> None:
        super().__init__(zero={"memory_budget_gib": 1, "trial_steps": 1, "warmup_steps": 0, **zero})
        self.given = candidate

    def _candidates(self, *args: Any) -> list[Candidate]:
        return [self.given]


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


def run_case(name: str) -> list[dict[str, Any]]:
    import deepspeed

    candidate, zero, precision = CASES[name]
    calls: list[dict[str, Any]] = []
    initialize = deepspeed.initialize

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(describe(kwargs["optimizer"]))
        return initialize(*args, **kwargs)

    deepspeed.initialize = recording
    try:
        strategy = OneCandidate(candidate, **zero)
        quiet_trainer(devices=1, strategy=strategy, precision=precision, max_steps=2).fit(Grouped())
        assert strategy.chosen == candidate and len(strategy.trials) == 1, strategy.trials
    finally:
        deepspeed.initialize = initialize
    return calls


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    out.write_text(json.dumps({name: run_case(name) for name in names}, default=str))
    end_process_group()


if __name__ == "__main__":
    main()
