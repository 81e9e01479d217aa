"""Lightning Fabric, litgpt-style: fine-tune the quickstart's MiniLM on movie reviews with ZeRO-3 + CPU offload.

    python examples/fabric_finetune.py --max-steps 20

A plain training loop: ``fabric.setup``, ``fabric.backward``, ``optimizer.step``. ``import lightning_zero`` is all
it takes for ``Fabric(strategy="zero3_offload")`` to exist; the model is an ordinary Hugging Face module and the
optimizer a plain ``torch.optim.AdamW`` (the strategy runs it as DeepSpeed's CPU Adam under offload). The last step
saves a checkpoint that ``fabric.load``, the Trainer (``ckpt_path=``) and ``lightning-zero consolidate`` read. On a
machine with GPUs, pass ``--accelerator gpu``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from transformers import AutoModelForSequenceClassification

import lightning_zero  # noqa: F401  (registers "zero3_offload" and the other presets, for Fabric too)
from lightning_zero.app.data.movie_reviews import MovieReviewsDataModule
from lightning_zero.app.models.loading import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="zero3_offload")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--limit-train", type=int, default=512)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/fabric_finetune.ckpt"))
    args = parser.parse_args()

    fabric = L.Fabric(accelerator=args.accelerator, devices=args.devices, strategy=args.strategy)
    fabric.launch()
    fabric.seed_everything(42)

    data = MovieReviewsDataModule(limit_train=args.limit_train, limit_val=128, max_length=48, batch_size=16)
    data.prepare_data()
    data.setup("fit")
    loader = fabric.setup_dataloaders(data.train_dataloader())

    model = build_model(AutoModelForSequenceClassification, data.tokenizer_name, num_labels=len(data.label_names))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    model, optimizer = fabric.setup(model, optimizer)

    model.train()
    step = 0
    while step < args.max_steps:
        for batch in loader:
            loss = model(**batch).loss
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 5 == 0 or step == args.max_steps:
                fabric.print(f"step {step}: loss {fabric.all_reduce(loss.detach(), reduce_op='mean'):.4f}")
            if step == args.max_steps:
                break
    fabric.save(args.checkpoint, {"model": model, "optimizer": optimizer, "global_step": step})
    fabric.print(f"{args.strategy} finished {step} steps; checkpoint: {args.checkpoint}")


if __name__ == "__main__":
    main()
