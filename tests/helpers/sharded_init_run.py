"""Build a Hugging Face model in ``configure_model`` under a strategy; report how it was created.

    python tests/helpers/sharded_init_run.py OUT.json zero3

Rank 0 writes whether the parameters were already partitioned when ``configure_model`` returned, and the
standard deviation of a linear weight after one step (Hugging Face initialises it with N(0, 0.02); torch's
default would give about 0.1 for this width).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, BertConfig

import lightning_zero  # noqa: F401  (registers the presets)
from tests.helpers.tiny import token_data
from tests.helpers.trainer import end_process_group, quiet_trainer

WEIGHT = "model.bert.encoder.layer.0.attention.self.query.weight"


class LateBert(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model: torch.nn.Module | None = None
        self.partitioned_at_construction = False

    def configure_model(self) -> None:
        if self.model is None:
            config = BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
            self.model = AutoModelForSequenceClassification.from_config(config)
            self.partitioned_at_construction = all(hasattr(p, "ds_id") for p in self.model.parameters())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.model is not None
        return self.model(input_ids=batch[0], labels=batch[0][:, 0] % 2).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(32), batch_size=4)


def main() -> None:
    out, strategy = Path(sys.argv[1]), sys.argv[2]
    L.seed_everything(0)
    trainer = quiet_trainer(
        devices=2,
        strategy=strategy,
        max_steps=1,
    )
    module = LateBert()
    trainer.fit(module)
    gather = getattr(trainer.strategy, "full_state_dict", None)
    state = gather() if gather is not None else module.state_dict()
    if trainer.is_global_zero:
        result = {"partitioned": module.partitioned_at_construction, "std": float(state[WEIGHT].float().std())}
        out.write_text(json.dumps(result))
    trainer.strategy.barrier()  # no rank exits while another still uses the process group
    end_process_group()


if __name__ == "__main__":
    main()
