"""The throughput monitor measures FLOPs once, and logs samples/s, tokens/s, TFLOP/s, MFU and optimizer share."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_zero.callbacks.throughput import ZeroThroughputMonitor
from lightning_zero.runtime.batches import samples_in, tokens_in
from tests.helpers.trainer import quiet_trainer

BATCH, LENGTH, VOCAB, WIDTH = 4, 16, 50, 32


class TokenModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.head(self.embed(batch["input_ids"]))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["input_ids"].flatten())
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        ids = torch.randint(0, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(0))
        samples: list[dict[str, torch.Tensor]] = [{"input_ids": row} for row in ids]
        return DataLoader(samples, batch_size=BATCH)  # type: ignore[arg-type]


def fit(module: L.LightningModule, monitor: ZeroThroughputMonitor) -> L.Trainer:
    trainer = quiet_trainer(
        devices=1,
        max_steps=6,
        callbacks=[monitor],
        log_every_n_steps=1,
        enable_progress_bar=True,
    )
    trainer.fit(module)
    return trainer


def test_monitor_logs_throughput_flops_and_optimizer_share(one_thread: None) -> None:
    module = TokenModel()
    trainer = fit(module, ZeroThroughputMonitor(peak_tflops=0.001, window_size=4))
    assert module.flops_per_batch == 3 * 2 * BATCH * LENGTH * WIDTH * VOCAB  # forward of the head, x3
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    assert metrics["samples_per_sec"] > 0
    assert metrics["tokens_per_sec"] == pytest.approx(LENGTH * metrics["samples_per_sec"])
    seconds_per_step = BATCH / metrics["samples_per_sec"]
    assert metrics["tflops_per_device"] == pytest.approx(module.flops_per_batch / seconds_per_step / 1e12)
    assert metrics["mfu"] == pytest.approx(metrics["tflops_per_device"] / 0.001)
    assert 0 < metrics["optimizer_share"] < 1
    assert "samples_per_sec" in trainer.progress_bar_metrics
    assert "skipped_steps" not in metrics and "peak_allocated_gib" not in metrics  # no DeepSpeed engine, no CUDA


def test_module_flops_are_kept(one_thread: None) -> None:
    module = TokenModel()
    setattr(module, "flops_per_batch", 1e9)  # noqa: B010
    trainer = fit(module, ZeroThroughputMonitor(window_size=2, prog_bar=False))
    assert module.flops_per_batch == 1e9
    assert float(trainer.callback_metrics["tflops_per_device"]) > 0
    assert "samples_per_sec" not in trainer.progress_bar_metrics


def test_deepspeed_skipped_steps_are_reported() -> None:
    monitor = ZeroThroughputMonitor()
    monitor._steps.append((0.5, 0.25, 8, 128))
    engine = SimpleNamespace(skipped_steps=3)
    trainer = SimpleNamespace(
        world_size=2, strategy=SimpleNamespace(deepspeed_engine=engine, root_device=torch.device("cpu"))
    )
    metrics = monitor.step_metrics(trainer, nn.Module())  # type: ignore[arg-type]
    assert metrics == {"samples_per_sec": 32.0, "optimizer_share": 0.5, "tokens_per_sec": 512.0, "skipped_steps": 3.0}


def test_batch_counting() -> None:
    batch = {"labels": torch.zeros(3), "input_ids": torch.zeros(3, 7)}
    assert samples_in(batch) == 3 and tokens_in(batch) == 21
    assert samples_in((torch.zeros(5, 2),)) == 5 and tokens_in([torch.zeros(5, 2)]) == 10
