"""A tiny GPT-2 and fixed token data: small enough for 2-process CPU runs, real enough to catch sharding bugs."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 96
SEQ = 16


def tiny_gpt2_config() -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def token_data(samples: int = 128, seed: int = 1234) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randint(0, VOCAB, (samples, SEQ), generator=generator))


class TinyLM(L.LightningModule):
    """A causal LM whose per-step losses are recorded (mean over ranks) for parity checks.

    The model is built in ``__init__`` so that every strategy starts from the same weights.
    """

    def __init__(
        self, lr: float = 1e-2, weight_decay: float = 0.01, scheduler: bool = True, batch_size: int = 4
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(tiny_gpt2_config())
        self.losses: list[float] = []
        self.batch_fingerprints: list[int] = []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=input_ids).loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self(batch[0])
        self.batch_fingerprints.append(int(batch[0].sum()))
        self.losses.append(float(self.trainer.strategy.reduce(loss.detach().clone(), reduce_op="mean")))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"]
        )
        if not self.hparams["scheduler"]:
            return optimizer
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.5, total_iters=20)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(), batch_size=self.hparams["batch_size"], shuffle=False)
