"""Fine-tune a tiny classifier on the shipped movie reviews as the quickstart does (DeepSpeed ZeRO-2, the MiniLM
tokenizer taken from the data module), save a checkpoint, and write the trained module's own predictions.

    python tests/helpers/export_run.py OUT_DIR SENTENCES_JSON

One process (DeepSpeed keeps its process group up until exit). Writes OUT_DIR/last.ckpt and
OUT_DIR/predictions.json: for each sentence, ``{class name: probability}`` from the module's forward on that
sentence alone, tokenised by the data module's tokenizer and named by its ``label_names``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero.app.data.movie_reviews import MovieReviewsDataModule
from lightning_zero.app.models.loading import load_tokenizer
from lightning_zero.app.tasks.classification import SequenceClassificationTask
from tests.helpers.trainer import end_process_group, quiet_trainer

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
STEPS = 40


def main(out: Path, sentences: list[str]) -> None:
    L.seed_everything(0, verbose=False)
    data = MovieReviewsDataModule(tokenizer=MINILM, limit_train=320, limit_val=16, max_length=48, batch_size=16)
    task = SequenceClassificationTask(model="shape:tiny-deberta-v2", learning_rate=2e-3, warmup_ratio=0.0)
    trainer = quiet_trainer(devices=1, strategy="zero2", max_steps=STEPS, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(task, data)
    trainer.save_checkpoint(out / "last.ckpt")
    assert data.label_names is not None
    tokenizer = load_tokenizer(MINILM)
    task.eval()
    predictions = []
    with torch.no_grad():
        for sentence in sentences:
            probabilities = task(**tokenizer(sentence, return_tensors="pt")).logits.softmax(-1)[0]
            predictions.append(dict(zip(data.label_names, probabilities.tolist(), strict=True)))
    (out / "predictions.json").write_text(json.dumps(predictions))
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
