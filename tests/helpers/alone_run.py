"""A preset trains a plain ``nn.Module`` where the ``app`` extra is not installed, in one 2-process CPU launch.

    python tests/helpers/alone_run.py OUT_DIR STRATEGY...

Before anything else is imported, the optional packages are made to look not installed
(:mod:`tests.helpers.without_app`). Rank r writes OUT_DIR/STRATEGY-rank{r}.json: its losses, whether the hidden
packages really are unimportable, and the hidden modules that were imported anyway.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.without_app import HIDDEN, hide_optional_packages, is_hidden

hide_optional_packages()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning_zero  # noqa: E402, F401  (registers the presets)
from tests.helpers.trainer import end_process_group, quiet_trainer  # noqa: E402

STEPS = 6


class Regression(L.LightningModule):
    """A small MLP fitted to the same four samples at every step, so that its loss falls; records each step's."""

    def __init__(self) -> None:
        super().__init__()
        self.net: nn.Module | None = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        # Built here, as ZeRO-3 users do: the strategy's sharded-construction context runs around it.
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = (tensor.squeeze(0) for tensor in batch)
        assert self.net is not None
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(4, 8, generator=generator).expand(16, 4, 8)  # each item is the same four samples
        return DataLoader(TensorDataset(x, x.sum(dim=2)), batch_size=1)


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("strategies", nargs="+")
    args = parser.parse_args()
    for strategy in args.strategies:
        module = Regression()
        trainer = quiet_trainer(strategy=strategy, devices=2, max_steps=STEPS)
        trainer.fit(module)
        result = {
            "losses": module.losses,
            "importable": sorted(name for name in HIDDEN if importable(name)),
            "imported": sorted(name for name in sys.modules if is_hidden(name)),
        }
        (args.out / f"{strategy}-rank{trainer.global_rank}.json").write_text(json.dumps(result))
    end_process_group()


if __name__ == "__main__":
    main()
