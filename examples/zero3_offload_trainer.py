"""Plain Python, no CLI: fine-tune the shipped MiniLM on movie reviews with ZeRO-3 + CPU offload.

    python examples/zero3_offload_trainer.py --max-steps 20

The model code is an ordinary LightningModule whose ``configure_optimizers`` returns ``torch.optim.AdamW``;
``import lightning_zero`` is all it takes for ``Trainer(strategy="zero3_offload")`` to exist. On a machine
with GPUs, pass ``--accelerator gpu``.
"""

from __future__ import annotations

import argparse

import lightning as L

import lightning_zero  # noqa: F401  (registers "zero3_offload" and the other presets)
from lightning_zero.app.data.movie_reviews import MovieReviewsDataModule
from lightning_zero.app.tasks.classification import SequenceClassificationTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--limit-train", type=int, default=512)
    args = parser.parse_args()

    L.seed_everything(42)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="zero3_offload",
        max_steps=args.max_steps,
        limit_val_batches=4,
        val_check_interval=args.max_steps,
        logger=False,
        enable_checkpointing=False,
    )
    data = MovieReviewsDataModule(limit_train=args.limit_train, limit_val=128, max_length=48, batch_size=16)
    trainer.fit(SequenceClassificationTask(learning_rate=1e-4), datamodule=data)
    if trainer.is_global_zero:
        metrics = {name: round(float(value), 4) for name, value in trainer.callback_metrics.items()}
        print(f"zero3_offload finished: {metrics}")


if __name__ == "__main__":
    main()
