"""Causal language modelling (GPT-2 and friends) with perplexity, for any ZeRO strategy.

The model is built in ``configure_model`` so that under ZeRO-3 DeepSpeed constructs it already partitioned.
Loss and perplexity come from one token-level reduction: summed negative log-likelihood (computed in fp32)
and a token count, summed over ranks by a torchmetrics state. ``exp(total nll / total tokens)`` is then the
same number under DDP and every ZeRO stage for the same predictions, whatever the batch split.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torchmetrics import Metric
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from lightning_zero.data.tokenizers import get_tokenizer, special_ids
from lightning_zero.models.loading import build_model
from lightning_zero.models.shapes import is_shape

IGNORE_INDEX = -100
_NO_DECAY = ("bias", "norm", "layernorm", "layer_norm", "ln_")


def token_nll(logits: Tensor, labels: Tensor, shift: bool) -> tuple[Tensor, Tensor]:
    """Summed token negative log-likelihood (fp32) and the number of scored tokens.

    Args:
        logits: ``[batch, length, vocab]``.
        labels: ``[batch, length]``, ``-100`` where nothing is scored.
        shift: ``True`` for causal LMs (position t predicts token t+1), ``False`` when labels are aligned.
    """
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_labels = labels.reshape(-1)
    nll = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return nll, (flat_labels != IGNORE_INDEX).sum()


class TokenPerplexity(Metric):
    """Mean token loss and perplexity over all ranks: float64 sums of nll and token counts."""

    full_state_update = False
    higher_is_better = False
    nll_sum: Tensor
    tokens: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("nll_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, nll_sum: Tensor, tokens: Tensor) -> None:
        """Add a batch's summed nll and token count (from :func:`token_nll`)."""
        # Out of place: states re-created under inference mode must not be updated in place outside it.
        self.nll_sum = self.nll_sum + nll_sum.detach().to(torch.float64)
        self.tokens = self.tokens + tokens.detach().to(torch.float64)

    def compute(self) -> dict[str, Tensor]:
        """``{"loss": mean token nll, "perplexity": exp(loss)}``."""
        loss = self.nll_sum / self.tokens.clamp(min=1.0)
        return {"loss": loss, "perplexity": torch.exp(loss)}


def fresh_fp32_metrics(module: nn.Module) -> None:
    """Reset every metric of ``module`` and undo a cast of its states below fp32.

    Resetting at the start of an epoch creates the states in the loop's own grad mode (inference tensors
    from a previous ``validate`` cannot be updated in place later). ``*-true`` precision converts metric
    states with ``module.to(dtype)``; sums of BLEU counts or token losses must not be fp16/bf16.
    """
    for metric in module.modules():
        if not isinstance(metric, Metric):
            continue
        metric.reset()
        states = [getattr(metric, name) for name in metric._defaults]
        if any(isinstance(s, Tensor) and s.is_floating_point() and s.element_size() < 4 for s in states):
            metric.set_dtype(torch.float32)


def adamw_with_warmup(
    module: nn.Module, learning_rate: float, weight_decay: float, warmup_ratio: float, total_steps: int
) -> OptimizerLRSchedulerConfig:
    """A plain ``torch.optim.AdamW`` (no decay on biases and norms) and a per-step linear warmup/decay."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (no_decay if any(key in name.lower() for key in _NO_DECAY) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=learning_rate, weight_decay=weight_decay)
    total = max(1, total_steps)
    warmup = math.ceil(total * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def total_training_steps(module: LightningModule) -> int:
    """The Trainer's estimate of optimizer steps, or 1 outside a fit."""
    try:
        steps = module.trainer.estimated_stepping_batches
    except RuntimeError:
        return 1
    return int(steps) if math.isfinite(steps) else 1


def build_language_model(
    auto_class: Any, source: str, tokenizer: PreTrainedTokenizerBase, **overrides: Any
) -> nn.Module:
    """Pretrained weights as they are, or a random shape sized to ``tokenizer`` with its special-token ids."""
    if not is_shape(source):
        return build_model(auto_class, source)
    ids = special_ids(tokenizer)
    ids_config = {"pad_token_id": ids.pad, "bos_token_id": ids.bos, "eos_token_id": ids.eos, **overrides}
    return build_model(auto_class, source, vocab_size=len(tokenizer), **ids_config)


class LanguageTask(LightningModule):
    """What the language tasks share: the tokenizer named in their hyper-parameters (loaded on first use), a
    token-mean training loss from ``_nll``, fp32 validation metrics and AdamW with linear warm-up."""

    model: nn.Module | None
    _tokenizer: PreTrainedTokenizerBase | None = None

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

    def on_validation_epoch_start(self) -> None:
        fresh_fp32_metrics(self)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        assert self.model is not None, "configure_model() has not run"
        hp = self.hparams
        return adamw_with_warmup(
            self.model, hp["learning_rate"], hp["weight_decay"], hp["warmup_ratio"], total_training_steps(self)
        )


class CausalLMTask(LanguageTask):
    """Causal LM training with token-level loss and perplexity.

    Args:
        model: ``shape:NAME`` (random init, e.g. ``shape:gpt2-xl``), a local folder or a hub name (``gpt2-xl``).
        tokenizer: ``bpe:CORPUS[:VOCAB]``, a local folder, a shipped model name or a hub name; the data module
            must use the same one. For shapes the vocabulary size is the tokenizer's length.
        tokenizer_cache_dir: Where a trained BPE is kept; ``~/.cache/lightning-zero/tokenizers`` if unset.
        learning_rate: Peak AdamW learning rate.
        weight_decay: AdamW weight decay (not on biases and norms).
        warmup_ratio: Share of the training steps spent warming the learning rate up linearly.
    """

    def __init__(
        self,
        model: str = "shape:tiny-gpt2",
        tokenizer: str = "bpe:chitchat",
        tokenizer_cache_dir: str | None = None,
        learning_rate: float = 5e-4,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model: nn.Module | None = None
        self.val_perplexity = TokenPerplexity()

    def configure_model(self) -> None:
        """Build the network once; under ZeRO-3 this runs inside ``deepspeed.zero.Init``."""
        if self.model is not None:
            return
        self.model = build_language_model(AutoModelForCausalLM, self.hparams["model"], self.tokenizer)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``[batch, length, vocab]``."""
        assert self.model is not None, "configure_model() has not run"
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def _nll(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        logits = self(batch["input_ids"], batch.get("attention_mask"))
        return token_nll(logits, batch["labels"], shift=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.update_perplexity(*self._nll(batch))

    def update_perplexity(self, nll_sum: Tensor, tokens: Tensor) -> None:
        """Feed one batch's summed nll and token count to the validation perplexity."""
        self.val_perplexity.update(nll_sum, tokens)

    def on_validation_epoch_end(self) -> None:
        values = self.val_perplexity.compute()  # summed over ranks: the same value on every rank
        # Already summed over ranks; sync_dist averages equal values (exact) and keeps Lightning quiet.
        self.log("val_loss", values["loss"].float(), prog_bar=True, sync_dist=True)
        self.log("val_ppl", values["perplexity"].float(), sync_dist=True)
        self.val_perplexity.reset()
