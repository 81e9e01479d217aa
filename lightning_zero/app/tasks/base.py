"""What every task shares: metric states kept as they were made, and one optimizer; and the language tasks' base.

:class:`TaskModule` keeps the torchmetrics states of its metric attributes out of dtype casts (``bf16-true`` and
``16-true`` run ``module.to(dtype)``; sums of BLEU counts or token losses must not become fp16/bf16), resets them
at the start of each validation epoch, and builds AdamW with linear warm-up from the task's hyper-parameters.
:class:`LanguageTask` adds the tokenizer named in the hyper-parameters and a token-mean training loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from transformers import PreTrainedTokenizerBase

from lightning_zero.app.data.tokenizers import get_tokenizer, special_ids
from lightning_zero.app.models.loading import build_model, import_model_class
from lightning_zero.app.models.shapes import is_shape
from lightning_zero.app.tasks.metrics import TokenPerplexity
from lightning_zero.app.tasks.optimization import adamw_with_linear_warmup, training_steps


class TaskModule(LightningModule):
    """Base of the tasks. Hyper-parameters it reads: ``learning_rate``, ``weight_decay``, ``warmup_ratio`` and
    (optionally) ``adam_eps``; the network is ``self.model``, built once by ``build_network`` in ``configure_model``."""

    model: nn.Module | None
    #: The transformers ``AutoModelFor...`` class the network is built with.
    auto_class: ClassVar[Any]

    def setup(self, stage: str) -> None:
        """Import the network's modeling module before ``configure_model`` (see
        :func:`~lightning_zero.app.models.loading.import_model_class`: under ZeRO-3 some would fail to import)."""
        import_model_class(self.auto_class, self.hparams["model"])

    def configure_model(self) -> None:
        """Build the network once; under ZeRO-3 this runs inside ``deepspeed.zero.Init``."""
        if self.model is None:
            self.model = self.build_network()

    def build_network(self) -> nn.Module:
        """The task's network, built from its hyper-parameters."""
        raise NotImplementedError

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> TaskModule:
        # Metric attributes sit out of the conversion and only follow the device: states keep their dtypes.
        metrics = {name: child for name, child in self.named_children() if isinstance(child, Metric | MetricCollection)}
        for name in metrics:
            self.register_module(name, None)  # skipped by nn.Module._apply; the attribute order stays
        try:
            super()._apply(fn, *args, **kwargs)
        finally:
            for name, child in metrics.items():
                self.register_module(name, child)
        for child in metrics.values():
            for metric in child.modules():
                if isinstance(metric, Metric):
                    metric.to(fn(torch.zeros(1, device=metric.device)).device)
        return self

    def on_validation_epoch_start(self) -> None:
        """Start from fresh metric states, made in this loop's grad mode (``validate`` runs in inference mode,
        validation inside ``fit`` does not, and inference tensors cannot be updated outside it)."""
        for metric in self.modules():
            if isinstance(metric, Metric):
                metric.reset()

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        """AdamW (no decay on biases/norms) with linear warm-up and decay, stepped every optimizer step."""
        if self.model is None:
            raise RuntimeError("configure_model() has not run")
        hp = self.hparams
        return adamw_with_linear_warmup(
            self.model,
            training_steps(self),
            learning_rate=hp["learning_rate"],
            weight_decay=hp["weight_decay"],
            warmup_ratio=hp["warmup_ratio"],
            eps=hp.get("adam_eps", 1e-8),
        )


def build_language_model(
    auto_class: Any, source: str, tokenizer: PreTrainedTokenizerBase, **overrides: Any
) -> nn.Module:
    """Pretrained weights as they are, or a random shape sized to ``tokenizer`` (unless ``overrides`` give a
    ``vocab_size``) with its special-token ids."""
    if not is_shape(source):
        return build_model(auto_class, source)
    ids = special_ids(tokenizer)
    ids_config = {"pad_token_id": ids.pad, "bos_token_id": ids.bos, "eos_token_id": ids.eos, **overrides}
    return build_model(auto_class, source, **{"vocab_size": len(tokenizer), **ids_config})


class LanguageTask(TaskModule):
    """What the language tasks share: the tokenizer named in their hyper-parameters (loaded on first use) and a
    token-mean training loss from ``_nll``, and validation loss and perplexity from ``val_perplexity``."""

    _tokenizer: PreTrainedTokenizerBase | None = None

    def __init__(self) -> None:
        super().__init__()
        self.model: nn.Module | None = None
        self.val_perplexity = TokenPerplexity()

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer named in the init args, loaded on first use."""
        if self._tokenizer is None:
            self._tokenizer = get_tokenizer(self.hparams["tokenizer"], self.hparams["tokenizer_cache_dir"])
        return self._tokenizer

    def _nll(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """Summed negative log-likelihood of a batch's target tokens, and how many there are."""
        raise NotImplementedError

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        nll, tokens = self._nll(batch)
        loss = nll / tokens.clamp(min=1)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["input_ids"].size(0))
        return loss

    def on_validation_epoch_end(self) -> None:
        values = self.val_perplexity.compute()  # summed over ranks: the same value on every rank
        # Already summed over ranks; sync_dist averages equal values (exact) and keeps Lightning quiet.
        self.log("val_loss", values["loss"].float(), prog_bar=True, sync_dist=True)
        self.log("val_ppl", values["perplexity"].float(), sync_dist=True)
        self.val_perplexity.reset()
