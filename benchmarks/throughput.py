"""One GPU training measurement: a model shape under one strategy at one batch size, with a memory cap.

    python benchmarks/throughput.py --shape deberta-v2-xlarge --strategy zero2 --batch-size 32 \
        --memory-cap-gib 24 --out results.csv

Emulates the reports' 24 GB GPUs on larger ones with ``torch.cuda.set_per_process_memory_fraction``. Random
token ids at full sequence length (the worst case), random-initialised weights of the public config. Appends
one CSV row: strategy, batch, status (ok / OOM), samples/s over the timed steps, peak allocated GiB, and the
fp16 steps DeepSpeed skipped for overflow. ``benchmarks/run_gpu.sh`` runs the whole comparison.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero.models.loading import build_model
from lightning_zero.models.shapes import shape_config
from lightning_zero.strategies import ZeroStrategy

GIB = 1024**3


def task_kind(shape: str) -> str:
    if shape_config(shape).is_encoder_decoder:
        return "seq2seq"
    return "causal" if "gpt" in shape else "classification"


AUTO_CLASSES = {
    "seq2seq": AutoModelForSeq2SeqLM,
    "causal": AutoModelForCausalLM,
    "classification": AutoModelForSequenceClassification,
}


class ShapeModule(L.LightningModule):
    """A model of a named shape, built in ``configure_model`` (ZeRO-3 builds it partitioned)."""

    def __init__(self, shape: str, memory_cap_gib: float, lr: float = 1e-5) -> None:
        super().__init__()
        self.shape, self.memory_cap_gib, self.lr = shape, memory_cap_gib, lr
        self.kind = task_kind(shape)
        self.model: torch.nn.Module | None = None

    def setup(self, stage: str) -> None:
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, self.memory_cap_gib * GIB / total), device)

    def configure_model(self) -> None:
        if self.model is None:
            overrides = {"num_labels": 2} if self.kind == "classification" else {}
            self.model = build_model(AUTO_CLASSES[self.kind], f"shape:{self.shape}", **overrides)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        input_ids = batch[0]
        assert self.model is not None
        if self.kind == "seq2seq":
            return self.model(input_ids=input_ids, labels=input_ids[:, : input_ids.shape[1] // 2]).loss
        if self.kind == "classification":
            return self.model(input_ids=input_ids, labels=(input_ids[:, 0] % 2)).loss
        return self.model(input_ids=input_ids, labels=input_ids).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class StepTimer(L.Callback):
    """Wall time of the steps after ``warmup``, synchronised with the GPU."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.timed_steps = warmup, 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.warmup:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step > self.warmup:
            self.timed_steps = trainer.global_step - self.warmup

    def seconds(self) -> float:
        torch.cuda.synchronize()
        return time.perf_counter() - self.start


def make_strategy(name: str, zero_overrides: dict[str, Any]) -> Any:
    if not zero_overrides:
        return name
    from lightning_zero.strategies.presets import build_preset

    strategy = build_preset(name, **zero_overrides)
    assert isinstance(strategy, ZeroStrategy)
    return strategy


def measure(args: argparse.Namespace) -> dict[str, Any]:
    L.seed_everything(0)
    vocab = min(shape_config(args.shape).vocab_size, 30000)
    data = TensorDataset(torch.randint(0, vocab, (args.batch_size * 2 * (args.steps + 2), args.seq_len)))
    timer = StepTimer(args.warmup)
    trainer = L.Trainer(
        accelerator="gpu",
        devices=args.devices,
        strategy=make_strategy(args.strategy, json.loads(args.zero)),
        precision=args.precision,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    module = ShapeModule(args.shape, args.memory_cap_gib)
    row: dict[str, Any] = {"status": "ok", "samples_per_s": ""}
    try:
        trainer.fit(module, DataLoader(data, batch_size=args.batch_size))
        seconds = timer.seconds()
        samples = timer.timed_steps * args.batch_size * trainer.world_size
        row["samples_per_s"] = round(samples / seconds, 1)
    except torch.OutOfMemoryError:
        row["status"] = "OOM"
    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    engine = getattr(trainer.strategy, "deepspeed_engine", None)
    row["skipped_steps"] = getattr(engine, "skipped_steps", "")
    row["rank"] = trainer.global_rank
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="deberta-v2-xlarge")
    parser.add_argument("--strategy", default="zero2")
    parser.add_argument("--zero", default="{}", help='JSON overrides of the preset, e.g. {"reduce_bucket_size": 5e7}')
    parser.add_argument("--label", default="")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", default="16-mixed")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--memory-cap-gib", type=float, default=24.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    row = measure(args)
    if row["rank"] == 0:
        record = {
            "shape": args.shape,
            "strategy": args.label or args.strategy,
            "batch_per_gpu": args.batch_size,
            "devices": args.devices,
            "precision": args.precision,
            "seq_len": args.seq_len,
            "memory_cap_gib": args.memory_cap_gib,
            **{k: v for k, v in row.items() if k != "rank"},
        }
        new = not args.out.exists()
        with args.out.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(record))
            if new:
                writer.writeheader()
            writer.writerow(record)
        print("RESULT", json.dumps(record), flush=True)
    os._exit(0)  # an OOM on one rank can leave collectives pending; the row is written


if __name__ == "__main__":
    main()
