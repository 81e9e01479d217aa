"""zero_auto's trials of offload layouts in one CPU process: the host memory before the search and after it.

    python tests/helpers/trial_memory_run.py OUT.json

The module is an MLP of 33.6M parameters, so one offload trial holds ~540 MB of host memory (fp32 master
weights, gradients and Adam moments). Two trials are timed (ZeRO-3 with everything offloaded, then ZeRO-2 with the
optimizer offloaded); OUT.json holds the resident set size before and after the search, one trial's offloaded
state in bytes, and the trials' names.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import psutil
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_zero.auto.search import Candidate
from lightning_zero.auto.strategy import ZeroAutoStrategy
from lightning_zero.auto.trials import give_back_memory
from lightning_zero.memory.states import Layout
from tests.helpers.trainer import end_process_group, quiet_trainer

WIDTH, LAYERS = 2048, 8
#: Bytes a parameter's offloaded state takes on the host: fp32 master weight, gradient and two Adam moments.
OFFLOADED_BYTES_PER_PARAMETER = 16


class Wide(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
        self.batch_size = 4

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(16, WIDTH)), batch_size=self.batch_size)


def resident_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


class MeasuredSearch(ZeroAutoStrategy):
    """zero_auto with its candidates given, noting the resident set size around its search."""

    def __init__(self, given: list[Candidate]) -> None:
        super().__init__(zero={"memory_budget_gib": 8, "trial_steps": 1, "warmup_steps": 0})
        self.given = given
        self.resident: dict[str, int] = {}

    def _candidates(self, *args: Any) -> list[Candidate]:
        return self.given

    def search(self, trainer: Any, first_batch: Any) -> Candidate:
        give_back_memory(self.root_device)  # what start-up freed is not the trials' to give back
        self.resident["before"] = resident_bytes()
        chosen = super().search(trainer, first_batch)
        self.resident["after"] = resident_bytes()
        return chosen


def main() -> None:
    torch.set_num_threads(1)
    offloaded = Layout("deepspeed", 3, offload_optimizer=True, offload_parameters=True)
    given = [
        Candidate(offloaded, 4, 1, False, 2**20),
        Candidate(Layout("deepspeed", 2, offload_optimizer=True), 4, 1, False, 2**20),
    ]
    strategy = MeasuredSearch(given)
    module = Wide()
    parameters = sum(p.numel() for p in module.parameters())
    quiet_trainer(devices=1, strategy=strategy, max_steps=1).fit(module)
    result = {
        **strategy.resident,
        "trial_state_bytes": parameters * OFFLOADED_BYTES_PER_PARAMETER,
        "trials": [m.candidate.name for m in strategy.trials],
    }
    Path(sys.argv[1]).write_text(json.dumps(result))
    end_process_group()


if __name__ == "__main__":
    main()
